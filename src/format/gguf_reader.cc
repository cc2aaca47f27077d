// GGUF parser over raw bytes. Every value from the file is checked before it is used: counts
// against the bytes left (so nothing is allocated for data that cannot be there), lengths, types,
// shapes with overflow-safe products, offsets and byte ranges.
#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "core/check.h"
#include "format/gguf.h"

namespace shoal {

namespace {

constexpr uint32_t kMaxMetaType = uint32_t(MetaType::kF64);

// Bytes one value of type t takes at least (arrays: element type + count).
uint64_t min_value_bytes(MetaType t) {
  switch (t) {
    case MetaType::kU8: case MetaType::kI8: case MetaType::kBool: return 1;
    case MetaType::kU16: case MetaType::kI16: return 2;
    case MetaType::kU32: case MetaType::kI32: case MetaType::kF32: return 4;
    case MetaType::kU64: case MetaType::kI64: case MetaType::kF64: return 8;
    case MetaType::kString: return 8;
    case MetaType::kArray: return 12;
  }
  return 1;
}

class Parser {
 public:
  Parser(const uint8_t* data, uint64_t size, const std::string& name)
      : p_(data), size_(size), name_(name) {}

  Result<GgufFile> parse();

 private:
  template <typename... Args>
  Status corrupt(fmt::format_string<Args...> f, Args&&... args) const {
    return Status(Code::kCorrupt,
                  fmt::format("gguf '{}': {}", name_, fmt::format(f, std::forward<Args>(args)...)));
  }
  uint64_t left() const { return size_ - pos_; }

  Status need(uint64_t n, std::string_view what) const {
    if (n > left()) {
      return corrupt("truncated: {} needs {} bytes at offset {}, only {} left (file size {})", what,
                     n, pos_, left(), size_);
    }
    return Status::Ok();
  }
  template <typename T>
  T take() {  // caller has checked need(sizeof(T))
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  template <typename T>
  Status read(T& v, std::string_view what) {
    SHOAL_RETURN_IF_ERROR(need(sizeof(T), what));
    v = take<T>();
    return Status::Ok();
  }
  Status read_string(std::string& out, uint64_t max_len, std::string_view what);
  Status read_value(MetaType t, int depth, MetaValue& out);
  Status read_array(int depth, MetaValue& out);
  Status read_metadata(uint64_t n_kv, GgufFile& f);
  Status read_tensor_info(const GgufFile& f, TensorInfo& t);
  Status check_ranges(GgufFile& f);

  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
};

Status Parser::read_string(std::string& out, uint64_t max_len, std::string_view what) {
  uint64_t len = 0;
  SHOAL_RETURN_IF_ERROR(read(len, what));
  if (len > max_len) return corrupt("{} has length {} (limit {})", what, len, max_len);
  if (len > left()) {
    return corrupt("{} of length {} at offset {} runs past the end of the file (size {})", what,
                   len, pos_ - 8, size_);
  }
  out.assign(reinterpret_cast<const char*>(p_ + pos_), len);
  pos_ += len;
  return Status::Ok();
}

Status Parser::read_value(MetaType t, int depth, MetaValue& out) {
  out.type = t;
  out.elem_type = MetaType::kU8;
  SHOAL_RETURN_IF_ERROR(need(min_value_bytes(t), "value"));
  switch (t) {
    case MetaType::kU8: out.v = uint64_t(take<uint8_t>()); break;
    case MetaType::kI8: out.v = int64_t(take<int8_t>()); break;
    case MetaType::kU16: out.v = uint64_t(take<uint16_t>()); break;
    case MetaType::kI16: out.v = int64_t(take<int16_t>()); break;
    case MetaType::kU32: out.v = uint64_t(take<uint32_t>()); break;
    case MetaType::kI32: out.v = int64_t(take<int32_t>()); break;
    case MetaType::kU64: out.v = take<uint64_t>(); break;
    case MetaType::kI64: out.v = take<int64_t>(); break;
    case MetaType::kF32: out.v = double(take<float>()); break;
    case MetaType::kF64: out.v = take<double>(); break;
    case MetaType::kBool: {
      const uint8_t b = take<uint8_t>();
      if (b > 1) return corrupt("bool value {} at offset {} (must be 0 or 1)", b, pos_ - 1);
      out.v = b == 1;
      break;
    }
    case MetaType::kString: {
      std::string s;
      SHOAL_RETURN_IF_ERROR(read_string(s, std::numeric_limits<uint64_t>::max(), "string value"));
      out.v = std::move(s);
      break;
    }
    case MetaType::kArray: return read_array(depth, out);
  }
  return Status::Ok();
}

Status Parser::read_array(int depth, MetaValue& out) {
  if (depth >= kGgufMaxArrayDepth) {
    return corrupt("arrays nested deeper than {} at offset {}", kGgufMaxArrayDepth, pos_);
  }
  const uint32_t et = take<uint32_t>();
  const uint64_t count = take<uint64_t>();
  if (et > kMaxMetaType) return corrupt("unknown array element type {} at offset {}", et, pos_ - 12);
  const MetaType elem = MetaType(et);
  // Each element takes at least min_value_bytes: a count that cannot fit is rejected before
  // anything is allocated for it.
  if (count > left() / min_value_bytes(elem)) {
    return corrupt("array of {} {} elements at offset {} cannot fit in the {} bytes left", count,
                   meta_type_name(elem), pos_ - 12, left());
  }
  out.elem_type = elem;
  std::vector<MetaValue> items(count);
  if (elem == MetaType::kString) {
    // Fast path for vocabularies (150k+ strings): no Status per element.
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t len = 0;
      if (left() >= 8) std::memcpy(&len, p_ + pos_, 8);
      if (left() < 8 || len > left() - 8) {
        std::string unused;  // the slow path words the error
        Status s = read_string(unused, std::numeric_limits<uint64_t>::max(), "string value");
        SHOAL_CHECK(!s.ok());
        return s;
      }
      pos_ += 8;
      items[i].type = MetaType::kString;
      items[i].v.emplace<std::string>(reinterpret_cast<const char*>(p_ + pos_), len);
      pos_ += len;
    }
  } else {
    for (uint64_t i = 0; i < count; ++i) {
      Status s = read_value(elem, depth + 1, items[i]);
      if (!s.ok()) return s;
    }
  }
  out.v = std::move(items);
  return Status::Ok();
}

Status Parser::read_metadata(uint64_t n_kv, GgufFile& f) {
  std::unordered_set<std::string> seen;
  seen.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    SHOAL_RETURN_IF_ERROR(read_string(key, kGgufMaxKey, fmt::format("metadata key #{}", i)));
    if (key.empty()) return corrupt("metadata key #{} is empty", i);
    if (!seen.insert(key).second) return corrupt("duplicate metadata key '{}'", key);
    uint32_t type = 0;
    SHOAL_RETURN_IF_ERROR(read(type, fmt::format("type of metadata key '{}'", key)));
    if (type > kMaxMetaType) return corrupt("metadata key '{}' has unknown value type {}", key, type);
    MetaValue v;
    Status s = read_value(MetaType(type), 0, v);
    if (!s.ok()) return Status(s.code(), fmt::format("{} (metadata key '{}')", s.message(), key));
    if (key == "general.alignment") {
      if (v.type != MetaType::kU32) {
        return corrupt("general.alignment has type {} (must be u32)", meta_type_name(v.type));
      }
      const uint64_t a = std::get<uint64_t>(v.v);
      if (a == 0 || (a & (a - 1)) != 0 || a > kGgufMaxAlignment) {
        return corrupt("general.alignment {} is not a power of two in [1, {}]", a,
                       kGgufMaxAlignment);
      }
      f.alignment = uint32_t(a);
    }
    f.metadata.set(std::move(key), std::move(v));
  }
  return Status::Ok();
}

Status Parser::read_tensor_info(const GgufFile& f, TensorInfo& t) {
  const uint64_t start = pos_;
  SHOAL_RETURN_IF_ERROR(read_string(t.name, kGgufMaxTensorName,
                                    fmt::format("name of tensor #{}", f.tensors.size())));
  if (t.name.empty()) return corrupt("tensor #{} at offset {} has an empty name", f.tensors.size(), start);
  const std::string what = fmt::format("tensor '{}'", t.name);
  uint32_t n_dims = 0;
  SHOAL_RETURN_IF_ERROR(read(n_dims, what + " n_dims"));
  if (n_dims == 0 || n_dims > kGgufMaxDims) {
    return corrupt("{} has n_dims {} (must be 1..{})", what, n_dims, kGgufMaxDims);
  }
  SHOAL_RETURN_IF_ERROR(need(8ull * n_dims + 4 + 8, what + " dims, type and offset"));
  uint64_t ne[kGgufMaxDims];
  int64_t n_elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    ne[d] = take<uint64_t>();
    if (ne[d] == 0 || ne[d] > uint64_t(std::numeric_limits<int64_t>::max())) {
      return corrupt("{} dimension ne[{}] = {} (must be in [1, 2^63))", what, d, ne[d]);
    }
    if (n_elements > std::numeric_limits<int64_t>::max() / int64_t(ne[d])) {
      return corrupt("{} element count overflows (ne[{}] = {})", what, d, ne[d]);
    }
    n_elements *= int64_t(ne[d]);
  }
  const uint32_t type = take<uint32_t>();
  const uint64_t offset = take<uint64_t>();
  auto info = dtype_info(type);
  if (!info) {
    return Status(Code::kUnsupported,
                  fmt::format("gguf '{}': {} has unknown tensor type id {}", name_, what, type));
  }
  if (ne[0] % uint64_t(info->block_size) != 0) {
    return corrupt("{} row length ne[0] = {} is not a multiple of the {} block size {}", what,
                   ne[0], info->name, info->block_size);
  }
  auto nbytes = dtype_bytes(DType(type), n_elements);
  if (!nbytes) return corrupt("{} byte size overflows ({} {} elements)", what, n_elements, info->name);
  if (offset % f.alignment != 0) {
    return corrupt("{} offset {} is not a multiple of the alignment {}", what, offset, f.alignment);
  }
  t.dtype = DType(type);
  t.shape.assign(n_dims, 0);
  for (uint32_t d = 0; d < n_dims; ++d) t.shape[n_dims - 1 - d] = int64_t(ne[d]);
  t.source = 0;
  t.offset = offset;  // relative for now; made absolute once the data section start is known
  t.nbytes = *nbytes;
  return Status::Ok();
}

Status Parser::check_ranges(GgufFile& f) {
  // Data section start: end of the tensor infos rounded up to the alignment.
  const uint64_t a = f.alignment;
  if (pos_ > std::numeric_limits<uint64_t>::max() - (a - 1)) return corrupt("header too large");
  f.data_offset = (pos_ + a - 1) / a * a;
  for (TensorInfo& t : f.tensors) {
    if (t.offset > std::numeric_limits<uint64_t>::max() - f.data_offset) {
      return corrupt("tensor '{}' offset {} overflows", t.name, t.offset);
    }
    const uint64_t begin = f.data_offset + t.offset;
    if (begin > size_ || t.nbytes > size_ - begin) {
      return corrupt("tensor '{}' data [{}, {}+{}) ends past end of file (size {})", t.name, begin,
                     begin, t.nbytes, size_);
    }
    t.offset = begin;
  }
  std::vector<const TensorInfo*> order(f.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = &f.tensors[i];
  std::sort(order.begin(), order.end(),
            [](const TensorInfo* x, const TensorInfo* y) { return x->offset < y->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& prev = *order[i - 1];
    const TensorInfo& cur = *order[i];
    if (prev.offset + prev.nbytes > cur.offset) {
      return corrupt("tensor '{}' data [{}, {}) overlaps tensor '{}' data [{}, {})", cur.name,
                     cur.offset, cur.offset + cur.nbytes, prev.name, prev.offset,
                     prev.offset + prev.nbytes);
    }
  }
  return Status::Ok();
}

Result<GgufFile> Parser::parse() {
  GgufFile f;
  uint32_t magic = 0, version = 0;
  SHOAL_RETURN_IF_ERROR(read(magic, "magic"));
  if (magic != kGgufMagic) {
    char m[4];
    std::memcpy(m, &magic, 4);
    std::string shown;
    for (char c : m) shown += (c >= 0x20 && c < 0x7f) ? fmt::format("{}", c) : fmt::format("\\x{:02x}", uint8_t(c));
    return corrupt("bad magic '{}' (expected 'GGUF')", shown);
  }
  SHOAL_RETURN_IF_ERROR(read(version, "version"));
  if (version != 2 && version != 3) {
    const uint32_t swapped = __builtin_bswap32(version);
    if (swapped == 2 || swapped == 3) {
      return Status(Code::kUnsupported,
                    fmt::format("gguf '{}': big-endian GGUF is not supported", name_));
    }
    return Status(Code::kUnsupported,
                  fmt::format("gguf '{}': version {} is not supported (only 2 and 3)", name_, version));
  }
  f.version = version;
  uint64_t n_tensors = 0, n_kv = 0;
  SHOAL_RETURN_IF_ERROR(read(n_tensors, "tensor count"));
  SHOAL_RETURN_IF_ERROR(read(n_kv, "metadata count"));
  // A key/value takes at least 8 + 1 + 4 + 1 bytes, a tensor info 8 + 1 + 4 + 8 + 4 + 8.
  if (n_kv > left() / 14) {
    return corrupt("metadata count {} cannot fit in the {} bytes left", n_kv, left());
  }
  if (n_tensors > left() / 33) {
    return corrupt("tensor count {} cannot fit in the {} bytes left", n_tensors, left());
  }
  SHOAL_RETURN_IF_ERROR(read_metadata(n_kv, f));
  if (n_tensors > left() / 33) {
    return corrupt("tensor count {} cannot fit in the {} bytes left after the metadata", n_tensors,
                   left());
  }
  f.tensors.reserve(n_tensors);
  std::unordered_set<std::string> names;
  names.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    SHOAL_RETURN_IF_ERROR(read_tensor_info(f, t));
    if (!names.insert(t.name).second) return corrupt("duplicate tensor name '{}'", t.name);
    f.tensors.push_back(std::move(t));
  }
  SHOAL_RETURN_IF_ERROR(check_ranges(f));
  return f;
}

}  // namespace

Result<GgufFile> parse_gguf(const uint8_t* data, uint64_t size, const std::string& name) {
  if (data == nullptr && size != 0) {
    return make_error(Code::kInvalidArgument, "gguf '{}': null data of size {}", name, size);
  }
  static const uint8_t kEmpty = 0;
  return Parser(data ? data : &kEmpty, size, name).parse();
}

}  // namespace shoal
