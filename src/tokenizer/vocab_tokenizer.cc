#include "tokenizer/vocab_tokenizer.h"

#include <cctype>

#include "tokenizer/merge_encoders.h"
#include "tokenizer/unicode.h"

namespace shoal::tok {

Result<std::unique_ptr<VocabTokenizer>> VocabTokenizer::create(Vocab vocab) {
  std::unique_ptr<VocabTokenizer> t(new VocabTokenizer(std::move(vocab)));
  if (t->v_.type == VocabType::kBpe) {
    SHOAL_ASSIGN_OR_RETURN(t->splitter_, RegexSplitter::compile(t->v_.regexes));
  }
  return t;
}

TokenizerKind VocabTokenizer::kind() const {
  switch (v_.type) {
    case VocabType::kSpm: return TokenizerKind::kSentencePiece;
    case VocabType::kBpe: return TokenizerKind::kByteBpe;
    case VocabType::kWpm: return TokenizerKind::kWordPiece;
  }
  return TokenizerKind::kByteBpe;
}

std::string VocabTokenizer::describe() const {
  switch (v_.type) {
    case VocabType::kSpm: return v_.model + "/spm";
    case VocabType::kBpe: return v_.model + "/" + (v_.pre.empty() ? "default" : v_.pre);
    case VocabType::kWpm: return v_.model + "/wpm";
  }
  return v_.model;
}

std::vector<Fragment> VocabTokenizer::partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, text});
  std::vector<Fragment> next;
  for (int32_t id : v_.special_cache) {
    const TokenData& t = v_.tokens[id];
    if (!parse_special && (t.attr & (kAttrControl | kAttrUnknown))) continue;
    const std::string_view needle = t.text;
    next.clear();
    bool changed = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0 || f.text.find(needle) == std::string_view::npos) {
        next.push_back(f);
        continue;
      }
      changed = true;
      std::string_view s = f.text;
      size_t pos = 0;
      size_t hit;
      while ((hit = s.find(needle, pos)) != std::string_view::npos) {
        size_t left_end = hit;
        if (t.attr & kAttrLstrip) {
          while (left_end > pos && std::isspace(uint8_t(s[left_end - 1]))) --left_end;
        }
        if (left_end > pos) next.push_back({-1, s.substr(pos, left_end - pos)});
        next.push_back({id, {}});
        pos = hit + needle.size();
        if (t.attr & kAttrRstrip) {
          while (pos < s.size() && std::isspace(uint8_t(s[pos]))) ++pos;
        }
      }
      if (pos < s.size()) next.push_back({-1, s.substr(pos)});
    }
    if (changed) std::swap(frags, next);
  }
  return frags;
}

void VocabTokenizer::encode_bpe_fragment(std::string_view text, std::vector<int32_t>& out) const {
  std::string clean = sanitize_utf8(text);
  if (v_.escape_whitespace) clean = replace_all(clean, " ", kSpmSpace);
  for (std::string_view word : splitter_->split(clean)) {
    if (v_.byte_encode) {
      bpe_encode_word(v_, gpt2_encode(word), out);
    } else {
      bpe_encode_word(v_, word, out);
    }
  }
}

std::vector<int32_t> VocabTokenizer::encode(std::string_view text, bool add_special,
                                            bool parse_special) const {
  std::vector<int32_t> out;
  const std::vector<Fragment> frags = partition(text, parse_special);
  switch (v_.type) {
    case VocabType::kSpm: {
      // A space goes before the first text fragment and before text right after a special token.
      bool prev_special = true;
      if (add_special && v_.add_bos && v_.bos >= 0) out.push_back(v_.bos);
      for (const Fragment& f : frags) {
        if (f.token >= 0) {
          out.push_back(f.token);
          prev_special = true;
          continue;
        }
        std::string s;
        if (v_.add_space_prefix && prev_special) s = " ";
        s.append(f.text);
        spm_encode(v_, replace_all(s, " ", kSpmSpace), out);
        prev_special = false;
      }
      if (add_special && v_.add_eos && v_.eos >= 0) out.push_back(v_.eos);
      break;
    }
    case VocabType::kBpe: {
      // SentencePiece-style BPE (tokenizer.json with a "▁" prefix) takes the same prefix rule.
      bool prev_special = true;
      if (add_special && v_.add_bos && v_.bos >= 0) out.push_back(v_.bos);
      for (const Fragment& f : frags) {
        if (f.token >= 0) {
          out.push_back(f.token);
          prev_special = true;
        } else if (v_.add_space_prefix && prev_special) {
          encode_bpe_fragment(" " + std::string(f.text), out);
          prev_special = false;
        } else {
          encode_bpe_fragment(f.text, out);
          prev_special = false;
        }
      }
      if (add_special && v_.add_eos && v_.eos >= 0) out.push_back(v_.eos);
      break;
    }
    case VocabType::kWpm: {
      if (add_special && v_.bos >= 0) out.push_back(v_.bos);
      for (const Fragment& f : frags) {
        if (f.token >= 0) {
          out.push_back(f.token);
        } else {
          wpm_encode(v_, f.text, out);
        }
      }
      if (add_special && v_.sep >= 0) out.push_back(v_.sep);
      break;
    }
  }
  return out;
}

std::string VocabTokenizer::token_to_piece(int32_t id, bool special) const {
  if (!v_.valid_id(id)) return {};
  const TokenData& t = v_.tokens[id];
  if (t.attr & (kAttrUnknown | kAttrControl)) return special ? t.text : std::string();
  if (t.attr & kAttrUserDefined) return t.text;
  if (t.attr & kAttrNormal) {
    if (v_.type == VocabType::kBpe && v_.byte_encode) return gpt2_decode(t.text);
    return replace_all(t.text, kSpmSpace, " ");
  }
  if (t.attr & kAttrByte) {
    // "<0xXX>": the byte itself.
    auto hex = [](char c) {
      return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    };
    if (t.text.size() == 6 && t.text.compare(0, 3, "<0x") == 0 && t.text[5] == '>' && hex(t.text[3]) >= 0 &&
        hex(t.text[4]) >= 0) {
      return std::string(1, char(hex(t.text[3]) * 16 + hex(t.text[4])));
    }
    return t.text;
  }
  return {};  // unused / undefined tokens render as nothing (llama.cpp)
}

std::string VocabTokenizer::token_text(int32_t id) const {
  return v_.valid_id(id) ? v_.tokens[id].text : std::string();
}

}  // namespace shoal::tok
