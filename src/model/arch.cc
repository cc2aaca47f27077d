#include "model/arch.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>

#include "core/log.h"
#include "model/families.h"

namespace shoal {

const std::vector<ArchInfo>& architectures() {
  static const std::vector<ArchInfo> table = [] {
    std::vector<ArchInfo> all;
    for (auto& a : llama_family()) all.push_back(std::move(a));
    return all;
  }();
  return table;
}

namespace {

// The names a GGUF file's general.architecture (or, with `hf`, a config.json's model_type) may take.
std::string supported_list(bool hf) {
  std::string s;
  for (const auto& a : architectures()) {
    if (!hf) s += (s.empty() ? "" : ", ") + std::string(a.gguf_name);
    if (hf)
      for (auto t : a.hf_types) s += (s.empty() ? "" : ", ") + std::string(t);
  }
  return s;
}

/// The dtype the checkpoint was saved in, when it is a 16-bit float type (see RopeConfig::freq_dtype).
DType checkpoint_dtype(const ModelFile& f) {
  if (f.format == ModelFormat::kGguf) {
    const auto ft = f.metadata.get_int("general.file_type");  // llama_ftype
    if (ft == 32) return DType::kBF16;                           // LLAMA_FTYPE_MOSTLY_BF16
    if (ft == 1) return DType::kF16;                             // LLAMA_FTYPE_MOSTLY_F16
    return DType::kF32;
  }
  for (const char* key : {"dtype", "torch_dtype"}) {
    auto it = f.hf_config.find(key);
    if (it == f.hf_config.end() || !it->is_string()) continue;
    if (*it == "bfloat16") return DType::kBF16;
    if (*it == "float16") return DType::kF16;
  }
  return DType::kF32;
}

}  // namespace

Result<const ArchInfo*> find_architecture(const ModelFile& f) {
  if (f.format == ModelFormat::kGguf) {
    auto name = f.metadata.get_string("general.architecture");
    if (!name) return make_error(Code::kCorrupt, "'{}' has no general.architecture key", f.path);
    for (const auto& a : architectures())
      if (a.gguf_name == *name) return &a;
    return make_error(Code::kUnsupported, "architecture '{}' is not supported (supported: {})",
                      escape_unprintable(*name), supported_list(false));
  }
  const auto& j = f.hf_config;
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string())
    return make_error(Code::kCorrupt, "'{}/config.json' has no model_type", f.path);
  const std::string type = j["model_type"].get<std::string>();
  for (const auto& a : architectures())
    for (auto t : a.hf_types)
      if (t == type) return &a;
  return make_error(Code::kUnsupported, "model_type '{}' is not supported (supported: {})",
                    escape_unprintable(type), supported_list(true));
}

Result<ModelConfig> load_model_config(const ModelFile& f) {
  SHOAL_ASSIGN_OR_RETURN(const ArchInfo* arch, find_architecture(f));
  ModelConfig cfg;
  cfg.arch = std::string(arch->gguf_name);
  Status s = f.format == ModelFormat::kGguf ? arch->from_gguf(f, cfg) : arch->from_hf(f, cfg);
  if (s.ok()) s = arch_util::check_rope(cfg.rope);
  if (!s.ok()) return s.with_context(f.path);
  cfg.rope.interleaved = f.format == ModelFormat::kGguf && arch->gguf_rope_interleaved;
  cfg.rope.freq_dtype = checkpoint_dtype(f);
  if (cfg.name.empty()) {
    auto n = f.metadata.get_string("general.name");
    cfg.name = escape_unprintable(n ? *n : f.path.substr(f.path.find_last_of('/') + 1));  // (for messages)
  }
  if (int(cfg.layers.size()) != cfg.n_layers)
    return make_error(Code::kInternal, "architecture {} built {} layer configs for {} layers", cfg.arch,
                      cfg.layers.size(), cfg.n_layers);
  return cfg;
}

std::string layer_tensor(int layer, std::string_view suffix) { return fmt::format("blk.{}.{}", layer, suffix); }

const TensorInfo* WeightMap::find(std::string_view canonical) const {
  auto it = map_.find(std::string(canonical));
  return it == map_.end() ? nullptr : it->second;
}

namespace {

// "blk.N.<suffix>" -> N and the suffix; -1 for any other name.
int block_of(std::string_view name, std::string_view* suffix = nullptr) {
  constexpr std::string_view kBlk = "blk.";
  if (!name.starts_with(kBlk)) return -1;
  int layer = -1;
  const char* end = name.data() + name.size();
  const auto [p, ec] = std::from_chars(name.data() + kBlk.size(), end, layer);
  if (ec != std::errc() || p == end || *p != '.') return -1;
  if (suffix) *suffix = std::string_view(p + 1, size_t(end - (p + 1)));
  return layer;
}

}  // namespace

Status WeightMap::layers_within(int n_layers) const {
  int top = -1;
  const TensorInfo* top_info = nullptr;
  for (const auto& [name, info] : map_) {
    const int layer = block_of(name);
    if (layer >= n_layers && (layer > top || (layer == top && info->name < top_info->name))) {
      top = layer, top_info = info;
    }
  }
  if (!top_info) return Status::Ok();
  return make_error(Code::kCorrupt, "tensor '{}' belongs to layer {}, but the model has {} layers (its layer count "
                    "disagrees with its tensors)", top_info->name, top, n_layers);
}

Status WeightMap::missing(std::string_view canonical) const {
  std::string named = fmt::format("'{}'", canonical);
  std::string_view suffix;
  const int layer = block_of(canonical, &suffix);
  if (hf_arch_) {  // the checkpoint's own name, as the rules of map_weights would have read it
    for (const auto& r : hf_arch_->global_names) {
      if (r.gguf == canonical) named = fmt::format("'{}' ({})", r.hf, canonical);
    }
    for (const auto& r : hf_arch_->layer_names) {
      if (layer >= 0 && r.gguf == suffix) named = fmt::format("'model.layers.{}.{}' ({})", layer, r.hf, canonical);
    }
  }
  int top = -1;  // the highest layer with a tensor
  for (const auto& entry : map_) top = std::max(top, block_of(entry.first));
  if (layer >= 0 && top < 0) {
    return make_error(Code::kNotFound, "tensor {} is missing from the model, which has no layer tensor that Shoal "
                      "knows (names of another architecture?)", named);
  }
  if (layer > top) {
    return make_error(Code::kNotFound, "tensor {} is missing from the model, whose tensors end at layer {} (its layer "
                      "count disagrees with its tensors)", named, top);
  }
  return make_error(Code::kNotFound, "tensor {} is missing from the model", named);
}

Result<const TensorInfo*> WeightMap::get(std::string_view canonical) const {
  const TensorInfo* t = find(canonical);
  if (!t) return missing(canonical);
  return t;
}

Result<WeightMap> map_weights(const ModelFile& f, const ArchInfo& arch) {
  WeightMap m;
  if (f.format == ModelFormat::kGguf) {
    for (const auto& t : f.index.tensors()) m.add(t.name, &t);
    return m;
  }
  m.hf_arch_ = &arch;
  for (const auto& t : f.index.tensors()) {
    std::string_view name = t.name;
    // Qwen3.5-style checkpoints nest the text model under model.language_model.
    std::string flat;
    if (name.starts_with("model.language_model.")) {
      flat = "model." + std::string(name.substr(21));
      name = flat;
    }
    bool mapped = false;
    for (const auto& r : arch.global_names) {
      if (name == r.hf) {
        m.add(std::string(r.gguf), &t);
        mapped = true;
        break;
      }
    }
    constexpr std::string_view kLayers = "model.layers.";
    if (!mapped && name.starts_with(kLayers)) {
      std::string_view rest = name.substr(kLayers.size());
      int layer = -1;
      auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
      if (ec == std::errc() && layer >= 0 && p < rest.data() + rest.size() && *p == '.') {
        std::string_view suffix(p + 1, size_t(rest.data() + rest.size() - (p + 1)));
        for (const auto& r : arch.layer_names) {
          if (suffix == r.hf) {
            m.add(layer_tensor(layer, r.gguf), &t);
            mapped = true;
            break;
          }
        }
      }
    }
    if (mapped) continue;
    spdlog::debug("{}: tensor '{}' is not used", f.path, t.name);
    // (Older checkpoints keep RoPE's inv_freq buffers; transformers ignores them as well.)
    if (!name.ends_with(".rotary_emb.inv_freq")) m.unmapped_.push_back(t.name);
  }
  return m;
}

namespace arch_util {

namespace {
std::string arch_key(const ModelFile& f, std::string_view key) {
  return fmt::format("{}.{}", f.metadata.get_string("general.architecture").value_or(""), key);
}
}  // namespace

std::optional<int64_t> gguf_int_opt(const ModelFile& f, std::string_view key) {
  return f.metadata.get_int(arch_key(f, key));
}

Result<double> gguf_float_or(const ModelFile& f, std::string_view key, double fallback) {
  const std::string k = arch_key(f, key);
  const MetaValue* v = f.metadata.find(k);
  if (!v) return fallback;
  const auto x = v->as_float();
  if (!x) return make_error(Code::kCorrupt, "key '{}' is {}, not a number", k, meta_type_name(v->type));
  return *x;
}

Result<int64_t> gguf_int_or(const ModelFile& f, std::string_view key, int64_t fallback, int64_t lo, int64_t hi) {
  const std::string k = arch_key(f, key);
  const MetaValue* v = f.metadata.find(k);
  if (!v) return fallback;
  if (!v->as_int()) return make_error(Code::kCorrupt, "key '{}' is {}, not an integer", k, meta_type_name(v->type));
  return gguf_int(f, key, lo, hi);
}

Result<int64_t> gguf_int(const ModelFile& f, std::string_view key, int64_t lo, int64_t hi) {
  const std::string k = arch_key(f, key);
  const MetaValue* m = f.metadata.find(k);
  if (!m) return make_error(Code::kCorrupt, "missing integer key '{}'", k);
  const auto v = m->as_int();
  if (const uint64_t* u = std::get_if<uint64_t>(&m->v); !v && u)  // (a u64 past int64_t's range)
    return make_error(Code::kCorrupt, "key '{}' = {} is outside [{}, {}]", k, *u, lo, hi);
  if (!v) return make_error(Code::kCorrupt, "key '{}' is {}, not an integer", k, meta_type_name(m->type));
  if (*v < lo || *v > hi) return make_error(Code::kCorrupt, "key '{}' = {} is outside [{}, {}]", k, *v, lo, hi);
  return *v;
}

Result<std::vector<int>> gguf_per_layer(const ModelFile& f, std::string_view key, int n_layers, int64_t lo,
                                        int64_t hi) {
  const std::string k = arch_key(f, key);
  const MetaValue* v = f.metadata.find(k);
  if (!v) return make_error(Code::kCorrupt, "missing key '{}'", k);
  std::vector<int> out;
  if (const auto* arr = v->as_array()) {
    if (int(arr->size()) != n_layers)
      return make_error(Code::kCorrupt, "key '{}' has {} entries for {} layers", k, arr->size(), n_layers);
    for (const auto& e : *arr) {
      auto x = e.as_int();
      if (!x || *x < lo || *x > hi) return make_error(Code::kCorrupt, "key '{}' has an entry outside [{}, {}]", k, lo, hi);
      out.push_back(int(*x));
    }
    return out;
  }
  auto x = v->as_int();
  if (!x || *x < lo || *x > hi) return make_error(Code::kCorrupt, "key '{}' is not an integer in [{}, {}]", k, lo, hi);
  out.assign(size_t(n_layers), int(*x));
  return out;
}

std::optional<int64_t> hf_int_opt(const nlohmann::json& j, std::string_view key) {
  auto it = j.find(std::string(key));
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

Result<double> hf_float_or(const nlohmann::json& j, std::string_view key, double fallback) {
  auto it = j.find(std::string(key));
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) return make_error(Code::kCorrupt, "config.json: '{}' = {} is not a number", key, it->dump());
  return it->get<double>();
}

Result<bool> hf_bool_or(const nlohmann::json& j, std::string_view key, bool fallback) {
  auto it = j.find(std::string(key));
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return make_error(Code::kCorrupt, "config.json: '{}' = {} is not true or false", key, it->dump());
  return it->get<bool>();
}

Result<std::string> hf_string_or(const nlohmann::json& j, std::string_view key, const std::string& fallback) {
  auto it = j.find(std::string(key));
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) return make_error(Code::kCorrupt, "config.json: '{}' = {} is not a string", key, it->dump());
  return it->get<std::string>();
}

namespace {

// config.json's integer `v` (of field `key`) in [lo, hi]; one past int64 is outside too.
Result<int64_t> hf_int_in(const nlohmann::json& v, std::string_view key, int64_t lo, int64_t hi) {
  const bool past_int64 = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX);
  const int64_t x = past_int64 ? 0 : v.get<int64_t>();
  if (past_int64 || x < lo || x > hi) {
    return make_error(Code::kCorrupt, "config.json: '{}' = {} is outside [{}, {}]", key, v.dump(), lo, hi);
  }
  return x;
}

}  // namespace

Result<int64_t> hf_int_or(const nlohmann::json& j, std::string_view key, int64_t fallback, int64_t lo, int64_t hi) {
  auto it = j.find(std::string(key));
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) {
    return make_error(Code::kCorrupt, "config.json: '{}' = {} is not an integer", key, it->dump());
  }
  return hf_int_in(*it, key, lo, hi);
}

Result<int64_t> hf_int(const nlohmann::json& j, std::string_view key, int64_t lo, int64_t hi) {
  auto it = j.find(std::string(key));
  if (it == j.end() || it->is_null()) return make_error(Code::kCorrupt, "config.json: missing integer '{}'", key);
  if (!it->is_number_integer()) {
    return make_error(Code::kCorrupt, "config.json: '{}' = {} is not an integer", key, it->dump());
  }
  return hf_int_in(*it, key, lo, hi);
}

Result<Activation> hf_activation(const std::string& name) {
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new" || name == "gelu_fast") return Activation::kGeluTanh;
  if (name == "gelu") return Activation::kGeluErf;
  return make_error(Code::kUnsupported, "config.json: hidden_act '{}' is not supported", name);
}

Status hf_rope(const nlohmann::json& j, RopeConfig& rope) {
  // Objects where an object is expected: anything else (a string) is refused, not skipped.
  auto object = [](const nlohmann::json& o, const char* key) -> Result<const nlohmann::json*> {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return nullptr;
    if (!it->is_object()) return make_error(Code::kCorrupt, "config.json: '{}' = {} is not an object", key, it->dump());
    return &*it;
  };
  auto theta = [](const nlohmann::json& o, float& out) -> Status {
    SHOAL_ASSIGN_OR_RETURN(const double th, hf_float_or(o, "rope_theta", out));
    out = float(th);
    return Status::Ok();
  };
  SHOAL_ASSIGN_OR_RETURN(const nlohmann::json* p, object(j, "rope_parameters"));
  SHOAL_RETURN_IF_ERROR(theta(j, rope.theta));
  SHOAL_ASSIGN_OR_RETURN(const nlohmann::json* scaling, object(j, "rope_scaling"));
  if (!scaling) scaling = p;
  if (p) {
    // Gemma 3 style: {"full_attention": {...}, "sliding_attention": {...}}
    SHOAL_ASSIGN_OR_RETURN(const nlohmann::json* full, object(*p, "full_attention"));
    if (full) {
      SHOAL_RETURN_IF_ERROR(theta(*full, rope.theta));
      SHOAL_ASSIGN_OR_RETURN(const nlohmann::json* loc, object(*p, "sliding_attention"));
      if (loc) SHOAL_RETURN_IF_ERROR(theta(*loc, rope.theta_local));
      scaling = full;
    } else {
      SHOAL_RETURN_IF_ERROR(theta(*p, rope.theta));
    }
  }
  if (!scaling) return Status::Ok();
  std::string type = "default";
  for (const char* k : {"rope_type", "type"}) {
    if (!scaling->contains(k)) continue;
    SHOAL_ASSIGN_OR_RETURN(type, hf_string_or(*scaling, k, type));
  }
  if (type == "default") return Status::Ok();
  SHOAL_ASSIGN_OR_RETURN(const double factor, hf_float_or(*scaling, "factor", 1.0));
  rope.factor = float(factor);
  if (type == "linear") {
    rope.scaling = RopeScaling::kLinear;
  } else if (type == "llama3") {
    rope.scaling = RopeScaling::kLlama3;
    SHOAL_ASSIGN_OR_RETURN(const double low, hf_float_or(*scaling, "low_freq_factor", 1.0));
    SHOAL_ASSIGN_OR_RETURN(const double high, hf_float_or(*scaling, "high_freq_factor", 4.0));
    rope.low_freq_factor = float(low);
    rope.high_freq_factor = float(high);
    auto original = hf_int_or(*scaling, "original_max_position_embeddings", 8192, 1, INT32_MAX);
    if (!original.ok()) return original.status().with_context("its rope scaling");
    rope.original_context = int(*original);
  } else {
    return make_error(Code::kUnsupported, "config.json: rope scaling type '{}' is not supported", escape_unprintable(type));
  }
  return Status::Ok();
}

Status gguf_rope_scaling(const ModelFile& f, RopeConfig& rope) {
  const std::string key = arch_key(f, "rope.scaling.type");
  const MetaValue* v = f.metadata.find(key);
  if (!v) return Status::Ok();  // llama3 scaling is stored as the rope_freqs.weight tensor (per-pair divisors), read at load
  const std::string* type = v->as_string();
  if (!type) return make_error(Code::kCorrupt, "key '{}' is {}, not a string", key, meta_type_name(v->type));
  if (*type == "none") return Status::Ok();
  if (*type != "linear") {
    return make_error(Code::kUnsupported, "rope scaling type '{}' ({}) is not supported (none, linear)",
                      escape_unprintable(*type), key);
  }
  rope.scaling = RopeScaling::kLinear;
  SHOAL_ASSIGN_OR_RETURN(const double factor, gguf_float_or(f, "rope.scaling.factor", 1.0));
  rope.factor = float(factor);
  return Status::Ok();
}

Status check_rope(const RopeConfig& rope) {
  // (written so that NaN fails every comparison)
  if (!(rope.theta > 0.0f && std::isfinite(rope.theta)))
    return make_error(Code::kCorrupt, "RoPE base (rope_theta / rope.freq_base) {} is not a finite number > 0", rope.theta);
  if (rope.theta_local != 0.0f && !(rope.theta_local > 0.0f && std::isfinite(rope.theta_local)))
    return make_error(Code::kCorrupt, "the sliding layers' RoPE base {} is not a finite number > 0", rope.theta_local);
  if (rope.scaling != RopeScaling::kNone && !(rope.factor > 0.0f && std::isfinite(rope.factor)))
    return make_error(Code::kCorrupt, "RoPE scaling factor {} is not a finite number > 0", rope.factor);
  if (rope.scaling == RopeScaling::kLlama3 &&
      !(rope.low_freq_factor > 0.0f && rope.high_freq_factor > rope.low_freq_factor && std::isfinite(rope.high_freq_factor)))
    return make_error(Code::kCorrupt, "llama3 RoPE scaling: low_freq_factor {} and high_freq_factor {} are not 0 < low < high",
                      rope.low_freq_factor, rope.high_freq_factor);
  return Status::Ok();
}

}  // namespace arch_util

}  // namespace shoal
