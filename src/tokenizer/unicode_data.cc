#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/unicode_data.h"

#include <pcre2.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "tokenizer/unicode.h"

namespace shoal::tok {
namespace {

#include "tokenizer/unicode_tables.inc"

constexpr uint32_t kMaxCpt = 0x110000;

// Marks every code point that `pattern` (a one-character class followed by '+') matches, by
// running it over one string holding every code point in order.
void mark_class(const std::string& all, const char* pattern, uint8_t flag, std::vector<uint8_t>& flags) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  SHOAL_CHECK(code != nullptr, "built-in class pattern {} does not compile", pattern);
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(all.data());
  size_t pos = 0;
  while (pos < all.size() &&
         pcre2_match(code, subj, all.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr) > 0) {
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t off = ov[0];
    while (off < ov[1]) {
      auto c = decode_utf8_at(all, &off);
      SHOAL_CHECK(c.has_value());
      flags[*c] |= flag;
    }
    pos = std::max<size_t>(ov[1], ov[0] + 1);
  }
  pcre2_match_data_free(md);
  pcre2_code_free(code);
}

std::vector<uint8_t> build_flags() {
  std::vector<uint8_t> flags(kMaxCpt, 0);
  std::string all(4 * kMaxCpt, '\0');
  size_t n = 0;
  for (uint32_t c = 0; c < kMaxCpt; ++c) {
    if (c < 0xD800 || c > 0xDFFF) n += encode_utf8(c, all.data() + n);
  }
  all.resize(n);
  mark_class(all, "\\p{N}+", kCptNumber, flags);
  mark_class(all, "\\p{L}+", kCptLetter, flags);
  mark_class(all, "\\p{Z}+", kCptSeparator, flags);
  mark_class(all, "\\p{M}+", kCptMark, flags);
  mark_class(all, "\\p{P}+", kCptPunctuation, flags);
  mark_class(all, "\\p{S}+", kCptSymbol, flags);
  mark_class(all, "[\\p{Cc}\\p{Cf}\\p{Co}]+", kCptControl, flags);
  for (uint32_t c : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2028u, 0x2029u,
                     0x202Fu, 0x205Fu, 0x3000u}) {
    flags[c] |= kCptWhitespace;
  }
  for (uint32_t c = 0x2000; c <= 0x200A; ++c) flags[c] |= kCptWhitespace;
  return flags;
}

struct Range {
  uint32_t first, last, stride;
  int64_t value;  // lowercase: delta; nfd: base code point
};

// Parses "FIRST-LAST/STRIDE:VALUE" (or "FIRST-LAST:VALUE") entries separated by white space.
std::vector<Range> parse_ranges(std::string_view table) {
  std::vector<Range> out;
  const char* p = table.data();
  const char* end = p + table.size();
  while (p < end) {
    while (p < end && (*p == ' ' || *p == '\n')) ++p;
    if (p >= end) break;
    char* q = nullptr;
    Range r{};
    r.first = uint32_t(std::strtoul(p, &q, 16));
    r.last = uint32_t(std::strtoul(q + 1, &q, 16));
    r.stride = 1;
    if (*q == '/') r.stride = uint32_t(std::strtoul(q + 1, &q, 16));
    r.value = std::strtoll(q + 1, &q, 16);
    out.push_back(r);
    p = q;
  }
  return out;
}

const Range* find_range(const std::vector<Range>& ranges, uint32_t cpt) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cpt,
                             [](uint32_t c, const Range& r) { return c < r.first; });
  if (it == ranges.begin()) return nullptr;
  --it;
  if (cpt > it->last || (cpt - it->first) % it->stride != 0) return nullptr;
  return &*it;
}

}  // namespace

uint8_t cpt_flags(uint32_t cpt) {
  static const std::vector<uint8_t> flags = build_flags();
  return cpt < kMaxCpt ? flags[cpt] : 0;
}

uint32_t cpt_to_lower(uint32_t cpt) {
  static const std::vector<Range> ranges = parse_ranges(kLowercaseRanges);
  const Range* r = find_range(ranges, cpt);
  return r ? uint32_t(int64_t(cpt) + r->value) : cpt;
}

uint32_t cpt_nfd_base(uint32_t cpt) {
  static const std::vector<Range> ranges = parse_ranges(kNfdBaseRanges);
  const Range* r = find_range(ranges, cpt);
  return r ? uint32_t(r->value) : cpt;
}

}  // namespace shoal::tok
