#include "tokenizer/hf_common.h"

#include <cstdlib>

#include "format/json_doc.h"

namespace shoal::tok {

using nlohmann::json;

namespace {
// Token ids beyond this are not a vocabulary but a corrupt file (largest real vocabularies hold
// about 260k tokens).
constexpr int64_t kMaxTokenId = 16 * 1024 * 1024;
constexpr int64_t kMaxAddedGap = 65536;  // how far past the vocab an added token's id may lie
}  // namespace

Result<json> parse_json(std::string_view text, std::string_view source) {
  return parse_json_doc(text, source);
}

const json& json_member(const json& obj, const char* key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

bool json_bool(const json& obj, const char* key, bool def) {
  if (!obj.is_object()) return def;
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : def;
}

std::string json_string(const json& obj, const char* key, std::string def) {
  if (!obj.is_object()) return def;
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : def;
}

std::string hf_token_name(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object()) {
    auto it = j.find("content");
    if (it != j.end() && it->is_string()) return it->get<std::string>();
  }
  return {};
}

Status put_added_token(Vocab& v, int64_t id, std::string content, bool special, bool lstrip,
                       bool rstrip, std::string_view source) {
  if (id < 0 || id >= kMaxTokenId) {
    return make_error(Code::kCorrupt, "{}: added token '{}' has id {} (allowed 0..{})", source, content,
                      id, kMaxTokenId - 1);
  }
  if (content.empty()) return make_error(Code::kCorrupt, "{}: added token {} has empty content", source, id);
  if (id >= int64_t(v.tokens.size()) + kMaxAddedGap) {  // a tiny file must not allocate millions of ids
    return make_error(Code::kCorrupt, "{}: added token '{}' has id {}, more than {} past the vocab's {} tokens", source,
                      content, id, kMaxAddedGap, v.tokens.size());
  }
  if (size_t(id) >= v.tokens.size()) {
    v.tokens.resize(size_t(id) + 1, TokenData{"", 0.0f, kAttrUnused});
  }
  TokenData& t = v.tokens[size_t(id)];
  t.text = std::move(content);
  t.attr = (special ? kAttrControl : kAttrUserDefined) | (lstrip ? kAttrLstrip : 0u) |
           (rstrip ? kAttrRstrip : 0u);
  return Status::Ok();
}

Status add_config_tokens(Vocab& v, const json& config, std::string_view source) {
  if (!config.is_object()) return Status::Ok();
  auto it = config.find("added_tokens_decoder");
  if (it == config.end() || !it->is_object()) return Status::Ok();
  for (const auto& [key, tok] : it->items()) {
    char* end = nullptr;
    const long long id = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || !tok.is_object()) {
      return make_error(Code::kCorrupt, "{}: added_tokens_decoder entry '{}' is not \"<id>\": {{...}}",
                        source, key);
    }
    SHOAL_RETURN_IF_ERROR(put_added_token(v, id, hf_token_name(tok), json_bool(tok, "special", false),
                                          json_bool(tok, "lstrip", false), json_bool(tok, "rstrip", false),
                                          source));
  }
  return Status::Ok();
}

void apply_config_specials(Vocab& v, const json& config, bool resolve_names) {
  if (!config.is_object()) return;
  auto named = [&](const char* key, int32_t* id) {
    const int32_t found = v.find(hf_token_name(json_member(config, key)));
    if (found >= 0 && (v.tokens[found].attr & (kAttrControl | kAttrUserDefined))) *id = found;
  };
  if (resolve_names) {
    named("bos_token", &v.bos);
    named("eos_token", &v.eos);
    named("unk_token", &v.unk);
    named("pad_token", &v.pad);
  }
  v.add_bos = json_bool(config, "add_bos_token", v.add_bos);
  v.add_eos = json_bool(config, "add_eos_token", v.add_eos);
  if (auto it = config.find("chat_template"); it != config.end()) {
    if (it->is_string()) {
      v.chat_template = *it;
    } else if (it->is_array()) {  // [{"name": "default", "template": "..."}, ...]
      for (const auto& t : *it) {
        if (json_string(t, "name") == "default") v.chat_template = json_string(t, "template");
      }
    }
  }
}

void apply_model_config(Vocab& v, const json& config, bool override_ids) {
  if (!config.is_object()) return;
  auto valid = [&](const json& j) { return j.is_number_integer() && v.valid_id(j.get<int64_t>()); };
  const json& eos = json_member(config, "eos_token_id");
  for (const json& e : eos.is_array() ? eos : json::array({eos})) {
    if (valid(e)) v.eog.insert(int32_t(e.get<int64_t>()));
  }
  const json& first_eos = eos.is_array() && !eos.empty() ? eos[0] : eos;
  if ((override_ids || v.eos < 0) && valid(first_eos)) v.eos = int32_t(first_eos.get<int64_t>());
  const json& bos = json_member(config, "bos_token_id");
  if ((override_ids || v.bos < 0) && valid(bos)) v.bos = int32_t(bos.get<int64_t>());
}

}  // namespace shoal::tok
