// The Llama family: Llama 2/3 (incl. llama3 RoPE scaling), SmolLM2 (tied embeddings), Mistral,
// Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm, explicit head_dim).
// HF reference: transformers models/llama/modeling_llama.py, qwen2, qwen3.
// GGUF keys: llama.cpp src/llama-model.cpp (LLM_ARCH_LLAMA, QWEN2, QWEN3).
#include <cstdint>

#include "core/log.h"
#include "model/families.h"

namespace shoal {

namespace {

using namespace arch_util;

struct FamilyTraits {
  bool qk_norm;
  bool attn_bias;
};

FamilyTraits traits_for(std::string_view arch) {
  if (arch == "qwen3") return {true, false};
  if (arch == "qwen2") return {false, true};
  return {false, false};
}

void fill_layers(ModelConfig& cfg, const std::vector<int>& heads, const std::vector<int>& kv_heads,
                 int head_dim, int d_ff) {
  cfg.layers.resize(size_t(cfg.n_layers));
  for (int l = 0; l < cfg.n_layers; ++l) {
    LayerConfig& L = cfg.layers[size_t(l)];
    L.n_heads = heads[size_t(l)];
    L.n_kv_heads = kv_heads[size_t(l)];
    L.head_dim = head_dim;
    L.d_ff = d_ff;
  }
}

Status check_heads(const ModelConfig& cfg) {
  for (const auto& L : cfg.layers) {
    if (L.n_heads <= 0 || L.n_kv_heads <= 0 || L.n_heads % L.n_kv_heads != 0)
      return make_error(Code::kCorrupt, "{} heads with {} KV heads: heads must be a multiple of KV heads",
                        L.n_heads, L.n_kv_heads);
    if (L.head_dim <= 0 || L.head_dim % 2 != 0 || L.head_dim > 1024)
      return make_error(Code::kCorrupt, "head_dim {} is not an even number in [2, 1024]", L.head_dim);
  }
  if (cfg.rope.rot_dims <= 0 || cfg.rope.rot_dims % 2 != 0 || cfg.rope.rot_dims > cfg.layers[0].head_dim)
    return make_error(Code::kCorrupt, "rope dimension count {} is not even and <= head_dim", cfg.rope.rot_dims);
  if (!(cfg.norm_eps > 0.0f && cfg.norm_eps < 1.0f))  // also refuses NaN
    return make_error(Code::kCorrupt, "norm epsilon {} is not in (0, 1)", cfg.norm_eps);
  if (cfg.n_ctx_train < 0)
    return make_error(Code::kCorrupt, "training context length {} is negative", cfg.n_ctx_train);
  return Status::Ok();
}

// transformers' sliding-window attention: every layer of a Mistral (`sliding_window`, null for
// full attention); for Qwen2 / Qwen3 with `use_sliding_window`, the layers named
// "sliding_attention" in `layer_types`, else those from `max_window_layers` on (modeling_qwen2.py).
Status hf_sliding_window(const nlohmann::json& j, ModelConfig& cfg) {
  const bool mistral = j.value("model_type", "") == "mistral";
  if (cfg.arch == "llama" && !mistral) return Status::Ok();  // (Llama's attention has no window)
  // Absent, the configuration classes' default (4096); null: full attention.
  if (auto it = j.find("sliding_window"); it != j.end() && it->is_null()) return Status::Ok();
  SHOAL_ASSIGN_OR_RETURN(const int64_t window, hf_int_or(j, "sliding_window", 4096, 0, INT32_MAX));
  if (window == 0) return Status::Ok();
  std::vector<bool> sliding(size_t(cfg.n_layers), true);
  if (!mistral) {  // Qwen2 / Qwen3
    SHOAL_ASSIGN_OR_RETURN(const bool use, hf_bool_or(j, "use_sliding_window", false));
    if (!use) return Status::Ok();
    SHOAL_ASSIGN_OR_RETURN(const int64_t from, hf_int_or(j, "max_window_layers", 28, 0, INT32_MAX));  // (Qwen2Config's)
    for (int l = 0; l < cfg.n_layers; ++l) sliding[size_t(l)] = l >= from;
    if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
      if (!it->is_array() || int(it->size()) != cfg.n_layers)
        return make_error(Code::kCorrupt, "config.json: 'layer_types' is not a list of {} strings", cfg.n_layers);
      for (int l = 0; l < cfg.n_layers; ++l) {
        const auto& t = (*it)[size_t(l)];
        if (!t.is_string() || (t != "sliding_attention" && t != "full_attention"))
          return make_error(Code::kCorrupt, "config.json: layer_types[{}] = {} is not \"sliding_attention\" or "
                            "\"full_attention\"", l, t.dump());
        sliding[size_t(l)] = t == "sliding_attention";
      }
    }
  }
  for (int l = 0; l < cfg.n_layers; ++l)
    if (sliding[size_t(l)]) cfg.layers[size_t(l)].sliding_window = int(window);
  return Status::Ok();
}

Status from_gguf(const ModelFile& f, ModelConfig& cfg) {
  constexpr int64_t kMaxDim = 1 << 20;
  const auto tr = traits_for(cfg.arch);
  SHOAL_ASSIGN_OR_RETURN(int64_t n_layers, gguf_int(f, "block_count", 1, 4096));
  SHOAL_ASSIGN_OR_RETURN(int64_t d_model, gguf_int(f, "embedding_length", 1, kMaxDim));
  SHOAL_ASSIGN_OR_RETURN(int64_t d_ff, gguf_int(f, "feed_forward_length", 1, kMaxDim));
  cfg.n_layers = int(n_layers);
  cfg.d_model = int(d_model);
  SHOAL_ASSIGN_OR_RETURN(auto heads, gguf_per_layer(f, "attention.head_count", cfg.n_layers, 1, 4096));
  std::vector<int> kv_heads = heads;
  if (f.metadata.find(f.metadata.get_string("general.architecture").value_or("") + ".attention.head_count_kv")) {
    SHOAL_ASSIGN_OR_RETURN(kv_heads, gguf_per_layer(f, "attention.head_count_kv", cfg.n_layers, 1, 4096));
  }
  SHOAL_ASSIGN_OR_RETURN(const int64_t key_length, gguf_int_or(f, "attention.key_length", d_model / heads[0], 1, 1024));
  const int head_dim = int(key_length);
  fill_layers(cfg, heads, kv_heads, head_dim, int(d_ff));
  SHOAL_ASSIGN_OR_RETURN(const int64_t n_ctx_train, gguf_int_or(f, "context_length", 4096, 0, INT32_MAX));
  cfg.n_ctx_train = int(n_ctx_train);
  SHOAL_ASSIGN_OR_RETURN(const double eps, gguf_float_or(f, "attention.layer_norm_rms_epsilon", 1e-5));
  SHOAL_ASSIGN_OR_RETURN(const double theta, gguf_float_or(f, "rope.freq_base", 10000.0));
  cfg.norm_eps = float(eps);
  cfg.rope.theta = float(theta);
  SHOAL_ASSIGN_OR_RETURN(const int64_t rot_dims, gguf_int_or(f, "rope.dimension_count", head_dim, 0, 1024));
  cfg.rope.rot_dims = int(rot_dims);
  SHOAL_RETURN_IF_ERROR(gguf_rope_scaling(f, cfg.rope));
  cfg.qk_norm = tr.qk_norm;
  cfg.attn_bias = f.index.find("blk.0.attn_q.bias") != nullptr;
  // llama.cpp takes biases on the gated FFN's gate and up too; Shoal's FFN has none there.
  for (int l = 0; l < cfg.n_layers; ++l) {
    for (const char* b : {"ffn_gate.bias", "ffn_up.bias"}) {
      const std::string name = layer_tensor(l, b);
      if (f.index.find(name))
        return make_error(Code::kUnsupported, "tensor '{}': biases on the FFN's gate / up are not supported", name);
    }
  }
  cfg.tied_embeddings = f.index.find("output.weight") == nullptr;
  const TensorInfo* embd = f.index.find("token_embd.weight");
  if (!embd) return make_error(Code::kNotFound, "tensor 'token_embd.weight' is missing");
  cfg.vocab_size = int(gguf_int_opt(f, "vocab_size").value_or(embd->shape.empty() ? 0 : embd->shape[0]));
  if (auto b = f.metadata.get_int("tokenizer.ggml.bos_token_id")) cfg.bos_id = int32_t(*b);
  if (auto e = f.metadata.get_int("tokenizer.ggml.eos_token_id")) cfg.eos_id = int32_t(*e);
  return check_heads(cfg);
}

Status from_hf(const ModelFile& f, ModelConfig& cfg) {
  constexpr int64_t kMaxDim = 1 << 20;
  const auto& j = f.hf_config;
  const auto tr = traits_for(cfg.arch);
  SHOAL_ASSIGN_OR_RETURN(int64_t n_layers, hf_int(j, "num_hidden_layers", 1, 4096));
  SHOAL_ASSIGN_OR_RETURN(int64_t d_model, hf_int(j, "hidden_size", 1, kMaxDim));
  SHOAL_ASSIGN_OR_RETURN(int64_t d_ff, hf_int(j, "intermediate_size", 1, kMaxDim));
  SHOAL_ASSIGN_OR_RETURN(int64_t heads, hf_int(j, "num_attention_heads", 1, 4096));
  SHOAL_ASSIGN_OR_RETURN(int64_t vocab, hf_int(j, "vocab_size", 1, 1 << 24));
  cfg.n_layers = int(n_layers);
  cfg.d_model = int(d_model);
  cfg.vocab_size = int(vocab);
  SHOAL_ASSIGN_OR_RETURN(const int64_t kv64, hf_int_or(j, "num_key_value_heads", heads, 1, 4096));
  SHOAL_ASSIGN_OR_RETURN(const int64_t head_dim64, hf_int_or(j, "head_dim", d_model / heads, 1, 1024));
  const int kv = int(kv64);
  const int head_dim = int(head_dim64);
  fill_layers(cfg, std::vector<int>(size_t(n_layers), int(heads)), std::vector<int>(size_t(n_layers), kv), head_dim,
              int(d_ff));
  SHOAL_ASSIGN_OR_RETURN(const int64_t n_ctx_train, hf_int_or(j, "max_position_embeddings", 4096, 0, INT32_MAX));
  cfg.n_ctx_train = int(n_ctx_train);
  SHOAL_ASSIGN_OR_RETURN(const double eps, hf_float_or(j, "rms_norm_eps", 1e-6));
  cfg.norm_eps = float(eps);
  SHOAL_RETURN_IF_ERROR(hf_rope(j, cfg.rope));
  cfg.rope.rot_dims = head_dim;
  cfg.rope.interleaved = false;  // HF checkpoints use rotate_half
  SHOAL_ASSIGN_OR_RETURN(const std::string act, hf_string_or(j, "hidden_act", "silu"));
  SHOAL_ASSIGN_OR_RETURN(cfg.act, hf_activation(act));
  SHOAL_RETURN_IF_ERROR(hf_sliding_window(j, cfg));
  cfg.qk_norm = tr.qk_norm;
  // attention_bias: biases on q, k, v and o (Llama, Mistral); Qwen2's q / k / v biases need no flag.
  SHOAL_ASSIGN_OR_RETURN(cfg.attn_bias, hf_bool_or(j, "attention_bias", tr.attn_bias));
  SHOAL_ASSIGN_OR_RETURN(const bool mlp_bias, hf_bool_or(j, "mlp_bias", false));
  if (mlp_bias) return make_error(Code::kUnsupported, "config.json: mlp_bias (biases on the FFN) is not supported");
  SHOAL_ASSIGN_OR_RETURN(const bool tied, hf_bool_or(j, "tie_word_embeddings", false));
  // A checkpoint without lm_head.weight ties whatever the flag says (said when the flag says
  // otherwise: transformers would start such a head from random weights).
  const bool has_head = f.index.find("lm_head.weight") != nullptr;
  if (!tied && !has_head && j.contains("tie_word_embeddings")) {
    spdlog::warn("{}: no lm_head.weight although tie_word_embeddings is false; the embedding serves as the LM head",
                 f.path);
  }
  cfg.tied_embeddings = tied || !has_head;
  if (auto b = hf_int_opt(j, "bos_token_id")) cfg.bos_id = int32_t(*b);
  if (auto e = hf_int_opt(j, "eos_token_id")) cfg.eos_id = int32_t(*e);
  return check_heads(cfg);
}

const std::vector<NameRule> kLayerNames = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

const std::vector<NameRule> kGlobalNames = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

}  // namespace

std::vector<ArchInfo> llama_family() {
  return {
      {"llama", {"llama", "mistral"}, true, from_gguf, from_hf, kLayerNames, kGlobalNames},
      {"qwen2", {"qwen2"}, false, from_gguf, from_hf, kLayerNames, kGlobalNames},
      {"qwen3", {"qwen3"}, false, from_gguf, from_hf, kLayerNames, kGlobalNames},
  };
}

}  // namespace shoal
