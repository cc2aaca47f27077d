// Per-code-point Unicode data for WordPiece normalisation: general-category flags (taken from
// PCRE2's Unicode tables, so they agree with the pre-tokenizer regexes), simple lowercase and the
// first code point of the canonical decomposition (scripts/gen_unicode_tables.py).
#pragma once

#include <cstdint>

namespace shoal::tok {

/// Category flags of a code point (llama.cpp unicode_cpt_flags, minus "undefined").
enum CptFlag : uint8_t {
  kCptNumber = 1u << 0,       // \p{N}
  kCptLetter = 1u << 1,       // \p{L}
  kCptSeparator = 1u << 2,    // \p{Z}
  kCptMark = 1u << 3,         // \p{M} (llama.cpp "accent mark")
  kCptPunctuation = 1u << 4,  // \p{P}
  kCptSymbol = 1u << 5,       // \p{S}
  kCptControl = 1u << 6,      // \p{Cc} \p{Cf} \p{Co} (unassigned code points are not control)
  kCptWhitespace = 1u << 7,   // Unicode White_Space
};

/// Flags of `cpt`; 0 for unassigned code points and values past U+10FFFF. The table is built on
/// first use (a few milliseconds).
uint8_t cpt_flags(uint32_t cpt);

/// Simple (one-to-one) lowercase mapping; `cpt` itself if it has none.
uint32_t cpt_to_lower(uint32_t cpt);

/// First code point of the NFD form of `cpt` (the base letter of "é" is "e"); `cpt` if none.
uint32_t cpt_nfd_base(uint32_t cpt);

}  // namespace shoal::tok
