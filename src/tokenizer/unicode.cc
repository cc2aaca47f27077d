#include "tokenizer/unicode.h"

#include <array>

namespace shoal::tok {

size_t utf8_len(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

std::optional<uint32_t> decode_utf8_at(std::string_view s, size_t* offset) {
  const size_t i = *offset;
  if (i >= s.size()) return std::nullopt;
  const auto b0 = uint8_t(s[i]);
  if (b0 < 0x80) {
    *offset = i + 1;
    return b0;
  }
  size_t n;
  uint32_t cpt;
  uint32_t min;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, cpt = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cpt = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cpt = b0 & 0x07, min = 0x10000;
  } else {
    return std::nullopt;  // continuation byte or 0xF8..0xFF as a lead
  }
  if (s.size() - i < n) return std::nullopt;
  for (size_t k = 1; k < n; ++k) {
    const auto b = uint8_t(s[i + k]);
    if ((b & 0xC0) != 0x80) return std::nullopt;
    cpt = (cpt << 6) | (b & 0x3F);
  }
  // Overlong forms, UTF-16 surrogates and values past U+10FFFF are not UTF-8 (RFC 3629).
  if (cpt < min || cpt > 0x10FFFF || (cpt >= 0xD800 && cpt <= 0xDFFF)) return std::nullopt;
  *offset = i + n;
  return cpt;
}

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t off = 0;
  while (off < s.size()) {
    if (auto c = decode_utf8_at(s, &off)) {
      out.push_back(*c);
    } else {
      out.push_back(kReplacementChar);
      ++off;
    }
  }
  return out;
}

size_t encode_utf8(uint32_t cpt, char* out) {
  if (cpt > 0x10FFFF) cpt = kReplacementChar;
  if (cpt < 0x80) {
    out[0] = char(cpt);
    return 1;
  }
  if (cpt < 0x800) {
    out[0] = char(0xC0 | (cpt >> 6));
    out[1] = char(0x80 | (cpt & 0x3F));
    return 2;
  }
  if (cpt < 0x10000) {
    out[0] = char(0xE0 | (cpt >> 12));
    out[1] = char(0x80 | ((cpt >> 6) & 0x3F));
    out[2] = char(0x80 | (cpt & 0x3F));
    return 3;
  }
  out[0] = char(0xF0 | (cpt >> 18));
  out[1] = char(0x80 | ((cpt >> 12) & 0x3F));
  out[2] = char(0x80 | ((cpt >> 6) & 0x3F));
  out[3] = char(0x80 | (cpt & 0x3F));
  return 4;
}

void append_utf8(std::string& out, uint32_t cpt) {
  char buf[4];
  out.append(buf, encode_utf8(cpt, buf));
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t off = 0;
  while (off < s.size()) {
    const size_t start = off;
    if (decode_utf8_at(s, &off)) {
      out.append(s.substr(start, off - start));
    } else {
      append_utf8(out, kReplacementChar);
      off = start + 1;
    }
  }
  return out;
}

std::string replace_ill_formed_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b = uint8_t(s[i]);
    if (b < 0x80) {
      out += char(b);
      ++i;
      continue;
    }
    // Table 3-7 of the Unicode Standard: the sequence's length and its second byte's range; the
    // bytes after the second are 80..BF.
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b == 0xE0) len = 3, lo = 0xA0;
    else if (b == 0xED) len = 3, hi = 0x9F;
    else if (b >= 0xE1 && b <= 0xEF) len = 3;
    else if (b == 0xF0) len = 4, lo = 0x90;
    else if (b == 0xF4) len = 4, hi = 0x8F;
    else if (b >= 0xF1 && b <= 0xF3) len = 4;
    size_t k = 1;  // bytes of the sequence that fit so far
    while (len > 0 && k < len && i + k < s.size()) {
      const auto c = uint8_t(s[i + k]);
      if (k == 1 ? (c < lo || c > hi) : (c & 0xC0) != 0x80) break;
      ++k;
    }
    if (len > 0 && k == len) {
      out.append(s.substr(i, len));
    } else {
      append_utf8(out, kReplacementChar);  // one for the lead and the continuation bytes that fit
    }
    i += k;
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  // Find the last lead byte among the final 3 bytes; hold it back if its sequence needs more
  // bytes than are there. Whatever else is invalid counts as complete (flush turns it to U+FFFD).
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = uint8_t(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;
    size_t need = 1;
    if ((b & 0xE0) == 0xC0) need = 2;
    else if ((b & 0xF0) == 0xE0) need = 3;
    else if ((b & 0xF8) == 0xF0) need = 4;
    return need > back ? n - back : n;
  }
  return n;
}

namespace {

struct Gpt2Tables {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 512> cpt_to_byte;  // every code point in the alphabet is < 512
};

const Gpt2Tables& gpt2_tables() {
  static const Gpt2Tables t = [] {
    Gpt2Tables t;
    t.cpt_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cpt = printable(b) ? uint32_t(b) : uint32_t(256 + n++);
      append_utf8(t.byte_to_utf8[b], cpt);
      t.cpt_to_byte[cpt] = int16_t(b);
    }
    return t;
  }();
  return t;
}

}  // namespace

const std::string& gpt2_byte_to_utf8(uint8_t byte) { return gpt2_tables().byte_to_utf8[byte]; }

int gpt2_cpt_to_byte(uint32_t cpt) { return cpt < 512 ? gpt2_tables().cpt_to_byte[cpt] : -1; }

std::string gpt2_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += gpt2_byte_to_utf8(uint8_t(c));
  return out;
}

std::string gpt2_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t off = 0;
  while (off < text.size()) {
    const size_t start = off;
    auto c = decode_utf8_at(text, &off);
    if (!c) {
      out.push_back(text[start]);
      off = start + 1;
      continue;
    }
    const int b = gpt2_cpt_to_byte(*c);
    if (b >= 0) {
      out.push_back(char(b));
    } else {
      out.append(text.substr(start, off - start));
    }
  }
  return out;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = from.empty() ? std::string_view::npos : s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

}  // namespace shoal::tok
