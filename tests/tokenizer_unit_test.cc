// Building blocks of the tokenizers on hand-written inputs: UTF-8 handling, GPT-2's byte
// alphabet (openai/gpt-2 encoder.py bytes_to_unicode), pre-tokenizer regex splitting, WordPiece
// Unicode data, and a tiny in-memory BPE vocabulary whose merges are traced by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

}  // namespace
}  // namespace shoal::tok
