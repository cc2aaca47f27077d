// Pieces shared by the Hugging Face loaders (tokenizer.json, vocab.json + merges.txt,
// SentencePiece and tiktoken files that come with a tokenizer_config.json).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/vocab.h"

namespace shoal::tok {

/// Parses JSON text (parse_json_doc: nesting bounded). Errors: kCorrupt with `source` and the
/// parser's message (byte position), or the nesting bound.
Result<nlohmann::json> parse_json(std::string_view text, std::string_view source);

/// obj[key] if `obj` is an object with that key, else a null value (never throws, never copies).
const nlohmann::json& json_member(const nlohmann::json& obj, const char* key);

/// obj[key] if obj is an object holding a boolean / string there, else `def` (never throws).
bool json_bool(const nlohmann::json& obj, const char* key, bool def);
std::string json_string(const nlohmann::json& obj, const char* key, std::string def = {});

/// A token name as tokenizer_config.json writes it: a string, or an object with "content".
std::string hf_token_name(const nlohmann::json& j);

/// Adds or updates an added token at `id` (growing the vocabulary with empty slots if needed):
/// special -> control, otherwise user-defined; lstrip / rstrip become attributes.
/// Errors: kCorrupt for a negative or absurd id.
Status put_added_token(Vocab& v, int64_t id, std::string content, bool special, bool lstrip,
                       bool rstrip, std::string_view source);

/// Adds tokenizer_config.json's added_tokens_decoder ({"<id>": {"content": ...}}) to `v`.
Status add_config_tokens(Vocab& v, const nlohmann::json& config, std::string_view source);

/// Applies tokenizer_config.json after index_tokens(): add_bos_token / add_eos_token,
/// chat_template and, with `resolve_names`, the bos/eos/unk/pad token names (a name that is null
/// or not an added token changes nothing). Null config: nothing.
void apply_config_specials(Vocab& v, const nlohmann::json& config, bool resolve_names = true);

/// Applies an HF model's config.json / generation_config.json after derive_specials():
/// eos_token_id (an id or a list) ends generation too; bos_token_id / eos_token_id set the ids
/// when `override_ids` or when the tokenizer files left them unset. This is the order llama.cpp's
/// converter (gguf-py SpecialVocab) takes them in.
void apply_model_config(Vocab& v, const nlohmann::json& config, bool override_ids);

}  // namespace shoal::tok
