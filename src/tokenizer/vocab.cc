#include "tokenizer/vocab.h"

#include <algorithm>

#include "core/log.h"

namespace shoal::tok {
namespace {

// Texts llama.cpp (llama_vocab::impl::load) recognises as end-of-turn / end-of-generation.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    "<end_of_utterance>"};
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "[e~["};
// Fill-in-the-middle pad / repo / file-separator tokens: llama.cpp ends generation on them too.
constexpr std::string_view kFimEogTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<|fim_repo|>",
                                             "<|repo_name|>", "<fim-repo>", "<reponame>",
                                             "<|file_sep|>"};

// Every listed text starts with one of these bytes; the check skips almost all tokens cheaply.
bool maybe_listed(std::string_view s) { return !s.empty() && (s[0] == '<' || s[0] == '[' || s[0] == '_'); }

template <size_t N>
bool in_list(std::string_view s, const std::string_view (&list)[N]) {
  return maybe_listed(s) && std::find(std::begin(list), std::end(list), s) != std::end(list);
}

}  // namespace

uint32_t attr_from_gguf_type(int64_t type) {
  switch (type) {
    case 1: return kAttrNormal;
    case 2: return kAttrUnknown;
    case 3: return kAttrControl;
    case 4: return kAttrUserDefined;
    case 5: return kAttrUnused;
    case 6: return kAttrByte;
    default: return kAttrUndefined;
  }
}

int32_t Vocab::find(std::string_view text) const {
  return text_to_id.find(text);
}

Result<bool> add_merge(Vocab& v, std::string_view left, std::string_view right, int32_t rank,
                       bool lenient) {
  const int32_t l = v.find(left), r = v.find(right);
  std::string joined;
  joined.reserve(left.size() + right.size());
  joined.append(left).append(right);
  const int32_t m = v.find(joined);
  if (l < 0 || r < 0 || m < 0) {
    if (lenient) return false;
    const std::string_view missing = l < 0 ? left : r < 0 ? right : std::string_view(joined);
    return make_error(Code::kCorrupt, "merge {} '{} {}' names '{}', which is not in the vocabulary",
                      rank, left, right, missing);
  }
  // The first (lowest-rank) occurrence of a pair wins, as in llama.cpp's map emplace.
  v.merges.insert(l, r, MergeInfo{rank, m});
  return true;
}

Status index_tokens(Vocab& v, std::string_view source) {
  if (v.tokens.empty()) return make_error(Code::kCorrupt, "{}: the vocabulary is empty", source);
  if (v.tokens.size() > size_t(INT32_MAX)) {
    return make_error(Code::kCorrupt, "{}: {} tokens is more than ids can hold", source, v.tokens.size());
  }
  v.max_token_len = 0;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    auto& t = v.tokens[i];
    if (t.text.empty()) t.text = "[EMPTY_" + std::to_string(i) + "]";
    v.max_token_len = std::max(v.max_token_len, t.text.size());
  }
  std::vector<std::string_view> texts(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) texts[i] = v.tokens[i].text;
  const int64_t dup = v.text_to_id.build(texts);
  if (dup >= 0) {
    return make_error(Code::kCorrupt, "{}: duplicate token '{}' (ids {} and {})", source, v.tokens[dup].text,
                      v.find(v.tokens[dup].text), dup);
  }
  return Status::Ok();
}

void derive_specials(Vocab& v) {
  for (int32_t* id : {&v.bos, &v.eos, &v.eot, &v.eom, &v.unk, &v.sep, &v.pad, &v.mask}) {
    if (!v.valid_id(*id)) *id = -1;
  }

  auto force_control = [&](int32_t id) { v.tokens[id].attr |= kAttrControl; };
  for (int32_t i = 0; i < v.n_tokens(); ++i) {
    const std::string_view text = v.tokens[i].text;
    if (v.eot < 0 && in_list(text, kEotTexts)) v.eot = i, force_control(i);
    if (v.eom < 0 && text == "<|eom_id|>") v.eom = i, force_control(i);
  }
  for (auto& t : v.tokens) {
    if ((t.attr & kAttrControl) && t.text.find("unused") != std::string::npos) t.attr |= kAttrUnused;
  }
  v.eog.clear();
  for (int32_t i = 0; i < v.n_tokens(); ++i) {
    const std::string_view text = v.tokens[i].text;
    if (in_list(text, kEogTexts) || in_list(text, kFimEogTexts)) v.eog.insert(i), force_control(i);
  }
  for (int32_t id : {v.eos, v.eot, v.eom}) {
    if (id >= 0) v.eog.insert(id);
  }

  v.special_cache.clear();
  for (int32_t i = 0; i < v.n_tokens(); ++i) {
    if (v.tokens[i].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) v.special_cache.push_back(i);
  }
  std::stable_sort(v.special_cache.begin(), v.special_cache.end(), [&](int32_t a, int32_t b) {
    return v.tokens[a].text.size() > v.tokens[b].text.size();
  });

  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char hex[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
    int32_t id = v.find(hex);
    if (id < 0 && v.type == VocabType::kSpm) id = v.find(std::string(1, char(b)));
    v.byte_ids[b] = id;
  }
}

Status finalize(Vocab& v, std::string_view source) {
  SHOAL_RETURN_IF_ERROR(index_tokens(v, source));
  derive_specials(v);
  return Status::Ok();
}

}  // namespace shoal::tok
