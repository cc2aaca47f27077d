// Loaders: each tokenizer file form -> a finalized Vocab (see vocab.h).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "format/metadata.h"
#include "tokenizer/vocab.h"

namespace shoal::tok {

/// From GGUF `tokenizer.ggml.*` metadata (llama.cpp `llama_vocab::impl::load`): model "llama"
/// (SentencePiece), "gpt2" (byte-level BPE, pre-tokenizer from tokenizer.ggml.pre) or "bert"
/// (WordPiece). Errors: kNotFound (no tokenizer.ggml.model / tokens), kUnsupported (other models,
/// unknown pre-tokenizer), kCorrupt (wrong value types, short score/type arrays, duplicates).
Result<Vocab> vocab_from_gguf(const Metadata& md, std::string_view source);

/// From a Hugging Face tokenizer.json (model type BPE: vocab + merges as "a b" strings or [a, b]
/// pairs, added_tokens, pre_tokenizer ByteLevel / Split / Sequence / Digits, optional Metaspace-
/// style normalizer with byte_fallback). `config` is tokenizer_config.json (or null): BOS/EOS
/// names, add_bos_token / add_eos_token, chat_template.
/// Errors: kCorrupt (malformed JSON, merges naming unknown tokens), kUnsupported (other models).
Result<Vocab> vocab_from_tokenizer_json(std::string_view json_text, const nlohmann::json& config,
                                        std::string_view source);

/// From GPT-2-style vocab.json + merges.txt (+ tokenizer_config.json for added tokens, BOS/EOS
/// and chat template). The pre-tokenizer follows tokenizer_class: Qwen2Tokenizer -> "qwen2",
/// otherwise "gpt-2". Errors: kCorrupt naming the file and line.
Result<Vocab> vocab_from_vocab_merges(std::string_view vocab_json, std::string_view merges_txt,
                                      const nlohmann::json& config, std::string_view source);

/// From a tiktoken BPE file: lines "<base64 token bytes> <rank>", rank = id. A 128,000-line file
/// is Meta Llama 3's: its 256 special tokens (ids 128000-128255, named by Meta's reference code)
/// are added and the pre-tokenizer is "llama3". Errors: kCorrupt (bad base64, bad or duplicate
/// rank, naming the line), kUnsupported (other tiktoken vocabularies).
Result<Vocab> vocab_from_tiktoken(std::string_view text, std::string_view source);

/// From a SentencePiece model protobuf (tokenizer.model of Llama 2, Phi-3, Gemma): pieces with
/// score and type, add_dummy_prefix, BOS/EOS/UNK ids from the trainer spec; from `config` the
/// added tokens, add_bos_token / add_eos_token and the chat template (not token names: as in
/// llama.cpp's converter, config.json ids take precedence for SentencePiece folders).
/// Errors: kCorrupt naming the byte offset, kUnsupported for unigram models.
Result<Vocab> vocab_from_sentencepiece(std::string_view bytes, const nlohmann::json& config,
                                       std::string_view source);

}  // namespace shoal::tok
