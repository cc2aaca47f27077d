// tiktoken BPE files ("<base64> <rank>" per line) -> Vocab. Tokens are stored in GPT-2's byte
// alphabet so the byte-level BPE path encodes and decodes them; merging uses tiktoken's rule
// (merge the adjacent pair whose concatenation has the lowest rank; Vocab::rank_by_concat).
#include <charconv>
#include <string>
#include <vector>

#include "tokenizer/loaders.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace shoal::tok {
namespace {

constexpr size_t kLlama3Regular = 128000;

// Standard base64 (RFC 4648) with '=' padding; nullopt on any other character or bad padding.
std::optional<std::string> decode_base64(std::string_view s) {
  if (s.empty() || s.size() % 4 != 0) return std::nullopt;
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  size_t pad = 0;
  while (pad < 2 && s[s.size() - 1 - pad] == '=') ++pad;
  std::string out;
  out.reserve(s.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < s.size() - pad; ++i) {
    const int v = val(s[i]);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((acc >> bits) & 0xFF));
    }
  }
  if (acc & ((1u << bits) - 1)) return std::nullopt;  // non-zero padding bits: not canonical
  return out;
}

// Meta's Llama 3 special tokens (llama-models, models/llama3/tokenizer.py, Llama 3.1 naming).
std::vector<std::string> llama3_specials() {
  std::vector<std::string> s = {"<|begin_of_text|>",       "<|end_of_text|>",
                                "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                                "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                                "<|start_header_id|>",     "<|end_header_id|>",
                                "<|eom_id|>",              "<|eot_id|>",
                                "<|python_tag|>"};
  for (int i = 3; s.size() < 256; ++i) s.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return s;
}

}  // namespace

Result<Vocab> vocab_from_tiktoken(std::string_view text, std::string_view source) {
  std::vector<std::pair<std::string, uint64_t>> entries;
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) {
      return make_error(Code::kCorrupt, "{}: line {} is not \"<base64> <rank>\"", source, line_no);
    }
    auto bytes = decode_base64(line.substr(0, sp));
    if (!bytes) return make_error(Code::kCorrupt, "{}: line {}: invalid base64 '{}'", source, line_no, line.substr(0, sp));
    const std::string_view num = line.substr(sp + 1);
    uint64_t rank = 0;
    auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), rank);
    if (ec != std::errc() || end != num.data() + num.size()) {
      return make_error(Code::kCorrupt, "{}: line {}: rank '{}' is not a number", source, line_no, num);
    }
    entries.emplace_back(gpt2_encode(*bytes), rank);
  }
  if (entries.size() != kLlama3Regular) {
    return make_error(Code::kUnsupported,
                      "{}: tiktoken file with {} tokens; only Meta Llama 3's ({} tokens) is supported",
                      source, entries.size(), kLlama3Regular);
  }
  Vocab v;
  v.type = VocabType::kBpe;
  v.model = "tiktoken";
  v.tokens.resize(entries.size());
  for (auto& [tok, rank] : entries) {
    if (rank >= entries.size() || !v.tokens[rank].text.empty()) {
      return make_error(Code::kCorrupt, "{}: rank {} is out of range or repeated (ranks must be 0..{})",
                        source, rank, entries.size() - 1);
    }
    v.tokens[rank].text = std::move(tok);
  }
  for (const std::string& s : llama3_specials()) v.tokens.push_back({s, 0.0f, kAttrControl});
  SHOAL_ASSIGN_OR_RETURN(PreTokenizerSpec spec, find_pre_tokenizer("llama3"));
  v.pre = spec.name;
  v.regexes = spec.regexes;
  v.ignore_merges = true;
  v.add_bos = true;
  v.bos = int32_t(kLlama3Regular);
  v.eos = int32_t(kLlama3Regular + 1);
  SHOAL_RETURN_IF_ERROR(index_tokens(v, source));

  v.rank_by_concat = true;
  derive_specials(v);
  return v;
}

}  // namespace shoal::tok
