// JSON documents from outside (config.json, tokenizer_config.json, index files), parsed with a
// bound on nesting: nlohmann's DOM copies and compares recursively, so a document nested 100k
// deep would overflow the stack later, wherever it is copied.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace shoal {

/// How deep a JSON document from outside may nest (objects and arrays). Real model configs and
/// tokenizer files nest fewer than 10 levels.
inline constexpr int kJsonMaxDepth = 128;

/// Parses `text` (RFC 8259 JSON) into a DOM. Errors: kCorrupt, "<source>: invalid JSON: <the
/// parser's message, with the byte position>" or "<source>: JSON nests deeper than 128 levels".
Result<nlohmann::json> parse_json_doc(std::string_view text, std::string_view source);

}  // namespace shoal
