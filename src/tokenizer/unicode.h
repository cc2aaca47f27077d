// UTF-8 and GPT-2 byte-level helpers shared by the tokenizers. Behaviour follows llama.cpp's
// `unicode.cpp` where it matters for golden vectors: an invalid UTF-8 byte decodes to U+FFFD and
// consumes exactly one byte; the length of a sequence is taken from its lead byte alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::tok {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

/// Length in bytes of the UTF-8 sequence that starts with `lead` (1 for continuation bytes and
/// ASCII, 2/3/4 from the high bits; never 0). The caller clamps it to the bytes left.
size_t utf8_len(uint8_t lead);

/// Decodes one code point at `*offset` and advances it. Invalid or truncated sequences give
/// nullopt and leave `*offset` unchanged.
std::optional<uint32_t> decode_utf8_at(std::string_view s, size_t* offset);

/// All code points of `s`; every invalid byte becomes U+FFFD (one byte consumed).
std::vector<uint32_t> decode_utf8(std::string_view s);

/// Writes the UTF-8 form of `cpt` (cpt <= 0x10FFFF; larger values write U+FFFD) to out[0..4)
/// and returns its length.
size_t encode_utf8(uint32_t cpt, char* out);

/// Appends the UTF-8 form of `cpt` (cpt <= 0x10FFFF; larger values append U+FFFD).
void append_utf8(std::string& out, uint32_t cpt);

/// `s` with every invalid byte replaced by U+FFFD, so it is valid UTF-8.
std::string sanitize_utf8(std::string_view s);

/// `s` with each maximal ill-formed subpart replaced by one U+FFFD: the Unicode Standard's
/// practice (chapter 3.9, "U+FFFD Substitution of Maximal Subparts"; Python's errors="replace").
/// "\xF1\x93p" gives U+FFFD p, where sanitize_utf8 gives two. For text shown to users; the
/// tokenizers keep sanitize_utf8 (llama.cpp's one byte per U+FFFD, which golden vectors follow).
std::string replace_ill_formed_utf8(std::string_view s);

/// Number of leading bytes of `s` that form complete UTF-8 sequences; an incomplete but so far
/// valid sequence at the end is left out (used by StreamDecoder). Invalid bytes count as complete.
size_t utf8_complete_prefix(std::string_view s);

/// GPT-2's byte -> printable code point table (bytes_to_unicode() in openai/gpt-2 encoder.py):
/// the UTF-8 text of the code point standing for `byte`.
const std::string& gpt2_byte_to_utf8(uint8_t byte);

/// The inverse: the byte a GPT-2 alphabet code point stands for, or -1 if `cpt` is not in it.
int gpt2_cpt_to_byte(uint32_t cpt);

/// Byte-level encoding of raw bytes into GPT-2's alphabet (each byte -> one code point).
std::string gpt2_encode(std::string_view bytes);

/// Decodes GPT-2 alphabet text back to raw bytes. Code points outside the alphabet are copied
/// through unchanged (as their UTF-8).
std::string gpt2_decode(std::string_view text);

/// Replaces every occurrence of `from` in `s` by `to`.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to);

/// "\xE2\x96\x81", U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's escaped space.
inline constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

}  // namespace shoal::tok
