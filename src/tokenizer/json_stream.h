// One-pass reading of tokenizer JSON files (nlohmann SAX). The two large parts, the vocabulary
// object {"text": id, ...} and the merges list, go straight into vectors instead of a DOM (a
// 150k-entry std::map is most of the cost of loading otherwise); the rest becomes a DOM.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace shoal::tok {

struct TokenizerJson {
  nlohmann::json doc;  // the document without the captured parts
  bool has_vocab = false;
  std::vector<std::pair<std::string, int64_t>> vocab;  // in file order
  bool has_merges = false;
  std::vector<std::pair<std::string, std::string>> merges;  // "a b" strings split at the space
};

/// Parses `text`, capturing the object at `vocab_path` (keys from the root; empty: the root
/// itself) and the array at `merges_path`. Errors (kCorrupt, naming `source`): invalid JSON with
/// the byte position, a vocabulary value that is not an integer, a merge that is neither "a b"
/// nor ["a", "b"].
Result<TokenizerJson> parse_tokenizer_json(std::string_view text, const std::vector<std::string>& vocab_path,
                                           const std::vector<std::string>& merges_path,
                                           std::string_view source);

}  // namespace shoal::tok
