// The vocabulary every tokenizer form is loaded into: tokens with score and attributes, merges,
// special ids and the flags that steer encoding. Mirrors the state of llama.cpp's
// `llama_vocab::impl` (src/llama-vocab.cpp), so GGUF, tokenizer.json, vocab.json + merges.txt and
// tiktoken files all run through one implementation.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "tokenizer/flat_tables.h"

namespace shoal::tok {

/// Token attributes (llama.cpp llama_token_attr bits).
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrNormalized = 1u << 6,
  kAttrLstrip = 1u << 7,
  kAttrRstrip = 1u << 8,
};

/// GGUF `tokenizer.ggml.token_type` values (llama_token_type) -> attribute.
uint32_t attr_from_gguf_type(int64_t type);

/// Which algorithm turns a text fragment into ids.
enum class VocabType {
  kSpm,  // SentencePiece BPE over scores with byte fallback ("llama")
  kBpe,  // BPE over merge ranks after a pre-tokenizer regex ("gpt2"; tiktoken; tokenizer.json)
  kWpm,  // WordPiece, greedy longest match ("bert")
};

struct TokenData {
  std::string text;  // as stored (GPT-2 alphabet for byte-level BPE, U+2581 for spaces in SPM)
  float score = 0.0f;
  uint32_t attr = kAttrNormal;
};

struct Vocab {
  VocabType type = VocabType::kSpm;
  std::string model;  // "llama", "gpt2", "bert", "tiktoken", "hf-bpe"...
  std::string pre;    // pre-tokenizer name (BPE)
  std::vector<TokenData> tokens;

  // BPE
  std::vector<std::string> regexes;  // pre-tokenizer
  bool ignore_merges = false;
  bool byte_encode = true;  // false: BPE over raw UTF-8 with <0xXX> byte fallback (SPM-style)
  MergeTable merges;
  // tiktoken: no merge table; a pair's rank is the id of the token it concatenates to (ids are
  // ranks), which is the same as a table holding every split of every token.
  bool rank_by_concat = false;

  // Special ids (-1: none) and encoding flags.
  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1, mask = -1;
  bool add_bos = false, add_eos = false, add_sep = false;
  bool add_space_prefix = false;  // SPM: a space before the first text fragment
  bool escape_whitespace = false; // spaces -> U+2581 before BPE (SPM-style BPE)
  bool lowercase = false;         // WPM normalizer
  bool strip_accents = false;     // WPM normalizer
  std::string chat_template;

  // Built by finalize().
  TextIndex text_to_id;  // over tokens[i].text
  std::unordered_set<int32_t> eog;
  std::vector<int32_t> special_cache;   // control/user-defined/unknown ids, longest text first
  std::array<int32_t, 256> byte_ids{};  // SPM/byte fallback: id of <0xXX> (or the byte itself)
  size_t max_token_len = 0;

  int32_t n_tokens() const { return int32_t(tokens.size()); }
  bool valid_id(int64_t id) const { return id >= 0 && id < int64_t(tokens.size()); }
  /// Id of a token's exact text, -1 if absent.
  int32_t find(std::string_view text) const;
};

/// Adds merge `left right` with `rank`. Errors (kCorrupt) when a side or the concatenation is not
/// a token, unless `lenient` (GGUF files, as llama.cpp accepts them): then the merge is skipped
/// and false returned. Call after index_tokens().
Result<bool> add_merge(Vocab& v, std::string_view left, std::string_view right, int32_t rank,
                       bool lenient);

/// Builds text_to_id and max_token_len: empty texts become "[EMPTY_<id>]" (as llama.cpp does),
/// duplicate texts are an error (kCorrupt). `source` names the file in error messages.
Status index_tokens(Vocab& v, std::string_view source);

/// Derives what llama.cpp derives at load time, after index_tokens() and the special ids are set:
/// out-of-range special ids are dropped, EOT/EOM and end-of-generation tokens are detected by
/// text and forced to control, control tokens named "unused" become unused, the special-token
/// cache is sorted longest first, byte-fallback ids are looked up.
void derive_specials(Vocab& v);

/// index_tokens() then derive_specials().
Status finalize(Vocab& v, std::string_view source);

}  // namespace shoal::tok
