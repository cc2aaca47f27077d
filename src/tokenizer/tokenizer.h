// Text <-> token ids, exactly as the model's own tokenizer does it (llama.cpp `llama-vocab.cpp`
// and Hugging Face `tokenizers` are the references; tests use llama.cpp's golden vectors).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace shoal {

struct ModelFile;

enum class TokenizerKind {
  kSentencePiece,  // llama.cpp "llama": SPM-style BPE over scores with byte fallback
  kByteBpe,        // llama.cpp "gpt2": byte-level BPE with a pre-tokenizer regex
  kWordPiece,      // llama.cpp "bert": WordPiece, greedy longest match
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual TokenizerKind kind() const = 0;
  /// "gpt2/qwen2", "llama/spm"...
  virtual std::string describe() const = 0;
  virtual int32_t vocab_size() const = 0;

  /// Token ids of `text` (UTF-8). add_special: add BOS (and EOS) as the model's rules say
  /// (tokenizer.ggml.add_bos_token ...). parse_special: text like "<|im_start|>" becomes the
  /// special token; otherwise it is tokenized as plain text.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const = 0;
  /// The bytes one token stands for (may be part of a UTF-8 character). Special and control
  /// tokens render as their text only when `special` is true.
  virtual std::string token_to_piece(int32_t id, bool special = false) const = 0;
  /// The token's vocabulary string as stored (for `inspect`).
  virtual std::string token_text(int32_t id) const = 0;

  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual int32_t eos_id() const = 0;  // -1 if none
  /// End of generation: EOS, EOT, <|im_end|>, <|eot_id|>...
  virtual bool is_eog(int32_t id) const = 0;
  virtual bool add_bos() const = 0;
  /// The model's chat template (Jinja source from tokenizer.chat_template or
  /// tokenizer_config.json); empty if the files carry none.
  virtual std::string chat_template() const = 0;

  /// Concatenated pieces (SentencePiece: the leading space of the first piece is kept, as
  /// llama.cpp's token_to_piece does).
  std::string decode(const std::vector<int32_t>& ids, bool special = false) const;
};

/// Turns token pieces into text for streaming: holds back an incomplete UTF-8 sequence until
/// the token that completes it arrives.
class StreamDecoder {
 public:
  /// special: render control tokens as their text (token_to_piece's `special`).
  explicit StreamDecoder(const Tokenizer& tok, bool special = false) : tok_(tok), special_(special) {}
  /// Returns the text that is complete after adding this token (may be empty; ill-formed bytes
  /// as U+FFFD, one per maximal subpart: tok::replace_ill_formed_utf8).
  std::string push(int32_t id);
  /// Whatever is still held back (each maximal ill-formed subpart becomes one U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool special_ = false;
  std::string pending_;
};

/// The tokenizer stored in a model: GGUF `tokenizer.ggml.*` metadata, or tokenizer.json (and
/// tokenizer_config.json) beside an HF checkpoint. Errors: kNotFound, kUnsupported (naming the
/// tokenizer model / pre-tokenizer), kCorrupt.
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const ModelFile& model);

/// A tokenizer on its own: a vocab-only (or full) GGUF file, a folder with tokenizer.json, or
/// vocab.json + merges.txt, or a tiktoken tokenizer.model (Llama 3).
Result<std::unique_ptr<Tokenizer>> load_tokenizer_from_path(const std::string& path);

}  // namespace shoal
