// Hugging Face checkpoints: a folder with config.json and either model.safetensors or
// model.safetensors.index.json plus the shards it names; also a lone .safetensors file.
// Tensor names stay as stored (e.g. "model.layers.0.self_attn.q_proj.weight", or
// "model.language_model.layers.0..." in Qwen3.5); src/model/ maps them.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "format/model_file.h"
#include "format/weight_source.h"

namespace shoal {

/// Opens a checkpoint folder. config.json must be a JSON object (-> ModelFile::hf_config). With
/// model.safetensors.index.json, every shard its weight_map names (plain file names inside the
/// folder) becomes one source, and the weight_map must agree exactly with the shards' headers.
/// Errors: kNotFound (config.json, weights or a shard missing), kCorrupt (bad JSON, a disagreeing
/// index, a tensor in two shards, any safetensors error), kUnsupported (dtype), kIoError.
Result<ModelFile> open_hf_checkpoint(const std::string& dir);

/// Wraps one .safetensors file as a ModelFile (format kHuggingFace, one source); hf_config is the
/// config.json beside it when there is one, else null. Errors as parse_safetensors.
Result<ModelFile> open_safetensors_model(std::unique_ptr<MmapSource> src, const std::string& path);

}  // namespace shoal
