// GGUF tokenizer metadata -> Vocab, after llama.cpp's llama_vocab::impl::load.
#include <algorithm>
#include <cctype>

#include "core/log.h"
#include "tokenizer/loaders.h"
#include "tokenizer/pre_tokenizer.h"

namespace shoal::tok {
namespace {

// llama.cpp gives Phi-3 vocabularies (by general.name) right-stripping special tokens.
void apply_phi3_strip(Vocab& v, std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name.find("phi-3") == std::string::npos && name.find("phi3") == std::string::npos) return;
  for (int32_t id : v.special_cache) v.tokens[id].attr |= kAttrRstrip;
  if (int32_t id = v.find("</s>"); id >= 0) v.tokens[id].attr |= kAttrRstrip;
  for (const char* t : {"<unk>", "<s>", "<|endoftext|>"}) {
    if (int32_t id = v.find(t); id >= 0) v.tokens[id].attr &= ~kAttrRstrip;
  }
}

Status check_array(const Metadata& md, std::string_view key, bool present, std::string_view source) {
  if (md.find(key) && !present) {
    return make_error(Code::kCorrupt, "{}: {} has type {}, expected an array of the right element type",
                      source, key, meta_type_name(md.find(key)->type));
  }
  return Status::Ok();
}

}  // namespace

Result<Vocab> vocab_from_gguf(const Metadata& md, std::string_view source) {
  Vocab v;
  auto model = md.get_string("tokenizer.ggml.model");
  if (!model) return make_error(Code::kNotFound, "{}: no tokenizer (tokenizer.ggml.model is missing)", source);
  v.model = *model;
  v.pre = md.get_string("tokenizer.ggml.pre").value_or("");
  if (v.model == "llama") {
    v.type = VocabType::kSpm;
    v.bos = 1, v.eos = 2, v.unk = 0;
    v.add_space_prefix = true, v.add_bos = true;
  } else if (v.model == "gpt2") {
    v.type = VocabType::kBpe;
    v.bos = 11, v.eos = 11;  // llama.cpp's defaults for BPE vocabularies
    SHOAL_ASSIGN_OR_RETURN(PreTokenizerSpec spec, find_pre_tokenizer(v.pre));
    v.regexes = spec.regexes;
    v.ignore_merges = spec.ignore_merges;
    v.add_bos = spec.add_bos.value_or(false);
    if (spec.no_bos) v.bos = -1;
  } else if (v.model == "bert") {
    v.type = VocabType::kWpm;
    v.bos = 101, v.unk = 100, v.sep = 102, v.pad = 0, v.mask = 103;
    v.add_bos = true, v.add_sep = true;
    v.lowercase = md.get_bool("tokenizer.ggml.normalizer.lowercase").value_or(true);
    v.strip_accents = md.get_bool("tokenizer.ggml.normalizer.strip_accents").value_or(v.lowercase);
  } else {
    return make_error(Code::kUnsupported, "{}: unsupported tokenizer model '{}' (tokenizer.ggml.model)",
                      source, escape_unprintable(v.model));
  }
  // Only SentencePiece vocabularies prepend a space (llama.cpp's BPE path ignores the key).
  if (v.type == VocabType::kSpm) {
    v.add_space_prefix = md.get_bool("tokenizer.ggml.add_space_prefix").value_or(v.add_space_prefix);
  }

  auto texts = md.get_string_array("tokenizer.ggml.tokens");
  SHOAL_RETURN_IF_ERROR(check_array(md, "tokenizer.ggml.tokens", texts.has_value(), source));
  if (!texts) return make_error(Code::kNotFound, "{}: tokenizer.ggml.tokens is missing", source);
  const size_t n = texts->size();
  auto scores = md.get_float_array("tokenizer.ggml.scores");
  SHOAL_RETURN_IF_ERROR(check_array(md, "tokenizer.ggml.scores", scores.has_value(), source));
  auto types = md.get_int_array("tokenizer.ggml.token_type");
  SHOAL_RETURN_IF_ERROR(check_array(md, "tokenizer.ggml.token_type", types.has_value(), source));
  if (scores && scores->size() < n) {
    return make_error(Code::kCorrupt, "{}: tokenizer.ggml.scores has {} entries for {} tokens", source,
                      scores->size(), n);
  }
  if (types && types->size() < n) {
    return make_error(Code::kCorrupt, "{}: tokenizer.ggml.token_type has {} entries for {} tokens",
                      source, types->size(), n);
  }
  v.tokens.resize(n);
  for (size_t i = 0; i < n; ++i) {
    v.tokens[i].text = std::move((*texts)[i]);
    v.tokens[i].score = scores ? float((*scores)[i]) : 0.0f;
    v.tokens[i].attr = types ? attr_from_gguf_type((*types)[i]) : kAttrNormal;
  }

  // Special ids: a value outside the vocabulary keeps the default (llama.cpp warns and does so).
  const std::pair<const char*, int32_t*> ids[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},         {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.eot_token_id", &v.eot},         {"tokenizer.ggml.eom_token_id", &v.eom},
      {"tokenizer.ggml.unknown_token_id", &v.unk},     {"tokenizer.ggml.seperator_token_id", &v.sep},
      {"tokenizer.ggml.padding_token_id", &v.pad},     {"tokenizer.ggml.mask_token_id", &v.mask}};
  for (auto [key, id] : ids) {
    if (!v.valid_id(*id)) *id = -1;
    auto val = md.get_int(key);
    if (!val) continue;
    if (v.valid_id(*val)) {
      *id = int32_t(*val);
    } else if (*val != -1 && *val != 0xFFFFFFFF) {  // (-1 as i32 or u32, LLAMA_TOKEN_NULL: the default kept quietly)
      spdlog::warn("{}: {} = {} is outside the vocabulary of {}; ignored (a bad special token)", source, key,
                   *val, n);
    }
  }
  v.add_bos = md.get_bool("tokenizer.ggml.add_bos_token").value_or(v.add_bos);
  v.add_eos = md.get_bool("tokenizer.ggml.add_eos_token").value_or(v.add_eos);
  v.add_sep = md.get_bool("tokenizer.ggml.add_sep_token").value_or(v.add_sep);
  v.chat_template = md.get_string("tokenizer.chat_template").value_or("");

  SHOAL_RETURN_IF_ERROR(finalize(v, source));

  if (v.type == VocabType::kBpe) {
    auto merges = md.get_string_array("tokenizer.ggml.merges");
    SHOAL_RETURN_IF_ERROR(check_array(md, "tokenizer.ggml.merges", merges.has_value(), source));
    if (!merges) return make_error(Code::kNotFound, "{}: tokenizer.ggml.merges is missing", source);
    v.merges.reserve(merges->size());
    size_t skipped = 0;
    for (size_t i = 0; i < merges->size(); ++i) {
      const std::string& m = (*merges)[i];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) {
        ++skipped;
        continue;
      }
      SHOAL_ASSIGN_OR_RETURN(bool added, add_merge(v, std::string_view(m).substr(0, sp),
                                                   std::string_view(m).substr(sp + 1), int32_t(i), true));
      skipped += !added;
    }
    if (skipped) spdlog::debug("{}: {} merges name strings that are not tokens; skipped", source, skipped);
  }
  apply_phi3_strip(v, md.get_string("general.name").value_or(""));
  return v;
}

}  // namespace shoal::tok
