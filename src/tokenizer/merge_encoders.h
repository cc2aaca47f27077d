// The two merge algorithms that turn one text fragment into ids.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace shoal::tok {

/// SentencePiece-style BPE (llama.cpp `llm_tokenizer_spm_session`): start from UTF-8 characters,
/// repeatedly merge the adjacent pair whose concatenation is the token with the highest score
/// (ties: leftmost), then emit each piece's id, or its bytes as <0xXX> tokens when it is no token.
/// `text` has its spaces already escaped to U+2581. Appends to `out`.
void spm_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out);

/// Byte-pair merging of one pre-tokenized word (llama.cpp `llm_tokenizer_bpe_session`): start from
/// its characters, repeatedly merge the adjacent pair with the lowest merge rank (ties: leftmost).
/// `word` is in the vocabulary's alphabet (GPT-2 byte-encoded when v.byte_encode). A piece that is
/// no token is emitted byte by byte (single-byte tokens, or <0xXX> without byte encoding).
/// With v.ignore_merges a word that is itself a token is emitted whole. Appends to `out`.
void bpe_encode_word(const Vocab& v, std::string_view word, std::vector<int32_t>& out);

/// WordPiece (llama.cpp `llm_tokenizer_wpm_session`): normalises (lowercase, strip accents as
/// v says), splits on whitespace, punctuation and CJK characters, then takes the longest token
/// that matches at each point of "▁" + word; a word with an unmatched rest becomes v.unk.
void wpm_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out);

}  // namespace shoal::tok
