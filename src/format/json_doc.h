// JSON documents from outside (config.json, tokenizer_config.json, index files, safetensors
// headers), parsed with a bound on nesting: nlohmann's DOM copies and compares recursively, so a
// document nested 100k deep would overflow the stack later, wherever it is copied. Parsed through
// SAX in linear time (a parser callback would make json::parse quadratic in a container's
// children: nlohmann 3.11's callback DOM parser scans its parent at every object's end).
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace shoal {

/// How deep a JSON document from outside may nest (objects and arrays). Real model configs and
/// tokenizer files nest fewer than 10 levels.
inline constexpr int kJsonMaxDepth = 128;

struct JsonLimits {
  int max_depth = kJsonMaxDepth;  // containers within containers, the top level counting 1
  /// Called for each key of the top-level object as it is read: a non-empty return refuses the
  /// document with that message (e.g. a duplicate name).
  std::function<std::string(const std::string& key)> on_top_key;
};

/// Parses `text` (RFC 8259 JSON) into a DOM. Errors: kCorrupt, "<source>: invalid JSON: <the
/// parser's message, with the byte position>", "<source>: JSON nests deeper than <max_depth>
/// levels" or "<source>: <on_top_key's message>".
Result<nlohmann::json> parse_json_doc(std::string_view text, std::string_view source, const JsonLimits& limits = {});

}  // namespace shoal
