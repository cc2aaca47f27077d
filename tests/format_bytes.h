// Test helper: builds GGUF bytes field by field, so malformed files can be made on purpose.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace shoal::test {

/// Little-endian byte builder.
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& add(const Bytes& o) {
    b.insert(b.end(), o.b.begin(), o.b.end());
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
  Bytes& pad_to(size_t a) { return zeros((a - b.size() % a) % a); }
};

/// GGUF header: magic, version, tensor count, metadata count.
inline Bytes gguf_header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3,
                         uint32_t magic = 0x46554747) {
  Bytes x;
  x.u32(magic).u32(version).u64(n_tensors).u64(n_kv);
  return x;
}

/// One key/value with a u32 value (type 4).
inline Bytes gguf_kv_u32(const std::string& key, uint32_t v) {
  Bytes x;
  x.str(key).u32(4).u32(v);
  return x;
}

/// One tensor info: name, ne[] (innermost first), ggml type, offset in the data section.
inline Bytes gguf_tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
                         uint64_t offset) {
  Bytes x;
  x.str(name).u32(uint32_t(ne.size()));
  for (uint64_t d : ne) x.u64(d);
  x.u32(type).u64(offset);
  return x;
}

}  // namespace shoal::test
