// Hugging Face tokenizer.json and vocab.json + merges.txt -> Vocab (BPE).
// Reference: huggingface/tokenizers (models/bpe, pre_tokenizers, normalizers, processors).
#include <algorithm>

#include "core/log.h"
#include "tokenizer/hf_common.h"
#include "tokenizer/json_stream.h"
#include "tokenizer/loaders.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace shoal::tok {

using nlohmann::json;

namespace {

constexpr int64_t kMaxVocab = 16 * 1024 * 1024;
constexpr int64_t kMaxVocabHoles = 65536;  // unused ids a vocab may leave

// model.vocab / vocab.json entries -> tokens (ids may leave holes; those stay empty).
Status load_vocab(Vocab& v, const std::vector<std::pair<std::string, int64_t>>& vocab, std::string_view source) {
  int64_t max_id = -1;
  for (const auto& [text, id] : vocab) {
    if (id < 0 || id >= kMaxVocab) {
      return make_error(Code::kCorrupt, "{}: vocab entry '{}' has id {} (allowed 0..{})", source, text, id,
                        kMaxVocab - 1);
    }
    max_id = std::max(max_id, id);
  }
  // Ids are dense in real files; a few entries claiming huge ids would make a tiny file allocate
  // (and scan) millions of empty tokens.
  if (max_id >= int64_t(vocab.size()) + kMaxVocabHoles) {
    return make_error(Code::kCorrupt, "{}: vocab ids reach {} for only {} entries (more than {} ids unused)", source,
                      max_id, vocab.size(), kMaxVocabHoles);
  }
  v.tokens.assign(size_t(max_id + 1), TokenData{"", 0.0f, kAttrUnused});
  for (const auto& [text, id] : vocab) {
    TokenData& t = v.tokens[size_t(id)];
    if (!t.text.empty()) {
      return make_error(Code::kCorrupt, "{}: vocab id {} is given to both '{}' and '{}'", source, id, t.text, text);
    }
    t = TokenData{text, 0.0f, kAttrNormal};
  }
  return Status::Ok();
}

// Translates one pre_tokenizer node into regexes / flags.
Status apply_pre_tokenizer(Vocab& v, const json& pt, std::string_view source) {
  if (pt.is_null()) return Status::Ok();
  const std::string type = json_string(pt, "type");
  if (type == "Sequence") {
    auto it = pt.find("pretokenizers");
    if (it == pt.end() || !it->is_array()) {
      return make_error(Code::kCorrupt, "{}: pre_tokenizer Sequence without a pretokenizers list", source);
    }
    for (const auto& p : *it) SHOAL_RETURN_IF_ERROR(apply_pre_tokenizer(v, p, source));
  } else if (type == "ByteLevel") {
    v.byte_encode = true;
    if (json_bool(pt, "add_prefix_space", false)) {
      return make_error(Code::kUnsupported, "{}: ByteLevel add_prefix_space=true is not supported", source);
    }
    if (json_bool(pt, "use_regex", true)) v.regexes.emplace_back(kGpt2Regex);
  } else if (type == "Split") {
    const json& pat = json_member(pt, "pattern");
    std::string rx = json_string(pat, "Regex");
    if (rx.empty()) {
      const std::string lit = json_string(pat, "String");
      if (lit.empty()) return make_error(Code::kCorrupt, "{}: Split pre-tokenizer without a pattern", source);
      rx = "\\Q" + lit + "\\E";
    }
    if (json_string(pt, "behavior") != "Isolated" || json_bool(pt, "invert", false)) {
      return make_error(Code::kUnsupported, "{}: Split pre-tokenizer behavior '{}' (invert {}) is not supported",
                        source, json_string(pt, "behavior"), json_bool(pt, "invert", false));
    }
    v.regexes.push_back(rx);
  } else if (type == "Digits") {
    v.regexes.emplace_back(json_bool(pt, "individual_digits", false) ? "\\p{N}" : "\\p{N}+");
  } else if (type == "Metaspace") {
    v.byte_encode = false;
    v.escape_whitespace = true;
    v.add_space_prefix = json_string(pt, "prepend_scheme", "always") != "never";
    if (json_bool(pt, "split", false)) v.regexes.emplace_back("\xE2\x96\x81[^\xE2\x96\x81]*|[^\xE2\x96\x81]+");
  } else {
    return make_error(Code::kUnsupported, "{}: pre_tokenizer type '{}' is not supported", source, type);
  }
  return Status::Ok();
}

// Normalizers that only spell spaces as U+2581 (SentencePiece-style BPE) are understood; NFC and
// similar Unicode normalisations are not applied (llama.cpp does not apply them either).
Status apply_normalizer(Vocab& v, const json& n, std::string_view source) {
  if (n.is_null()) return Status::Ok();
  const std::string type = json_string(n, "type");
  if (type == "Sequence") {
    auto it = n.find("normalizers");
    if (it == n.end() || !it->is_array()) return Status::Ok();
    for (const auto& x : *it) SHOAL_RETURN_IF_ERROR(apply_normalizer(v, x, source));
  } else if (type == "Prepend" && json_string(n, "prepend") == kSpmSpace) {
    v.add_space_prefix = true;
  } else if (type == "Replace" && json_string(json_member(n, "pattern"), "String") == " " &&
             json_string(n, "content") == kSpmSpace) {
    v.byte_encode = false;
    v.escape_whitespace = true;
  } else if (type == "NFC" || type == "NFKC" || type == "NFD" || type == "NFKD") {
    // not applied: see above
  } else {
    return make_error(Code::kUnsupported, "{}: normalizer type '{}' is not supported", source, type);
  }
  return Status::Ok();
}

// TemplateProcessing: a special token before $A adds BOS, one after it adds EOS; Roberta/Bert
// processing add their cls and sep tokens the same way.
void apply_post_processor(Vocab& v, const json& pp) {
  if (!pp.is_object()) return;
  const json& procs = json_member(pp, "processors");
  if (json_string(pp, "type") == "Sequence" && procs.is_array()) {
    for (const auto& p : procs) apply_post_processor(v, p);
    return;
  }
  if (json_string(pp, "type") == "RobertaProcessing" || json_string(pp, "type") == "BertProcessing") {
    // "cls": ["<s>", 0], "sep": ["</s>", 2]: <s> $A </s>
    const json& cls = json_member(pp, "cls");
    const json& sep = json_member(pp, "sep");
    if (cls.is_array() && !cls.empty() && cls[0].is_string()) {
      if (int32_t id = v.find(cls[0].get<std::string>()); id >= 0) v.bos = id, v.add_bos = true;
    }
    if (sep.is_array() && !sep.empty() && sep[0].is_string()) {
      if (int32_t id = v.find(sep[0].get<std::string>()); id >= 0) v.eos = id, v.add_eos = true;
    }
    return;
  }
  const json& single = json_member(pp, "single");
  if (json_string(pp, "type") != "TemplateProcessing" || !single.is_array()) return;
  bool seen_a = false;
  for (const auto& piece : single) {
    if (!piece.is_object()) continue;
    if (piece.contains("Sequence")) {
      seen_a = true;
    } else if (piece.contains("SpecialToken")) {
      const int32_t id = v.find(json_string(json_member(piece, "SpecialToken"), "id"));
      if (id < 0) continue;
      if (!seen_a) v.bos = id, v.add_bos = true;
      else v.eos = id, v.add_eos = true;
    }
  }
}

Status add_merges(Vocab& v, const std::vector<std::pair<std::string, std::string>>& merges,
                  std::string_view source) {
  v.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    auto added = add_merge(v, merges[i].first, merges[i].second, int32_t(i), false);
    if (!added.ok()) return added.status().with_context(source);
  }
  return Status::Ok();
}

}  // namespace

Result<Vocab> vocab_from_tokenizer_json(std::string_view json_text, const json& config,
                                        std::string_view source) {
  SHOAL_ASSIGN_OR_RETURN(TokenizerJson tj,
                         parse_tokenizer_json(json_text, {"model", "vocab"}, {"model", "merges"}, source));
  const json& j = tj.doc;
  const json& model = json_member(j, "model");
  if (!model.is_object()) return make_error(Code::kCorrupt, "{}: no \"model\" object", source);
  const std::string mtype = json_string(model, "type", "BPE");  // (before the vocab: Unigram's is a list)
  if (mtype != "BPE") {
    return make_error(Code::kUnsupported, "{}: tokenizer model type '{}' is not supported (BPE only)", source,
                      escape_unprintable(mtype));
  }
  if (!tj.has_vocab) return make_error(Code::kCorrupt, "{}: model.vocab is missing or not an object", source);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!json_string(model, key).empty()) {
      return make_error(Code::kUnsupported, "{}: BPE with {} '{}' is not supported", source, key,
                        json_string(model, key));
    }
  }
  Vocab v;
  v.type = VocabType::kBpe;
  v.model = "hf-bpe";
  v.byte_encode = false;
  SHOAL_RETURN_IF_ERROR(load_vocab(v, tj.vocab, source));
  v.ignore_merges = json_bool(model, "ignore_merges", false);
  const bool byte_fallback = json_bool(model, "byte_fallback", false);
  if (const json& added = json_member(j, "added_tokens"); added.is_array()) {
    for (const auto& t : added) {
      const json& id = json_member(t, "id");
      if (!id.is_number_integer()) {
        return make_error(Code::kCorrupt, "{}: an added_tokens entry has no integer id", source);
      }
      SHOAL_RETURN_IF_ERROR(put_added_token(v, id.get<int64_t>(), json_string(t, "content"),
                                            json_bool(t, "special", false), json_bool(t, "lstrip", false),
                                            json_bool(t, "rstrip", false), source));
    }
  }
  SHOAL_RETURN_IF_ERROR(add_config_tokens(v, config, source));
  SHOAL_RETURN_IF_ERROR(apply_normalizer(v, json_member(j, "normalizer"), source));
  SHOAL_RETURN_IF_ERROR(apply_pre_tokenizer(v, json_member(j, "pre_tokenizer"), source));
  if (!v.byte_encode && !v.escape_whitespace) {
    return make_error(Code::kUnsupported, "{}: BPE without ByteLevel or Metaspace-style spaces is not supported",
                      source);
  }
  v.pre = v.byte_encode ? "byte-level" : "metaspace";
  SHOAL_RETURN_IF_ERROR(index_tokens(v, source));
  if (byte_fallback) {
    for (auto& t : v.tokens) {
      if ((t.attr & kAttrNormal) && t.text.size() == 6 && t.text.compare(0, 3, "<0x") == 0) t.attr = kAttrByte;
    }
  }
  if (!tj.has_merges && !json_member(model, "merges").is_null()) {
    return make_error(Code::kCorrupt, "{}: model.merges is not a list", source);
  }
  SHOAL_RETURN_IF_ERROR(add_merges(v, tj.merges, source));
  apply_post_processor(v, json_member(j, "post_processor"));
  apply_config_specials(v, config);
  derive_specials(v);
  return v;
}

Result<Vocab> vocab_from_vocab_merges(std::string_view vocab_json, std::string_view merges_txt,
                                      const json& config, std::string_view source) {
  const std::string vocab_src = std::string(source) + "/vocab.json";
  SHOAL_ASSIGN_OR_RETURN(auto entries, parse_flat_vocab(vocab_json, vocab_src));
  Vocab v;
  v.type = VocabType::kBpe;
  v.model = "gpt2";
  SHOAL_RETURN_IF_ERROR(load_vocab(v, entries, vocab_src));
  SHOAL_RETURN_IF_ERROR(add_config_tokens(v, config, std::string(source) + "/tokenizer_config.json"));
  const std::string cls = json_string(config, "tokenizer_class");
  v.pre = cls.rfind("Qwen2", 0) == 0 ? "qwen2" : "gpt-2";
  SHOAL_ASSIGN_OR_RETURN(PreTokenizerSpec spec, find_pre_tokenizer(v.pre));
  v.regexes = spec.regexes;
  SHOAL_RETURN_IF_ERROR(index_tokens(v, source));

  const std::string merges_src = std::string(source) + "/merges.txt";
  v.merges.reserve(size_t(std::count(merges_txt.begin(), merges_txt.end(), '\n')) + 1);
  size_t line_no = 0, pos = 0;
  int32_t rank = 0;
  while (pos < merges_txt.size()) {
    size_t eol = merges_txt.find('\n', pos);
    if (eol == std::string_view::npos) eol = merges_txt.size();
    std::string_view line = merges_txt.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ', 1);
    if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos) {
      return make_error(Code::kCorrupt, "{}: line {} is not two tokens separated by one space", merges_src,
                        line_no);
    }
    auto added = add_merge(v, line.substr(0, sp), line.substr(sp + 1), rank++, false);
    if (!added.ok()) return added.status().with_context(fmt::format("{} line {}", merges_src, line_no));
  }
  apply_config_specials(v, config);
  derive_specials(v);
  return v;
}

}  // namespace shoal::tok
