// Random-weight GGUF files with the exact tensor shapes of a real model, written by the project's
// own GGUF writer: decode and prefill speed depend on shapes and dtypes, not on the values
// (bench/synthetic_gguf, `shoal bench` in scripts/gpu-check.sh; GPU tests that need real shapes).
#pragma once

#include <string>

#include "core/status.h"
#include "tensor/dtype.h"

namespace shoal {

/// A decoder-only transformer's shape (GGUF metadata keys of `arch`: llama, qwen3).
struct SyntheticShape {
  std::string arch;
  int n_layers, d_model, d_ff, n_heads, n_kv_heads, head_dim, vocab, n_ctx;
  float rope_theta, eps;
  bool tied, qk_norm;  // LM head tied to the embedding; per-head q / k RMSNorm (Qwen3)
};

/// Qwen3-0.6B and Llama-3-8B (their Hugging Face configs).
extern const SyntheticShape kQwen3_0_6B, kLlama3_8B;

/// Writes a GGUF of shape s at `path`: matrices of dtype dt (F32, F16, BF16, Q8_0, Q4_0) uniform in
/// +-sqrt(3 / fan-in) (the variance of fan-in scaling), norm weights F32 near 1, reproducible
/// (hashed) values, streamed tensor by tensor (the file is never held in memory). Errors:
/// GgufWriter::write's (kIoError, kInvalidArgument).
Status write_synthetic_gguf(const SyntheticShape& s, DType dt, const std::string& path);

}  // namespace shoal
