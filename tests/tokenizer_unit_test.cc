// Building blocks of the tokenizers on hand-written inputs: UTF-8 handling, GPT-2's byte
// alphabet (openai/gpt-2 encoder.py bytes_to_unicode), pre-tokenizer regex splitting, WordPiece
// Unicode data, and a tiny in-memory BPE vocabulary whose merges are traced by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/json_stream.h"
#include "tokenizer/loaders.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unicode_data.h"
#include "tokenizer/vocab_tokenizer.h"

namespace shoal::tok {
namespace {

using Pieces = std::vector<std::string_view>;

TEST(TokenizerUnicode, InvalidBytesDecodeToReplacementOneByteEach) {
  EXPECT_EQ(decode_utf8("a\xC3\xA9"), (std::vector<uint32_t>{'a', 0xE9}));
  EXPECT_EQ(decode_utf8("\xFF" "b"), (std::vector<uint32_t>{0xFFFD, 'b'}));
  EXPECT_EQ(decode_utf8("\xE2\x82"), (std::vector<uint32_t>{0xFFFD, 0xFFFD}));  // truncated
  EXPECT_EQ(decode_utf8("\xC0\x80"), (std::vector<uint32_t>{0xFFFD, 0xFFFD}));  // overlong
  EXPECT_EQ(decode_utf8("\xED\xA0\x80"), (std::vector<uint32_t>(3, 0xFFFD)));   // surrogate
  EXPECT_EQ(sanitize_utf8("x\x80y"), "x\xEF\xBF\xBDy");
}

TEST(TokenizerUnicode, IllFormedTextShownWithOneReplacementPerMaximalSubpart) {
  const std::string r = "\xEF\xBF\xBD";  // U+FFFD
  // The Unicode Standard's own example (chapter 3.9, table 3-8).
  EXPECT_EQ(replace_ill_formed_utf8("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + r + r + r + "b" + r + "c" + r + r + "d");
  EXPECT_EQ(replace_ill_formed_utf8("\xF1\x93pp"), r + "pp");
  EXPECT_EQ(replace_ill_formed_utf8("\xE6\x94\xF6"), r + r);
  EXPECT_EQ(replace_ill_formed_utf8("\xED\xA0\x80"), r + r + r);  // a surrogate: ED's second byte is 80..9F
  EXPECT_EQ(replace_ill_formed_utf8("\xC0\x80"), r + r);          // overlong
  EXPECT_EQ(replace_ill_formed_utf8("\xE0\x80\x80"), r + r + r);  // overlong
  EXPECT_EQ(replace_ill_formed_utf8("\xF4\x90\x80\x80"), r + r + r + r);  // past U+10FFFF
  EXPECT_EQ(replace_ill_formed_utf8("ok\xE2\x82"), "ok" + r);      // truncated at the end
  const std::string valid = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\xA6\x99\xF4\x8F\xBF\xBF\xED\x9F\xBF";
  EXPECT_EQ(replace_ill_formed_utf8(valid), valid);
}

TEST(TokenizerUnicode, CompletePrefixHoldsOnlyAnUnfinishedTail) {
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("ab\xF0\x9F"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xF0\x9F\xA6\x99"), 6u);
  EXPECT_EQ(utf8_complete_prefix("\xE2"), 0u);
  EXPECT_EQ(utf8_complete_prefix("a\x80"), 2u);  // stray continuation byte: not waiting for more
}

TEST(TokenizerUnicode, Gpt2ByteAlphabet) {
  EXPECT_EQ(gpt2_byte_to_utf8('A'), "A");
  EXPECT_EQ(gpt2_byte_to_utf8(' '), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(gpt2_byte_to_utf8('\n'), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(gpt2_byte_to_utf8(0x00), "\xC4\x80");  // U+0100
  EXPECT_EQ(gpt2_byte_to_utf8(0xAD), "\xC5\x83");  // U+0143, the last of the remapped bytes
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(char(b));
  EXPECT_EQ(gpt2_decode(gpt2_encode(all)), all);
}

TEST(TokenizerUnicode, WordPieceData) {
  EXPECT_EQ(cpt_to_lower('A'), uint32_t('a'));
  EXPECT_EQ(cpt_to_lower(0x0411), 0x0431u);  // Б -> б
  EXPECT_EQ(cpt_to_lower('a'), uint32_t('a'));
  EXPECT_EQ(cpt_nfd_base(0xC4), uint32_t('A'));  // Ä
  EXPECT_EQ(cpt_nfd_base(0x1EED), uint32_t('u'));  // ử
  EXPECT_EQ(cpt_nfd_base(0xAC00), 0x1100u);  // 가 -> its leading jamo
  EXPECT_TRUE(cpt_flags('!') & kCptPunctuation);
  EXPECT_TRUE(cpt_flags('$') & kCptSymbol);
  EXPECT_TRUE(cpt_flags(0x0301) & kCptMark);
  EXPECT_TRUE(cpt_flags(0x200D) & kCptControl);  // ZERO WIDTH JOINER is Cf
  EXPECT_TRUE(cpt_flags(0x3000) & kCptWhitespace);
  EXPECT_TRUE(cpt_flags(0x4E00) & kCptLetter);
  EXPECT_EQ(cpt_flags(0x378), 0);  // unassigned
}

TEST(TokenizerRegex, Gpt2RegexSplitsAsTheRegexSays) {
  auto s = RegexSplitter::compile({std::string(kGpt2Regex)});
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ((*s)->split("Hello world's  test!!\n"),
            (Pieces{"Hello", " world", "'s", " ", " test", "!!", "\n"}));
  EXPECT_EQ((*s)->split(""), Pieces{});
}

TEST(TokenizerRegex, ListsRefinePiecesAndKeepGaps) {
  // First regex isolates digits; the second then runs inside each piece only.
  auto s = RegexSplitter::compile({"\\p{N}", "[a-z]+"});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->split("ab12-cd"), (Pieces{"ab", "1", "2", "-", "cd"}));
}

TEST(TokenizerRegex, WhitespaceAndDigitClassesFollowLlamaCpp) {
  EXPECT_EQ(translate_pattern("\\d+"), "[0-9]+");
  auto s = RegexSplitter::compile({"\\s+|\\d+"});
  ASSERT_TRUE(s.ok());
  // U+3000 IDEOGRAPHIC SPACE is whitespace; U+0663 ARABIC-INDIC THREE is not \d (ASCII only).
  EXPECT_EQ((*s)->split("a\xE3\x80\x80" "1\xD9\xA3"), (Pieces{"a", "\xE3\x80\x80", "1", "\xD9\xA3"}));
  auto end = RegexSplitter::compile({"\\s+$"});
  ASSERT_TRUE(end.ok());
  EXPECT_EQ((*end)->split("a \n"), (Pieces{"a", " \n"}));  // $ is the very end only
}

TEST(TokenizerRegex, BadPatternIsAnError) {
  auto s = RegexSplitter::compile({"(unclosed"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("(unclosed"), std::string::npos);
}

TEST(TokenizerRegex, EveryKnownPreTokenizerCompiles) {
  for (const std::string& name : supported_pre_tokenizers()) {
    auto spec = find_pre_tokenizer(name);
    ASSERT_TRUE(spec.ok()) << name;
    auto s = RegexSplitter::compile(spec->regexes);
    EXPECT_TRUE(s.ok()) << name << ": " << s.status().to_string();
  }
  auto bad = find_pre_tokenizer("no-such-pre");
  EXPECT_EQ(bad.status().code(), Code::kUnsupported);
  EXPECT_NE(bad.status().message().find("no-such-pre"), std::string::npos);
}

TEST(TokenizerJson, FlatVocabEscapesAndErrors) {
  auto v = parse_flat_vocab(R"( {"a\"b": 0, "\u00e9\n": 1, "\ud83e\udd99": 2,"x":-3} )", "v.json");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  ASSERT_EQ(v->size(), 4u);
  EXPECT_EQ((*v)[0], (std::pair<std::string, int64_t>{"a\"b", 0}));
  EXPECT_EQ((*v)[1].first, "\xC3\xA9\n");
  EXPECT_EQ((*v)[2].first, "\xF0\x9F\xA6\x99");  // surrogate pair -> U+1F999
  EXPECT_EQ((*v)[3].second, -3);
  EXPECT_TRUE(parse_flat_vocab("{}", "v.json").ok());
  for (const char* bad : {R"({"a": 1.5})", R"({"a": "1"})", R"({"a" 1})", R"({"a": 1,})", R"({"\ud800": 1})",
                          R"({"a": 1} x)", R"({"a": 1)", "[1]", ""}) {
    auto r = parse_flat_vocab(bad, "v.json");
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("at byte"), std::string::npos) << bad;
  }
}

// A five-token byte-level vocabulary with three merges (rank: pair), encoded by hand:
//   "aab":  a a b   -> rank 0 (a b) -> a ab -> rank 1 (a ab) -> aab                 = [3]
//   "aaab": a a a b -> rank 0 (a b) -> a a ab -> rank 1 (a ab) beats rank 2 (a a)
//           -> a aab, and (a aab) is no merge                                        = [0, 3]
TEST(TokenizerBpe, TinyVocabularyMergesByRank) {
  Vocab v;
  v.type = VocabType::kBpe;
  v.model = "test";
  for (const char* t : {"a", "b", "ab", "aab", "aa"}) v.tokens.push_back({t, 0.0f, kAttrNormal});
  ASSERT_TRUE(finalize(v, "tiny").ok());
  ASSERT_TRUE(add_merge(v, "a", "b", 0, false).ok());
  ASSERT_TRUE(add_merge(v, "a", "ab", 1, false).ok());
  ASSERT_TRUE(add_merge(v, "a", "a", 2, false).ok());
  auto t = VocabTokenizer::create(std::move(v));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->encode("aab", false, false), (std::vector<int32_t>{3}));
  EXPECT_EQ((*t)->encode("aaab", false, false), (std::vector<int32_t>{0, 3}));
  EXPECT_EQ((*t)->encode("aa", false, false), (std::vector<int32_t>{4}));
}

// SentencePiece-style BPE in tokenizer.json (Metaspace, byte_fallback), by hand:
// "a b" -> "▁a▁b" (prefix + spaces as U+2581) -> ▁ a ▁ b -> merge "▁ a" -> ▁a ▁ b;
// "b" is no token, so byte fallback gives <0x62>: [2, 0, 3].
TEST(TokenizerBpe, MetaspaceWithByteFallback) {
  const char* j = R"({"model": {"type": "BPE", "byte_fallback": true,
      "vocab": {"\u2581": 0, "a": 1, "\u2581a": 2, "<0x62>": 3}, "merges": [["\u2581", "a"]]},
      "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false}})";
  auto v = vocab_from_tokenizer_json(j, nlohmann::json(), "t.json");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  auto t = VocabTokenizer::create(std::move(v).value());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->encode("a b", false, false), (std::vector<int32_t>{2, 0, 3}));
  EXPECT_EQ((*t)->decode({2, 0, 3}), " a b");
}

// Post-processors decide BOS/EOS for tokenizer.json: a special token before $A is BOS.
TEST(TokenizerBpe, PostProcessorsAddSpecialTokens) {
  const std::string base = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
      "added_tokens": [{"id": 3, "content": "<s>", "special": true}, {"id": 4, "content": "</s>", "special": true}],
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
      "post_processor": )";
  const std::string tmpl = base + R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]}})";
  const std::string roberta = base + R"({"type": "RobertaProcessing", "sep": ["</s>", 4], "cls": ["<s>", 3]}})";
  for (const auto& [text, want] : {std::pair{tmpl, std::vector<int32_t>{3, 2}},
                                   std::pair{roberta, std::vector<int32_t>{3, 2, 4}}}) {
    auto v = vocab_from_tokenizer_json(text, nlohmann::json(), "t.json");
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    auto t = VocabTokenizer::create(std::move(v).value());
    ASSERT_TRUE(t.ok());
    EXPECT_EQ((*t)->encode("ab", true, false), want);
    EXPECT_EQ((*t)->encode("ab", false, false), (std::vector<int32_t>{2}));
  }
}

}  // namespace
}  // namespace shoal::tok
