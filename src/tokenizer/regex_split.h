// Pre-tokenizer regex splitting with PCRE2 (UTF, UCP, JIT), applied the way llama.cpp's
// `unicode_regex_split` applies its list of regexes: each regex runs over every piece left by the
// previous one, and both its matches and the unmatched gaps between them become pieces.
//
// Character classes follow llama.cpp, not PCRE2's defaults: `\s` is Unicode White_Space
// (llama.cpp's `unicode_set_whitespace`), while `\d` and `\w` stay ASCII (std::regex semantics);
// `$` matches only at the very end of a piece.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace shoal::tok {

/// A compiled list of regexes. Thread-safe for concurrent split() calls.
class RegexSplitter {
 public:
  /// Compiles every pattern (llama.cpp / Hugging Face syntax). Errors: kInvalidArgument naming
  /// the pattern and PCRE2's message.
  static Result<std::unique_ptr<RegexSplitter>> compile(const std::vector<std::string>& patterns);
  ~RegexSplitter();

  /// Splits valid UTF-8 `text` into pieces (views into `text`, in order, covering it exactly).
  /// With no regexes the whole text is one piece; empty text gives no pieces.
  std::vector<std::string_view> split(std::string_view text) const;

  size_t size() const { return codes_.size(); }

 private:
  RegexSplitter() = default;
  std::vector<void*> codes_;  // pcre2_code_8*, owned
};

/// Rewrites one llama.cpp-style pattern into PCRE2 syntax with llama.cpp's class semantics
/// (see the file comment). Exposed for tests.
std::string translate_pattern(std::string_view pattern);

}  // namespace shoal::tok
