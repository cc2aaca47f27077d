// Little-endian fixed-width payload encoding for the pool's messages (docs/protocol.md): a writer
// that appends fields to a byte vector, and a bounds-checked reader that keeps the first error
// (which field, at which offset, how many bytes were missing). Message structs list their fields
// once in a `fields(visitor)` method; PayloadWriter and PayloadReader are the two visitors.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/status.h"

namespace shoal::pool {

/// Ok when `s` is UTF-8 (no overlong forms, surrogates or code points past U+10FFFF) without
/// control characters (U+0000..U+001F, U+007F); else kCorrupt naming `what` and the byte offset.
Status check_printable_utf8(std::string_view s, std::string_view what);

/// `s` with invalid UTF-8 and control characters replaced by '?', cut to at most `max_len` bytes
/// on a character boundary: text we put in a string field from our own messages.
std::string printable_text(std::string_view s, size_t max_len);

/// Appends n bytes to out (resize + memcpy: no per-byte growth).
inline void append_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  if (n == 0) return;
  const size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}

/// Appends fields little-endian: integers and enums at their width, f32 as its IEEE bits, byte
/// arrays as-is, strings as u16 length + bytes.
class PayloadWriter {
 public:
  explicit PayloadWriter(std::vector<uint8_t>& out) : out_(out) {}

  template <typename T>
  void num(const char*, const T& v) {
    if constexpr (std::is_enum_v<T>) {
      num(nullptr, static_cast<std::underlying_type_t<T>>(v));
    } else if constexpr (std::is_same_v<T, float>) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      num(nullptr, bits);
    } else {
      static_assert(std::is_unsigned_v<T>, "wire integers are unsigned");
      uint8_t b[sizeof(T)];
      for (size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<uint8_t>(uint64_t(v) >> (8 * i));
      append_bytes(out_, b, sizeof(T));
    }
  }
  /// Writes v as the narrower wire type W (a DType id as one byte).
  template <typename W, typename T>
  void num_as(const char* field, const T& v) {
    num(field, static_cast<W>(v));
  }
  template <size_t N>
  void blob(const char*, const std::array<uint8_t, N>& v) {
    append_bytes(out_, v.data(), N);
  }
  /// `max_len` is the decoder's limit; encoding a longer string is a bug in the caller.
  void str(const char* field, const std::string& v, size_t max_len) {
    SHOAL_CHECK(v.size() <= max_len, "field '{}' is {} bytes, limit {}", field, v.size(), max_len);
    num(nullptr, static_cast<uint16_t>(v.size()));
    append_bytes(out_, v.data(), v.size());
  }

 private:
  std::vector<uint8_t>& out_;
};

/// Reads fields in the same order; after the first failure every read leaves its value untouched
/// and status() reports that failure. `what` names the message in errors ("hello").
class PayloadReader {
 public:
  PayloadReader(std::span<const uint8_t> in, std::string_view what) : in_(in), what_(what) {}

  template <typename T>
  void num(const char* field, T& v) {
    if constexpr (std::is_enum_v<T>) {
      std::underlying_type_t<T> raw{};
      num(field, raw);
      if (status_.ok()) v = static_cast<T>(raw);
    } else if constexpr (std::is_same_v<T, float>) {
      uint32_t bits = 0;
      num(field, bits);
      if (status_.ok()) std::memcpy(&v, &bits, 4);
    } else {
      static_assert(std::is_unsigned_v<T>, "wire integers are unsigned");
      if (!take(field, sizeof(T))) return;
      uint64_t x = 0;
      for (size_t i = 0; i < sizeof(T); ++i) x |= uint64_t(in_[pos_ - sizeof(T) + i]) << (8 * i);
      v = static_cast<T>(x);
    }
  }
  /// Reads the wire type W into v (the caller's check() validates the value).
  template <typename W, typename T>
  void num_as(const char* field, T& v) {
    W raw{};
    num(field, raw);
    if (status_.ok()) v = static_cast<T>(raw);
  }
  template <size_t N>
  void blob(const char* field, std::array<uint8_t, N>& v) {
    if (take(field, N)) std::memcpy(v.data(), in_.data() + pos_ - N, N);
  }
  void str(const char* field, std::string& v, size_t max_len);

  /// The bytes not read yet (a frame's hidden state).
  std::span<const uint8_t> rest() const { return in_.subspan(pos_); }
  size_t offset() const { return pos_; }
  const Status& status() const { return status_; }
  /// status(), or kCorrupt when bytes are left after the last field.
  Status finish() const;

 private:
  bool take(const char* field, size_t n);

  std::span<const uint8_t> in_;
  std::string_view what_;
  size_t pos_ = 0;
  Status status_;
};

}  // namespace shoal::pool
