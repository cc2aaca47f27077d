#include "pool/byte_io.h"

namespace shoal::pool {

namespace {

// Length of the valid, printable UTF-8 character at s[i], or 0.
size_t printable_char_len(const uint8_t* p, size_t n, size_t i) {
  const uint8_t b = p[i];
  if (b < 0x80) return (b < 0x20 || b == 0x7F) ? 0 : 1;
  size_t len;
  uint32_t cp;
  uint32_t min_cp;
  if ((b & 0xE0) == 0xC0) {
    len = 2, cp = b & 0x1Fu, min_cp = 0x80;
  } else if ((b & 0xF0) == 0xE0) {
    len = 3, cp = b & 0x0Fu, min_cp = 0x800;
  } else if ((b & 0xF8) == 0xF0) {
    len = 4, cp = b & 0x07u, min_cp = 0x10000;
  } else {
    return 0;
  }
  if (n - i < len) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((p[i + k] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (p[i + k] & 0x3Fu);
  }
  if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

std::string printable_text(std::string_view s, size_t max_len) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t len = printable_char_len(p, s.size(), i);
    const size_t add = len == 0 ? 1 : len;
    if (out.size() + add > max_len) break;
    if (len == 0) {
      out += '?';
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

Status check_printable_utf8(std::string_view s, std::string_view what) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const size_t len = printable_char_len(p, s.size(), i);
    if (len == 0) {
      return make_error(Code::kCorrupt, "{} is not printable UTF-8 (byte 0x{:02x} at offset {})", what,
                        p[i], i);
    }
    i += len;
  }
  return Status::Ok();
}

bool PayloadReader::take(const char* field, size_t n) {
  if (!status_.ok()) return false;
  if (in_.size() - pos_ < n) {
    status_ = make_error(Code::kCorrupt,
                         "{} payload ends inside field '{}' (offset {}, needs {} bytes, {} left)",
                         what_, field, pos_, n, in_.size() - pos_);
    return false;
  }
  pos_ += n;
  return true;
}

void PayloadReader::str(const char* field, std::string& v, size_t max_len) {
  uint16_t len = 0;
  num(field, len);
  if (!status_.ok()) return;
  if (len > max_len) {
    status_ = make_error(Code::kCorrupt, "{} field '{}' is {} bytes long, limit {}", what_, field,
                         len, max_len);
    return;
  }
  if (!take(field, len)) return;
  std::string s(reinterpret_cast<const char*>(in_.data() + pos_ - len), len);
  Status st = check_printable_utf8(s, fmt::format("{} field '{}'", what_, field));
  if (!st.ok()) {
    status_ = st;
    return;
  }
  v = std::move(s);
}

Status PayloadReader::finish() const {
  if (!status_.ok()) return status_;
  if (pos_ != in_.size()) {
    return make_error(Code::kCorrupt, "{} payload has {} bytes after its last field", what_,
                      in_.size() - pos_);
  }
  return Status::Ok();
}

}  // namespace shoal::pool
