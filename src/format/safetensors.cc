// safetensors header parser and a small writer. The JSON is parsed by nlohmann-json through
// parse_json_doc (SAX), which rejects duplicate tensor names and deep nesting while parsing.
#include "format/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "format/json_doc.h"

namespace shoal {

namespace {

struct StDtype {
  std::string_view name;
  uint64_t size;               // bytes per element
  std::optional<DType> dtype;  // nullopt: valid in safetensors, no Shoal DType
};

constexpr StDtype kStDtypes[] = {
    {"F64", 8, DType::kF64},   {"F32", 4, DType::kF32},   {"F16", 2, DType::kF16},
    {"BF16", 2, DType::kBF16}, {"I64", 8, DType::kI64},   {"I32", 4, DType::kI32},
    {"I16", 2, DType::kI16},   {"I8", 1, DType::kI8},     {"BOOL", 1, std::nullopt},
    {"U8", 1, std::nullopt},   {"U16", 2, std::nullopt},  {"U32", 4, std::nullopt},
    {"U64", 8, std::nullopt},  {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
    {"F8_E8M0", 1, std::nullopt}, {"C64", 8, std::nullopt},
};

const StDtype* find_st_dtype(std::string_view s) {
  for (const StDtype& d : kStDtypes)
    if (d.name == s) return &d;
  return nullptr;
}

constexpr int kMaxDepth = 4;  // levels of containers (a tensor's shape is at 3)

}  // namespace

std::string_view safetensors_dtype_name(DType t) {
  for (const StDtype& d : kStDtypes)
    if (d.dtype == t) return d.name;
  return {};
}

Result<SafetensorsFile> parse_safetensors(const uint8_t* data, uint64_t size,
                                          const std::string& name) {
  auto corrupt = [&](std::string msg) {
    return Status(Code::kCorrupt, fmt::format("safetensors '{}': {}", name, msg));
  };
  if (size < 8) return corrupt(fmt::format("file of {} bytes is too short for the header length", size));
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  if (n > kSafetensorsMaxHeader) {
    return corrupt(fmt::format("header length {} exceeds the limit {}", n, kSafetensorsMaxHeader));
  }
  if (n > size - 8) {
    return corrupt(fmt::format("header length {} runs past the end of the file (size {})", n, size));
  }
  if (n < 2 || data[8] != '{') return corrupt("header is not a JSON object");
  const char* begin = reinterpret_cast<const char*>(data + 8);

  std::unordered_set<std::string> names;
  JsonLimits limits;
  limits.max_depth = kMaxDepth;
  limits.on_top_key = [&](const std::string& key) {
    return names.insert(key).second ? std::string() : fmt::format("duplicate tensor name '{}'", key);
  };
  auto parsed = parse_json_doc(std::string_view(begin, n), "header", limits);
  if (!parsed.ok()) return corrupt(parsed.status().message());
  const nlohmann::json& h = *parsed;
  if (!h.is_object()) return corrupt("header is not a JSON object");

  SafetensorsFile f;
  f.data_offset = 8 + n;
  const uint64_t data_size = size - f.data_offset;
  std::optional<std::string> unsupported;
  for (auto& [key, v] : h.items()) {
    if (key == "__metadata__") {
      if (!v.is_object()) return corrupt("__metadata__ is not an object");
      for (auto& [mk, mv] : v.items()) {
        if (!mv.is_string()) return corrupt(fmt::format("__metadata__ '{}' is not a string", mk));
        f.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    const std::string what = fmt::format("tensor '{}'", key);
    if (key.empty()) return corrupt("a tensor has an empty name");
    if (!v.is_object()) return corrupt(what + " is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return corrupt(what + " dtype is missing or not a string");
    if (sh == v.end() || !sh->is_array()) return corrupt(what + " shape is missing or not an array");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return corrupt(what + " data_offsets is not [begin, end] of unsigned integers");
    }
    const std::string dts = dt->get<std::string>();
    const StDtype* st = find_st_dtype(dts);
    if (!st) {
      return Status(Code::kUnsupported,
                    fmt::format("safetensors '{}': {} has unknown dtype '{}'", name, what, dts));
    }
    if (sh->size() > kSafetensorsMaxRank) {
      return corrupt(fmt::format("{} has {} dims (limit {})", what, sh->size(), kSafetensorsMaxRank));
    }
    TensorInfo t;
    t.name = key;
    uint64_t count = 1;
    bool overflow = false;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) return corrupt(what + " shape holds a value that is not an unsigned integer");
      const uint64_t x = d.get<uint64_t>();
      if (x > uint64_t(std::numeric_limits<int64_t>::max())) overflow = true;
      if (x != 0 && count > uint64_t(std::numeric_limits<int64_t>::max()) / x) overflow = true;
      count *= x;
      t.shape.push_back(int64_t(x));
    }
    if (overflow || count > std::numeric_limits<uint64_t>::max() / st->size) {
      return corrupt(what + " element count or byte size overflows");
    }
    const uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
    if (b > e) return corrupt(fmt::format("{} data_offsets [{}, {}] are reversed", what, b, e));
    if (e > data_size) {
      return corrupt(fmt::format("{} data_offsets [{}, {}] end past the data section ({} bytes)", what,
                                 b, e, data_size));
    }
    if (e - b != count * st->size) {
      return corrupt(fmt::format("{} data_offsets [{}, {}] hold {} bytes, but {} x {} needs {}", what,
                                 b, e, e - b, dts, t.shape_string(), count * st->size));
    }
    if (!st->dtype && !unsupported) unsupported = fmt::format("{} has dtype {}", what, dts);
    t.dtype = st->dtype.value_or(DType::kI8);
    t.offset = f.data_offset + b;
    t.nbytes = e - b;
    f.tensors.push_back(std::move(t));
  }
  std::sort(f.tensors.begin(), f.tensors.end(), [](const TensorInfo& x, const TensorInfo& y) {
    return x.offset != y.offset ? x.offset < y.offset : x.name < y.name;
  });
  // An empty tensor's range overlaps nothing (the format allows one anywhere).
  const TensorInfo* p = nullptr;  // the last tensor with bytes
  for (const TensorInfo& c : f.tensors) {
    if (c.nbytes == 0) continue;
    if (p && p->offset + p->nbytes > c.offset) {
      return corrupt(fmt::format("tensor '{}' data_offsets overlap tensor '{}'", c.name, p->name));
    }
    p = &c;
  }
  if (unsupported) {
    return Status(Code::kUnsupported,
                  fmt::format("safetensors '{}': {}, which Shoal does not load", name, *unsupported));
  }
  return f;
}

Result<std::vector<uint8_t>> write_safetensors(const std::vector<SafetensorsTensor>& tensors,
                                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    const std::string_view dn = safetensors_dtype_name(t.dtype);
    int64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    auto need = dtype_bytes(t.dtype, count);
    if (dn.empty() || !need || *need != t.bytes.size()) {
      return make_error(Code::kInvalidArgument, "safetensors writer: tensor '{}' dtype or size is wrong",
                        t.name);
    }
    h[t.name] = {{"dtype", dn}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string js = h.dump();
  while ((8 + js.size()) % 8 != 0) js += ' ';  // keeps the data section 8-byte aligned
  std::vector<uint8_t> out(8);
  const uint64_t n = js.size();
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), js.begin(), js.end());
  for (const SafetensorsTensor& t : tensors) out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  return out;
}

}  // namespace shoal
