// The architecture table: for each model family, how GGUF keys / config.json fields become a
// ModelConfig and how Hugging Face tensor names map to the canonical (GGUF) names.
// Style: llama.cpp src/llama-arch.cpp (names as tables), one short file per family.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "format/model_file.h"
#include "model/model_config.h"

namespace shoal {

/// One rename rule: an HF tensor-name suffix and its canonical GGUF suffix. For per-layer rules
/// the names follow "model.layers.N." / "blk.N."; global rules are whole names.
struct NameRule {
  std::string_view hf;
  std::string_view gguf;
};

/// Facts about one model family.
struct ArchInfo {
  std::string_view gguf_name;                 // general.architecture
  std::vector<std::string_view> hf_types;     // config.json model_type values
  bool gguf_rope_interleaved;                 // llama.cpp rope type NORM (Q/K permuted at convert)
  /// Fills cfg from GGUF metadata (keys "<arch>.*").
  Status (*from_gguf)(const ModelFile& f, ModelConfig& cfg);
  /// Fills cfg from config.json.
  Status (*from_hf)(const ModelFile& f, ModelConfig& cfg);
  std::vector<NameRule> layer_names;          // HF "model.layers.N.<hf>" -> "blk.N.<gguf>"
  std::vector<NameRule> global_names;         // HF full name -> GGUF full name
};

/// Every family Shoal knows.
const std::vector<ArchInfo>& architectures();

/// Finds the family of a model file (general.architecture or config.json model_type).
/// Errors: kUnsupported naming the architecture and listing the supported ones.
Result<const ArchInfo*> find_architecture(const ModelFile& f);

/// Reads the ModelConfig of a model file. Errors: kUnsupported, kCorrupt (missing or
/// out-of-range keys, naming them).
Result<ModelConfig> load_model_config(const ModelFile& f);

/// Canonical (GGUF) tensor name -> the file's TensorInfo.
class WeightMap {
 public:
  const TensorInfo* find(std::string_view canonical) const;
  /// Like find, but an error naming the missing tensor.
  Result<const TensorInfo*> get(std::string_view canonical) const;
  /// The error for a required tensor the file lacks: kNotFound naming it (for a Hugging Face
  /// checkpoint by its "model.layers.N." name first) and, for a layer past the last one that has
  /// tensors, saying that the layer count disagrees with the tensors.
  Status missing(std::string_view canonical) const;
  void add(std::string canonical, const TensorInfo* info) { map_[std::move(canonical)] = info; }
  size_t size() const { return map_.size(); }
  /// A Hugging Face checkpoint's tensors that no rule names (in file order; RoPE inv_freq buffers
  /// left out, as transformers ignores them): the loader warns of them with the unread ones.
  const std::vector<std::string>& unmapped() const { return unmapped_; }
  /// The canonical names, in no order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, info] : map_) out.push_back(name);
    return out;
  }
  /// Every layer tensor ("blk.N.*") belongs to a layer below n_layers. Errors: kCorrupt naming the
  /// highest-layer one that does not (a layer count that disagrees with the tensors, as llama.cpp refuses
  /// a GGUF whose tensor count is not what its block_count asks for).
  Status layers_within(int n_layers) const;

 private:
  friend Result<WeightMap> map_weights(const ModelFile& f, const ArchInfo& arch);
  std::unordered_map<std::string, const TensorInfo*> map_;
  const ArchInfo* hf_arch_ = nullptr;  // a Hugging Face checkpoint's rules (names in errors)
  std::vector<std::string> unmapped_;
};

/// Maps the file's tensors to canonical names (identity for GGUF). HF names that no rule covers
/// are left out (WeightMap::unmapped; each logged at debug level).
Result<WeightMap> map_weights(const ModelFile& f, const ArchInfo& arch);

/// "blk.3.attn_q.weight"
std::string layer_tensor(int layer, std::string_view suffix);

// Helpers for the per-family files.
namespace arch_util {
/// GGUF "<arch>.<key>" as an int; error naming the key if missing or out of [lo, hi].
Result<int64_t> gguf_int(const ModelFile& f, std::string_view key, int64_t lo, int64_t hi);
std::optional<int64_t> gguf_int_opt(const ModelFile& f, std::string_view key);
/// GGUF "<arch>.<key>" as an int in [lo, hi], `fallback` when absent; error naming the key if it is
/// outside (no silent wrap of a 64-bit value into an int).
Result<int64_t> gguf_int_or(const ModelFile& f, std::string_view key, int64_t fallback, int64_t lo, int64_t hi);
/// GGUF "<arch>.<key>" as a number (a float or an integer), `fallback` when absent. Errors:
/// kCorrupt naming the key and its type when it is something else (a string).
Result<double> gguf_float_or(const ModelFile& f, std::string_view key, double fallback);
/// A per-layer value that GGUF stores either as one int or as an array of n_layers ints.
Result<std::vector<int>> gguf_per_layer(const ModelFile& f, std::string_view key, int n_layers, int64_t lo, int64_t hi);
/// config.json field as an int in [lo, hi]; error naming it (missing, not an integer, outside).
Result<int64_t> hf_int(const nlohmann::json& j, std::string_view key, int64_t lo, int64_t hi);
std::optional<int64_t> hf_int_opt(const nlohmann::json& j, std::string_view key);
/// config.json field as an int in [lo, hi], `fallback` when absent or null; error naming it when
/// it is something else (a float, a string) or outside.
Result<int64_t> hf_int_or(const nlohmann::json& j, std::string_view key, int64_t fallback, int64_t lo, int64_t hi);
/// config.json field as a number, `fallback` when absent or null. Errors: kCorrupt naming it when
/// it is something else (a string, a list).
Result<double> hf_float_or(const nlohmann::json& j, std::string_view key, double fallback);
/// config.json field as a boolean, `fallback` when absent or null. Errors: kCorrupt naming it when
/// it is something else (the string "false", 0).
Result<bool> hf_bool_or(const nlohmann::json& j, std::string_view key, bool fallback);
/// config.json field as a string, `fallback` when absent or null. Errors: kCorrupt naming it when
/// it is something else.
Result<std::string> hf_string_or(const nlohmann::json& j, std::string_view key, const std::string& fallback);
/// Activation from an HF hidden_act string.
Result<Activation> hf_activation(const std::string& name);
/// Fills RopeConfig theta / scaling from HF `rope_parameters` (transformers ≥ 5) or
/// `rope_theta` + `rope_scaling` (older).
Status hf_rope(const nlohmann::json& j, RopeConfig& rope);
/// Fills RopeConfig scaling from GGUF "<arch>.rope.scaling.*" keys (llama.cpp's names: type
/// "none" / "linear" / "yarn", factor). Errors: kUnsupported for a type other than none / linear,
/// kCorrupt for mistyped keys.
Status gguf_rope_scaling(const ModelFile& f, RopeConfig& rope);
/// Refuses RoPE parameters that give no finite angles (transformers and llama.cpp compute with
/// them anyway: NaN logits): a base (theta) not finite and > 0, a scaling factor not > 0.
/// Errors: kCorrupt naming the value.
Status check_rope(const RopeConfig& rope);
}  // namespace arch_util

}  // namespace shoal
