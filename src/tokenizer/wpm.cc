// WordPiece encoding (BERT), after llama.cpp's llm_tokenizer_wpm_session.
#include <string>
#include <vector>

#include "tokenizer/merge_encoders.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unicode_data.h"

namespace shoal::tok {
namespace {

// CJK ideograph blocks as BERT's BasicTokenizer (_is_chinese_char) lists them.
bool is_chinese_char(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BERT's BasicTokenizer: normalise, then cut into words at whitespace; punctuation, ASCII
// symbols and CJK ideographs are words of their own; control characters are dropped.
std::vector<std::string> wpm_words(const Vocab& v, std::string_view text) {
  std::vector<std::string> words(1);
  for (uint32_t c : decode_utf8(text)) {
    if (v.strip_accents) c = cpt_nfd_base(c);
    const uint8_t f = cpt_flags(c);
    if (f & kCptWhitespace) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    if (c == 0 || c == kReplacementChar || (f & kCptControl)) continue;
    if (v.strip_accents && (f & kCptMark)) continue;
    std::string s;
    append_utf8(s, v.lowercase ? cpt_to_lower(c) : c);
    if ((f & kCptPunctuation) || (c < 0x7F && (f & kCptSymbol)) || is_chinese_char(c)) {
      if (!words.back().empty()) words.emplace_back();
      words.back() = std::move(s);
      words.emplace_back();
    } else {
      words.back() += s;
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

}  // namespace

void wpm_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
  for (const std::string& w : wpm_words(v, text)) {
    if (w.empty()) continue;
    const std::string word = std::string(kSpmSpace) + w;  // a word start carries the phantom space
    const size_t n = word.size();
    const size_t start_size = out.size();
    for (size_t i = 0; i < n;) {
      bool found = false;
      for (size_t j = std::min(n, i + v.max_token_len + 1); j > i; --j) {
        const int32_t id = v.find(std::string_view(word).substr(i, j - i));
        if (id >= 0) {
          out.push_back(id);
          i = j;
          found = true;
          break;
        }
      }
      if (!found) {  // the rest of the word has no token: the whole word becomes [UNK]
        out.resize(start_size);
        break;
      }
    }
    if (out.size() == start_size && v.unk >= 0) out.push_back(v.unk);
  }
}

}  // namespace shoal::tok
