// RoPE frequency tables (RoFormer, arXiv:2104.09864), with the scalings Llama-family checkpoints
// use. Computed once on the host; backends only multiply position by these.
#pragma once

#include <vector>

#include "model/model_config.h"

namespace shoal {

/// inv_freq[i] = theta^(-2i / rot_dims) for i < rot_dims / 2, then scaled:
/// linear (divide by factor), llama3 (HF transformers `_compute_llama3_parameters`: low
/// frequencies divided by factor, a smooth blend in between), and GGUF's per-pair divisors
/// (`rope_freqs.weight`, how llama.cpp stores llama3 scaling) when `freq_factors` is given.
/// `local` picks RopeConfig::theta_local (Gemma 3 sliding-window layers) when it is set.
std::vector<float> rope_inv_freq(const RopeConfig& rope, bool local, const float* freq_factors);

}  // namespace shoal
