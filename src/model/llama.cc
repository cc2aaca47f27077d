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
  cfg.norm_eps = float(gguf_float_opt(f, "attention.layer_norm_rms_epsilon").value_or(1e-5));
  cfg.rope.theta = float(gguf_float_opt(f, "rope.freq_base").value_or(10000.0));
  SHOAL_ASSIGN_OR_RETURN(const int64_t rot_dims, gguf_int_or(f, "rope.dimension_count", head_dim, 0, 1024));
  cfg.rope.rot_dims = int(rot_dims);
  gguf_rope_scaling(f, cfg.rope);
  cfg.qk_norm = tr.qk_norm;
  cfg.attn_bias = f.index.find("blk.0.attn_q.bias") != nullptr;
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
  cfg.norm_eps = float(hf_float_opt(j, "rms_norm_eps").value_or(1e-6));
  SHOAL_RETURN_IF_ERROR(hf_rope(j, cfg.rope));
  cfg.rope.rot_dims = head_dim;
  cfg.rope.interleaved = false;  // HF checkpoints use rotate_half
  if (auto it = j.find("hidden_act"); it != j.end() && it->is_string()) {
    SHOAL_ASSIGN_OR_RETURN(cfg.act, hf_activation(it->get<std::string>()));
  }
  cfg.qk_norm = tr.qk_norm;
  cfg.attn_bias = tr.attn_bias;
  if (auto it = j.find("attention_bias"); it != j.end() && it->is_boolean()) cfg.attn_bias = it->get<bool>();
  bool tied = false;
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && it->is_boolean()) tied = it->get<bool>();
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
