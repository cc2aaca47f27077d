#include "pool/byte_io.h"

#include "core/log.h"

namespace shoal::pool {

std::string printable_text(std::string_view s, size_t max_len) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t len = printable_char_len(s, i);
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
    const size_t len = printable_char_len(s, i);
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
