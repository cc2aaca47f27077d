// What the forward pass needs to know about a model, as feature flags and per-layer arrays.
// Architecture files (one per family, src/model/<arch>.cc) fill it from GGUF keys or config.json;
// the forward pass reads features, never architecture names. (Style: zeux/calm src/model.h.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace shoal {

enum class NormKind { kRms, kLayer };
enum class LayerKind { kAttention, kGatedDeltaNet };
enum class FfnKind { kDense, kMoE };

/// How RoPE frequencies are derived (the inv_freq table is computed once, on the host).
enum class RopeScaling { kNone, kLinear, kLlama3, kYarn };

struct RopeConfig {
  float theta = 10000.0f;    // base
  int rot_dims = 0;          // rotated dims per head (== head_dim unless partial)
  bool interleaved = false;  // GGUF `llama`-family files: pairs (2i, 2i+1); HF: rotate_half
  RopeScaling scaling = RopeScaling::kNone;
  float factor = 1.0f;                 // linear / llama3 / yarn factor
  float low_freq_factor = 1.0f;        // llama3
  float high_freq_factor = 4.0f;       // llama3
  int original_context = 8192;         // llama3 / yarn: original_max_position_embeddings
  float attn_factor = 1.0f;            // yarn magnitude (1 otherwise)
  float theta_local = 0.0f;            // sliding-window layers' base when it differs (Gemma 3)
  // Precision of the frequency table. Hugging Face transformers keeps its rotary `inv_freq`
  // buffer in the dtype the checkpoint is loaded in, so a bf16 checkpoint rotates with
  // bf16-rounded frequencies; Shoal reproduces that for bf16/f16 checkpoints (HF config `dtype`,
  // GGUF general.file_type) so its logits match the reference implementation. F32 otherwise.
  DType freq_dtype = DType::kF32;
};

/// One transformer block. Arrays allow per-layer head counts, windows and kinds.
struct LayerConfig {
  LayerKind kind = LayerKind::kAttention;
  FfnKind ffn = FfnKind::kDense;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int d_ff = 0;             // dense FFN width (or the shared expert's)
  int sliding_window = 0;   // 0: full attention
  bool use_local_rope = false;  // rope with RopeConfig::theta_local (Gemma 3 sliding layers)
  // MoE (ffn == kMoE)
  int n_experts = 0;
  int n_experts_used = 0;
  int d_expert = 0;         // each expert's FFN width
  bool has_shared_expert = false;
  // Gated DeltaNet (kind == kGatedDeltaNet)
  int gdn_n_heads_k = 0, gdn_n_heads_v = 0, gdn_head_dim_k = 0, gdn_head_dim_v = 0;
  int gdn_conv_kernel = 0;
};

struct ModelConfig {
  std::string arch;          // "llama", "qwen3", ... (for messages only)
  std::string name;          // general.name or the folder name
  int n_layers = 0;
  int d_model = 0;
  int vocab_size = 0;
  int n_ctx_train = 0;       // context length the model was trained for
  float norm_eps = 1e-5f;

  NormKind norm = NormKind::kRms;
  Activation act = Activation::kSilu;
  bool gated_ffn = true;         // GLU FFN (gate, up, down); false: up -> act -> down
  bool tied_embeddings = false;  // LM head reuses token_embd.weight
  bool qk_norm = false;          // per-head RMSNorm of q and k (Qwen3, Gemma 3)
  bool attn_bias = false;        // q/k/v biases (Qwen2)
  bool attn_out_bias = false;    // output projection bias (GPT-2, Phi)
  bool ffn_bias = false;         // FFN biases (GPT-2, Phi)
  bool parallel_block = false;   // attention and FFN from one norm, summed (Phi-1.5/2)
  bool post_norms = false;       // extra norms after attention and FFN (Gemma 2/3)
  bool learned_pos_embd = false; // absolute position embedding table (GPT-2)
  float embed_scale = 1.0f;      // multiply embeddings (Gemma: sqrt(d_model))
  float attn_scale = 0.0f;       // 0: 1/sqrt(head_dim); else this (Gemma 3: query_pre_attn_scalar^-0.5)
  float attn_logit_softcap = 0.0f;
  RopeConfig rope;
  std::vector<LayerConfig> layers;  // n_layers entries

  // Token ids the runtime needs (from the tokenizer metadata or config.json); -1: none.
  int32_t bos_id = -1;
  int32_t eos_id = -1;
};

}  // namespace shoal
