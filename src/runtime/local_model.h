// Opening a model for one process: file, config, tokenizer, backend and a pipeline with every
// layer in one slice. Used by `shoal run/check/bench`, the server and the pool's host.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "format/model_file.h"
#include "model/arch.h"
#include "runtime/pipeline.h"
#include "tokenizer/tokenizer.h"

namespace shoal {

struct LocalModelOptions {
  std::string device = "cpu";    // cpu, cpu-ref, cuda:N
  int threads = 0;               // CPU threads (0: all)
  int n_ctx = 0;                 // 0: the model's training context, at most 4096
  DType kv_dtype = DType::kF32;  // KV cache type
  int max_tokens = 512;          // prefill chunk (tokens per step)
  bool half_prefill = false;     // BackendOptions::half_prefill (CUDA)
  bool warm_up = true;           // SliceOptions::warm_up
  bool tokenizer = true;         // load the tokenizer too
  bool progress = true;          // progress bar while loading
};

/// A model opened for local use. Holds the file (weights are read from it while loading; the
/// WeightMap points into its index), so it is kept behind a pointer.
struct LocalModel {
  std::unique_ptr<ModelFile> file;
  ModelConfig config;
  const ArchInfo* arch = nullptr;
  WeightMap weights;
  std::unique_ptr<Tokenizer> tokenizer;  // null when not asked for
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LocalPipeline> pipeline;
};

/// Opens just the file, its config and its tensor map (no weights loaded).
Result<LocalModel> open_model(const std::string& path, bool with_tokenizer);

/// Opens the model and loads every layer onto opts.device. Errors from each stage, with context.
Result<LocalModel> load_local_model(const std::string& path, const LocalModelOptions& opts);

/// Parses a KV cache type name: f32, f16, q8_0 (or q8). Errors: kInvalidArgument.
Result<DType> parse_kv_dtype(const std::string& name);

/// The context length a process uses, in tokens: `requested` when > 0; otherwise the model's
/// training context (n_ctx_train, 0 when unknown), at most 4096, so that a long-context model's
/// KV cache does not take its full size unasked (the cap is logged with the -c that lifts it).
/// Warns when `requested` is longer than the training context.
int context_length(int requested, int n_ctx_train);

/// The longest context -c takes, in tokens (2^24).
constexpr int kMaxContext = 1 << 24;

}  // namespace shoal
