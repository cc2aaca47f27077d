// The Tokenizer behind every loader: a Vocab plus its compiled pre-tokenizer. encode() follows
// llama.cpp's `llama_vocab::impl::tokenize`: special-token text is split out first
// (`tokenizer_st_partition`), then each text fragment goes through the vocabulary's algorithm.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "tokenizer/regex_split.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace shoal::tok {

/// A run of the input: either a special token (token >= 0) or text still to tokenize.
struct Fragment {
  int32_t token = -1;
  std::string_view text;
};

class VocabTokenizer final : public Tokenizer {
 public:
  /// Takes a finalized Vocab. Errors: kInvalidArgument if a pre-tokenizer regex does not compile.
  static Result<std::unique_ptr<VocabTokenizer>> create(Vocab vocab);

  TokenizerKind kind() const override;
  std::string describe() const override;
  int32_t vocab_size() const override { return v_.n_tokens(); }
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override;
  std::string token_to_piece(int32_t id, bool special = false) const override;
  std::string token_text(int32_t id) const override;
  int32_t bos_id() const override { return v_.bos; }
  int32_t eos_id() const override { return v_.eos; }
  bool is_eog(int32_t id) const override { return v_.eog.count(id) > 0; }
  bool add_bos() const override { return v_.add_bos && v_.bos >= 0; }
  std::string chat_template() const override { return v_.chat_template; }

  const Vocab& vocab() const { return v_; }

  /// Splits `text` around special tokens (control and unknown ones only when parse_special;
  /// user-defined ones always), longest token text first, honouring lstrip/rstrip attributes.
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

 private:
  explicit VocabTokenizer(Vocab v) : v_(std::move(v)) {}
  void encode_bpe_fragment(std::string_view text, std::vector<int32_t>& out) const;

  Vocab v_;
  std::unique_ptr<RegexSplitter> splitter_;
};

}  // namespace shoal::tok
