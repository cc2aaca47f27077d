// Byte-level BPE pre-tokenizers by their llama.cpp name (`tokenizer.ggml.pre`): the regex list
// and the flags llama.cpp's `llama_vocab::impl::load` attaches to each name. Regexes are the
// ones llama.cpp uses (its std::regex-friendly rewrites of the Hugging Face originals).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace shoal::tok {

/// One pre-tokenizer: how text is cut into words before the BPE merges.
struct PreTokenizerSpec {
  std::string name;                  // canonical llama.cpp name ("qwen2", "llama3", ...)
  std::vector<std::string> regexes;  // applied in order (see RegexSplitter)
  bool ignore_merges = false;        // a word that is itself a token is taken whole
  std::optional<bool> add_bos;       // default for add_bos before tokenizer.ggml.add_bos_token
  bool no_bos = false;               // the model has no BOS token (chatglm)
};

/// The spec for a `tokenizer.ggml.pre` value; "" means llama.cpp's "default".
/// Errors: kUnsupported naming the pre-tokenizer.
Result<PreTokenizerSpec> find_pre_tokenizer(std::string_view name);

/// Regexes that Hugging Face's ByteLevel pre-tokenizer uses when use_regex is true (GPT-2's).
inline constexpr std::string_view kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/// Every name find_pre_tokenizer() accepts (for documentation and tests).
std::vector<std::string> supported_pre_tokenizers();

}  // namespace shoal::tok
