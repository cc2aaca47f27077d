// A model on disk, opened: its metadata, its tensor index and the sources holding the bytes.
// One type for both GGUF files and Hugging Face checkpoint folders; architecture code
// (src/model/) turns it into a ModelConfig.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "format/metadata.h"
#include "format/tensor_index.h"
#include "format/weight_source.h"

namespace shoal {

enum class ModelFormat { kGguf, kHuggingFace };

struct ModelFile {
  ModelFormat format = ModelFormat::kGguf;
  std::string path;          // the .gguf file or the checkpoint folder
  uint64_t file_size = 0;    // total bytes over all sources
  Metadata metadata;         // GGUF key/values (empty for HF)
  nlohmann::json hf_config;  // config.json (HF only; null for GGUF)
  TensorIndex index;
  std::vector<std::unique_ptr<WeightSource>> sources;  // TensorInfo::source indexes this

  /// Total bytes read from all sources so far.
  uint64_t bytes_read() const;
};

/// The model's identity as the pool compares it between host and workers: a 64-bit FNV-1a over the
/// tensor index (TensorIndex::identity_hash) and, for each tensor, 32 bytes at its start, middle and
/// end -- so two files with the same shapes but other weights (another fine-tune) differ, while a
/// whole-file hash of many GiB is avoided. Reads 96 bytes per tensor (counted in bytes_read()).
/// Errors: kIoError / kOutOfRange from a source.
Result<uint64_t> model_identity(const ModelFile& m);

/// Opens a .gguf file, or a folder with config.json and model.safetensors or
/// model.safetensors.index.json (+ shards). Every offset, size and shape is validated here:
/// afterwards each TensorInfo's byte range lies inside its source and matches dtype x shape.
/// Errors: kNotFound, kCorrupt (naming the file and the field), kUnsupported, kIoError.
Result<ModelFile> open_model_file(const std::string& path);

}  // namespace shoal
