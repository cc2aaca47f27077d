// GGUF writer: header, metadata, tensor infos, then the data section with every tensor at a
// multiple of the alignment (zero padding), as ggml's gguf.cpp and gguf-py lay files out.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "format/gguf.h"

namespace shoal {

// Where the bytes go: a file (buffered) or a vector.
class GgufWriter::Sink {
 public:
  virtual ~Sink() = default;
  virtual Status put(const void* p, uint64_t n) = 0;
  uint64_t written() const { return written_; }

 protected:
  uint64_t written_ = 0;
};

namespace {

class VectorSink final : public GgufWriter::Sink {
 public:
  Status put(const void* p, uint64_t n) override {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
    written_ += n;
    return Status::Ok();
  }
  std::vector<uint8_t> out;
};

class FileSink final : public GgufWriter::Sink {
 public:
  FileSink(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  Status put(const void* p, uint64_t n) override {
    if (n && std::fwrite(p, 1, n, f_) != n) {
      return make_error(Code::kIoError, "cannot write '{}': {}", path_, std::strerror(errno));
    }
    written_ += n;
    return Status::Ok();
  }

 private:
  std::FILE* f_;
  std::string path_;
};

template <typename T>
Status put_le(GgufWriter::Sink& s, T v) {
  return s.put(&v, sizeof(T));  // x86-64 and aarch64 are little-endian
}

Status put_string(GgufWriter::Sink& s, const std::string& str) {
  SHOAL_RETURN_IF_ERROR(put_le<uint64_t>(s, str.size()));
  return s.put(str.data(), str.size());
}

Status bad_value(std::string_view what) {
  return make_error(Code::kInvalidArgument, "gguf writer: metadata value {} does not match its type",
                    what);
}

Status put_value(GgufWriter::Sink& s, const MetaValue& v, std::string_view key) {
  auto u = [&]() -> const uint64_t* { return std::get_if<uint64_t>(&v.v); };
  auto i = [&]() -> const int64_t* { return std::get_if<int64_t>(&v.v); };
  auto d = [&]() -> const double* { return std::get_if<double>(&v.v); };
  switch (v.type) {
    case MetaType::kU8: if (!u()) return bad_value(key); return put_le<uint8_t>(s, uint8_t(*u()));
    case MetaType::kI8: if (!i()) return bad_value(key); return put_le<int8_t>(s, int8_t(*i()));
    case MetaType::kU16: if (!u()) return bad_value(key); return put_le<uint16_t>(s, uint16_t(*u()));
    case MetaType::kI16: if (!i()) return bad_value(key); return put_le<int16_t>(s, int16_t(*i()));
    case MetaType::kU32: if (!u()) return bad_value(key); return put_le<uint32_t>(s, uint32_t(*u()));
    case MetaType::kI32: if (!i()) return bad_value(key); return put_le<int32_t>(s, int32_t(*i()));
    case MetaType::kU64: if (!u()) return bad_value(key); return put_le<uint64_t>(s, *u());
    case MetaType::kI64: if (!i()) return bad_value(key); return put_le<int64_t>(s, *i());
    case MetaType::kF32: if (!d()) return bad_value(key); return put_le<float>(s, float(*d()));
    case MetaType::kF64: if (!d()) return bad_value(key); return put_le<double>(s, *d());
    case MetaType::kBool: {
      const bool* b = std::get_if<bool>(&v.v);
      if (!b) return bad_value(key);
      return put_le<uint8_t>(s, *b ? 1 : 0);
    }
    case MetaType::kString: {
      const std::string* str = v.as_string();
      if (!str) return bad_value(key);
      return put_string(s, *str);
    }
    case MetaType::kArray: {
      const auto* items = v.as_array();
      if (!items) return bad_value(key);
      SHOAL_RETURN_IF_ERROR(put_le<uint32_t>(s, uint32_t(v.elem_type)));
      SHOAL_RETURN_IF_ERROR(put_le<uint64_t>(s, items->size()));
      for (const MetaValue& e : *items) {
        if (e.type != v.elem_type) return bad_value(key);
        SHOAL_RETURN_IF_ERROR(put_value(s, e, key));
      }
      return Status::Ok();
    }
  }
  return bad_value(key);
}

Status put_zeros(GgufWriter::Sink& s, uint64_t n) {
  static const uint8_t kZeros[256] = {};
  while (n > 0) {
    const uint64_t k = std::min<uint64_t>(n, sizeof(kZeros));
    SHOAL_RETURN_IF_ERROR(s.put(kZeros, k));
    n -= k;
  }
  return Status::Ok();
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

void GgufWriter::set_all(const Metadata& m) {
  for (const auto& [k, v] : m.entries()) metadata_.set(k, v);
}

Status GgufWriter::check_tensor(const std::string& name, DType dtype,
                                const std::vector<int64_t>& shape, uint64_t* nbytes) const {
  if (name.empty() || name.size() > kGgufMaxTensorName) {
    return make_error(Code::kInvalidArgument, "gguf writer: tensor name '{}' must be 1..{} bytes",
                      name, kGgufMaxTensorName);
  }
  if (names_.count(name)) {
    return make_error(Code::kInvalidArgument, "gguf writer: duplicate tensor '{}'", name);
  }
  auto info = dtype_info(uint32_t(dtype));
  if (!info) return make_error(Code::kInvalidArgument, "gguf writer: tensor '{}' has unknown dtype", name);
  if (shape.empty() || shape.size() > kGgufMaxDims) {
    return make_error(Code::kInvalidArgument, "gguf writer: tensor '{}' has {} dims (must be 1..4)",
                      name, shape.size());
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0 || n > std::numeric_limits<int64_t>::max() / d) {
      return make_error(Code::kInvalidArgument, "gguf writer: tensor '{}' has bad shape", name);
    }
    n *= d;
  }
  if (shape.back() % info->block_size != 0) {
    return make_error(Code::kInvalidArgument,
                      "gguf writer: tensor '{}' innermost dim {} is not a multiple of the {} block "
                      "size {}", name, shape.back(), info->name, info->block_size);
  }
  auto b = dtype_bytes(dtype, n);
  if (!b) return make_error(Code::kInvalidArgument, "gguf writer: tensor '{}' is too large", name);
  *nbytes = *b;
  return Status::Ok();
}

Status GgufWriter::add_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                              std::span<const uint8_t> bytes) {
  uint64_t nbytes = 0;
  SHOAL_RETURN_IF_ERROR(check_tensor(name, dtype, shape, &nbytes));
  if (bytes.size() != nbytes) {
    return make_error(Code::kInvalidArgument, "gguf writer: tensor '{}' has {} bytes, expected {}",
                      name, bytes.size(), nbytes);
  }
  Pending p;
  p.info = TensorInfo{std::move(name), dtype, std::move(shape), 0, 0, nbytes};
  p.bytes.assign(bytes.begin(), bytes.end());
  names_.insert(p.info.name);
  tensors_.push_back(std::move(p));
  return Status::Ok();
}

Status GgufWriter::add_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                              Filler fill) {
  uint64_t nbytes = 0;
  SHOAL_RETURN_IF_ERROR(check_tensor(name, dtype, shape, &nbytes));
  Pending p;
  p.info = TensorInfo{std::move(name), dtype, std::move(shape), 0, 0, nbytes};
  p.fill = std::move(fill);
  names_.insert(p.info.name);
  tensors_.push_back(std::move(p));
  return Status::Ok();
}

Status GgufWriter::write_to(Sink& out) const {
  uint64_t alignment = kGgufDefaultAlignment;
  if (const MetaValue* a = metadata_.find("general.alignment")) {
    const uint64_t* v = std::get_if<uint64_t>(&a->v);
    if (a->type != MetaType::kU32 || !v || *v == 0 || (*v & (*v - 1)) != 0 ||
        *v > kGgufMaxAlignment) {
      return make_error(Code::kInvalidArgument,
                        "gguf writer: general.alignment must be a u32 power of two <= {}",
                        kGgufMaxAlignment);
    }
    alignment = *v;
  }
  SHOAL_RETURN_IF_ERROR(put_le<uint32_t>(out, kGgufMagic));
  SHOAL_RETURN_IF_ERROR(put_le<uint32_t>(out, 3));
  SHOAL_RETURN_IF_ERROR(put_le<uint64_t>(out, tensors_.size()));
  SHOAL_RETURN_IF_ERROR(put_le<uint64_t>(out, metadata_.size()));
  for (const auto& [key, value] : metadata_.entries()) {
    SHOAL_RETURN_IF_ERROR(put_string(out, key));
    SHOAL_RETURN_IF_ERROR(put_le<uint32_t>(out, uint32_t(value.type)));
    SHOAL_RETURN_IF_ERROR(put_value(out, value, key));
  }
  uint64_t offset = 0;
  for (const Pending& p : tensors_) {
    SHOAL_RETURN_IF_ERROR(put_string(out, p.info.name));
    SHOAL_RETURN_IF_ERROR(put_le<uint32_t>(out, uint32_t(p.info.shape.size())));
    for (size_t d = p.info.shape.size(); d-- > 0;) {  // ne[] is innermost first
      SHOAL_RETURN_IF_ERROR(put_le<uint64_t>(out, uint64_t(p.info.shape[d])));
    }
    SHOAL_RETURN_IF_ERROR(put_le<uint32_t>(out, uint32_t(p.info.dtype)));
    SHOAL_RETURN_IF_ERROR(put_le<uint64_t>(out, offset));
    offset = align_up(offset + p.info.nbytes, alignment);
  }
  // Like ggml's writer, a file without tensors (vocab-only) ends right after the header.
  if (tensors_.empty()) return Status::Ok();
  SHOAL_RETURN_IF_ERROR(put_zeros(out, align_up(out.written(), alignment) - out.written()));
  constexpr uint64_t kChunk = 4ull << 20;
  std::vector<uint8_t> buf;
  for (const Pending& p : tensors_) {
    if (!p.fill) {
      SHOAL_RETURN_IF_ERROR(out.put(p.bytes.data(), p.bytes.size()));
    } else {
      buf.resize(std::min(kChunk, p.info.nbytes));
      for (uint64_t done = 0; done < p.info.nbytes;) {
        const uint64_t n = std::min(kChunk, p.info.nbytes - done);
        SHOAL_RETURN_IF_ERROR(p.fill(done, buf.data(), n));
        SHOAL_RETURN_IF_ERROR(out.put(buf.data(), n));
        done += n;
      }
    }
    SHOAL_RETURN_IF_ERROR(put_zeros(out, align_up(p.info.nbytes, alignment) - p.info.nbytes));
  }
  return Status::Ok();
}

Status GgufWriter::write(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return make_error(Code::kIoError, "cannot create '{}': {}", path, std::strerror(errno));
  std::vector<char> buf(1 << 20);
  std::setvbuf(f, buf.data(), _IOFBF, buf.size());
  FileSink sink(f, path);
  Status s = write_to(sink);
  if (std::fclose(f) != 0 && s.ok()) {
    s = make_error(Code::kIoError, "cannot close '{}': {}", path, std::strerror(errno));
  }
  return s;
}

Result<std::vector<uint8_t>> GgufWriter::write_to_bytes() const {
  VectorSink sink;
  SHOAL_RETURN_IF_ERROR(write_to(sink));
  return std::move(sink.out);
}

}  // namespace shoal
