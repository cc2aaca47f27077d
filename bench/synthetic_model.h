// A synthetic random-weight model of the Qwen3-0.6B shape as a GgufWriter, for benchmarks:
// 28 layers, d_model 1024, d_ff 3072, 16 heads / 8 KV heads of head_dim 128, vocab 151,936,
// tied embeddings (shapes and keys as llama.cpp's qwen3 GGUFs). Weights are deterministic
// pseudo-random values of scale 1/sqrt(fan_in), produced while writing (nothing held in memory);
// norms are 1. The tokenizer is Qwen2's real vocab.json + merges.txt when a folder is given,
// else synthetic token strings of the same count.
#pragma once

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/half.h"
#include "core/mmap_file.h"
#include "format/gguf.h"

namespace shoal::bench {

struct SyntheticModelOptions {
  int n_layers = 28;  // 0 with tensors = false: a vocabulary-only file
  bool tensors = true;
  int64_t d_model = 1024, d_ff = 3072, n_heads = 16, n_kv_heads = 8, head_dim = 128;
  int64_t vocab_size = 151936;
  DType weight_dtype = DType::kBF16;  // F32, BF16, Q8_0 or Q4_0
  std::string vocab_dir;              // holds vocab.json + merges.txt (Qwen2 BPE); empty: synthetic
  uint64_t seed = 1;
};

namespace detail {

inline uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Byte k of a random tensor of the given dtype; blocks get a fixed scale and random quants.
inline uint8_t weight_byte(DType t, uint64_t key, uint64_t k, float scale) {
  auto rnd = [&](uint64_t i) { return mix(key ^ mix(i)); };
  auto uniform = [&](uint64_t i) { return (float(rnd(i) >> 40) / float(1 << 24) * 2.0f - 1.0f) * scale; };
  switch (t) {
    case DType::kF32: {
      const float v = uniform(k / 4);
      uint8_t b[4];
      std::memcpy(b, &v, 4);
      return b[k % 4];
    }
    case DType::kBF16: {
      const uint16_t h = f32_to_bf16(uniform(k / 2));
      return uint8_t(h >> (8 * (k % 2)));
    }
    case DType::kQ8_0:
    case DType::kQ4_0: {
      const uint64_t block = t == DType::kQ8_0 ? 34 : 18;
      const uint64_t j = k % block;
      const uint16_t d = f32_to_f16(scale / (t == DType::kQ8_0 ? 127.0f : 8.0f));
      if (j < 2) return uint8_t(d >> (8 * j));
      return uint8_t(rnd(k));
    }
    default:
      return 0;
  }
}

inline Status add_tokenizer(GgufWriter& w, const SyntheticModelOptions& o) {
  std::vector<MetaValue> tokens, types, merges;
  tokens.reserve(size_t(o.vocab_size));
  types.reserve(size_t(o.vocab_size));
  int64_t n_regular = 0;
  if (!o.vocab_dir.empty()) {
    SHOAL_ASSIGN_OR_RETURN(std::string vj, read_file(o.vocab_dir + "/vocab.json"));
    nlohmann::json vocab = nlohmann::json::parse(vj, nullptr, false);
    if (!vocab.is_object()) return make_error(Code::kCorrupt, "'{}/vocab.json' is not an object", o.vocab_dir);
    std::vector<std::string> by_id(vocab.size());
    for (auto& [s, id] : vocab.items()) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() >= by_id.size()) {
        return make_error(Code::kCorrupt, "'{}/vocab.json': bad id for '{}'", o.vocab_dir, s);
      }
      by_id[id.get<size_t>()] = s;
    }
    for (auto& s : by_id) tokens.push_back(MetaValue::str(std::move(s)));
    n_regular = int64_t(tokens.size());
    std::ifstream mf(o.vocab_dir + "/merges.txt");
    std::string line;
    while (std::getline(mf, line)) {
      if (line.empty() || line.rfind("#version", 0) == 0) continue;
      merges.push_back(MetaValue::str(line));
    }
  } else {
    n_regular = o.vocab_size - 293;  // Qwen3: 151,643 regular tokens
    for (int64_t i = 0; i < n_regular; ++i) tokens.push_back(MetaValue::str("tok" + std::to_string(i)));
    for (int64_t i = 256; i < n_regular; ++i) {
      merges.push_back(MetaValue::str("tok" + std::to_string(i % 256) + " tok" + std::to_string(i / 256)));
    }
  }
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (const char* s : specials) tokens.push_back(MetaValue::str(s));
  while (int64_t(tokens.size()) < o.vocab_size) {
    tokens.push_back(MetaValue::str("[PAD" + std::to_string(tokens.size()) + "]"));
  }
  for (int64_t i = 0; i < o.vocab_size; ++i) {
    types.push_back(MetaValue::i32(i < n_regular ? 1 : i < n_regular + 3 ? 3 : 5));
  }
  w.set("tokenizer.ggml.model", MetaValue::str("gpt2"));
  w.set("tokenizer.ggml.pre", MetaValue::str("qwen2"));
  w.set("tokenizer.ggml.tokens", MetaValue::array(MetaType::kString, std::move(tokens)));
  w.set("tokenizer.ggml.token_type", MetaValue::array(MetaType::kI32, std::move(types)));
  w.set("tokenizer.ggml.merges", MetaValue::array(MetaType::kString, std::move(merges)));
  w.set("tokenizer.ggml.eos_token_id", MetaValue::u32(uint32_t(n_regular + 2)));
  w.set("tokenizer.ggml.padding_token_id", MetaValue::u32(uint32_t(n_regular)));
  w.set("tokenizer.ggml.bos_token_id", MetaValue::u32(uint32_t(n_regular)));
  w.set("tokenizer.ggml.add_bos_token", MetaValue::boolean(false));
  return Status::Ok();
}

}  // namespace detail

/// The writer for the model (call write(path) on it). Errors: kInvalidArgument (dtype not one of
/// F32, BF16, Q8_0, Q4_0), errors reading the vocab folder.
inline Result<GgufWriter> synthetic_qwen3_writer(const SyntheticModelOptions& o) {
  const DType wt = o.weight_dtype;
  if (wt != DType::kF32 && wt != DType::kBF16 && wt != DType::kQ8_0 && wt != DType::kQ4_0) {
    return make_error(Code::kInvalidArgument, "synthetic model: dtype {} not offered", dtype_name(wt));
  }
  GgufWriter w;
  w.set("general.architecture", MetaValue::str("qwen3"));
  w.set("general.name", MetaValue::str("shoal-synthetic-qwen3-0.6b"));
  w.set("qwen3.block_count", MetaValue::u32(uint32_t(o.n_layers)));
  w.set("qwen3.context_length", MetaValue::u32(40960));
  w.set("qwen3.embedding_length", MetaValue::u32(uint32_t(o.d_model)));
  w.set("qwen3.feed_forward_length", MetaValue::u32(uint32_t(o.d_ff)));
  w.set("qwen3.attention.head_count", MetaValue::u32(uint32_t(o.n_heads)));
  w.set("qwen3.attention.head_count_kv", MetaValue::u32(uint32_t(o.n_kv_heads)));
  w.set("qwen3.attention.key_length", MetaValue::u32(uint32_t(o.head_dim)));
  w.set("qwen3.attention.value_length", MetaValue::u32(uint32_t(o.head_dim)));
  w.set("qwen3.rope.freq_base", MetaValue::f32(1000000.0f));
  w.set("qwen3.attention.layer_norm_rms_epsilon", MetaValue::f32(1e-6f));
  const uint32_t file_type = wt == DType::kF32 ? 0 : wt == DType::kBF16 ? 32 : wt == DType::kQ8_0 ? 7 : 2;
  w.set("general.file_type", MetaValue::u32(file_type));
  SHOAL_RETURN_IF_ERROR(detail::add_tokenizer(w, o));
  if (!o.tensors) return w;

  uint64_t key = o.seed;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    const uint64_t k = detail::mix(++key);
    const float scale = 1.0f / std::sqrt(float(cols));
    return w.add_tensor(name, wt, {rows, cols}, [wt, k, scale](uint64_t off, uint8_t* dst, uint64_t n) {
      for (uint64_t i = 0; i < n; ++i) dst[i] = detail::weight_byte(wt, k, off + i, scale);
      return Status::Ok();
    });
  };
  auto norm = [&](const std::string& name, int64_t n) {
    std::vector<float> ones(size_t(n), 1.0f);
    return w.add_tensor(name, DType::kF32, {n},
                        std::span(reinterpret_cast<const uint8_t*>(ones.data()), ones.size() * 4));
  };
  const int64_t q = o.n_heads * o.head_dim, kv = o.n_kv_heads * o.head_dim;
  SHOAL_RETURN_IF_ERROR(matrix("token_embd.weight", o.vocab_size, o.d_model));
  for (int l = 0; l < o.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    SHOAL_RETURN_IF_ERROR(norm(b + "attn_norm.weight", o.d_model));
    SHOAL_RETURN_IF_ERROR(matrix(b + "attn_q.weight", q, o.d_model));
    SHOAL_RETURN_IF_ERROR(matrix(b + "attn_k.weight", kv, o.d_model));
    SHOAL_RETURN_IF_ERROR(matrix(b + "attn_v.weight", kv, o.d_model));
    SHOAL_RETURN_IF_ERROR(matrix(b + "attn_output.weight", o.d_model, q));
    SHOAL_RETURN_IF_ERROR(norm(b + "attn_q_norm.weight", o.head_dim));
    SHOAL_RETURN_IF_ERROR(norm(b + "attn_k_norm.weight", o.head_dim));
    SHOAL_RETURN_IF_ERROR(norm(b + "ffn_norm.weight", o.d_model));
    SHOAL_RETURN_IF_ERROR(matrix(b + "ffn_gate.weight", o.d_ff, o.d_model));
    SHOAL_RETURN_IF_ERROR(matrix(b + "ffn_up.weight", o.d_ff, o.d_model));
    SHOAL_RETURN_IF_ERROR(matrix(b + "ffn_down.weight", o.d_model, o.d_ff));
  }
  SHOAL_RETURN_IF_ERROR(norm("output_norm.weight", o.d_model));
  return w;
}

}  // namespace shoal::bench
