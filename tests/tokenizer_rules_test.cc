// Encoding rules on real vocabularies: special-token parsing on/off, BOS/EOS, end of generation,
// decode round trips and streaming of characters split across byte tokens. Expected ids come from
// fixtures/README.md (Qwen2: "Hello" 9707, " world" 1879; Llama 3: "Hello" 9906, " world" 1917,
// specials as Meta's code numbers them) and from the vocab files' own token tables.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace shoal {
namespace {

using Ids = std::vector<int32_t>;

class TokenizerQwen2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tok_ = test::load_tokenizer_fixture("tokenizers/qwen2").release(); }
  static void TearDownTestSuite() { delete tok_; }
  static Tokenizer* tok_;
};
Tokenizer* TokenizerQwen2::tok_ = nullptr;

TEST_F(TokenizerQwen2, SpecialTokensOnlyWithParseSpecial) {
  ASSERT_NE(tok_, nullptr);
  EXPECT_EQ(tok_->encode("Hello world", false, false), (Ids{9707, 1879}));
  EXPECT_EQ(tok_->encode("<|im_start|>", false, true), (Ids{151644}));
  const Ids plain = tok_->encode("<|im_start|>", false, false);
  EXPECT_GT(plain.size(), 1u);
  for (int32_t id : plain) EXPECT_LT(id, 151643);
  EXPECT_EQ(tok_->decode(plain), "<|im_start|>");
  EXPECT_EQ(tok_->encode("<|im_start|>Hello world<|im_end|>", false, true), (Ids{151644, 9707, 1879, 151645}));
}

TEST_F(TokenizerQwen2, NoBosAndEndOfGeneration) {
  ASSERT_NE(tok_, nullptr);
  EXPECT_FALSE(tok_->add_bos());
  EXPECT_EQ(tok_->encode("Hello world", true, false), (Ids{9707, 1879}));
  EXPECT_EQ(tok_->eos_id(), 151645);  // tokenizer_config.json: eos_token <|im_end|>
  EXPECT_TRUE(tok_->is_eog(151645));
  EXPECT_TRUE(tok_->is_eog(151643));  // <|endoftext|>
  EXPECT_FALSE(tok_->is_eog(151644));
  EXPECT_EQ(tok_->token_to_piece(151644), "");
  EXPECT_EQ(tok_->token_to_piece(151644, true), "<|im_start|>");
  EXPECT_FALSE(tok_->chat_template().empty());
}

TEST_F(TokenizerQwen2, ByteLevelRoundTripsEveryGoldenString) {
  ASSERT_NE(tok_, nullptr);
  for (const auto& c : test::read_golden(test::fixture("vocab/vectors-without-vocab/ggml-vocab-qwen2.gguf"))) {
    EXPECT_EQ(tok_->decode(tok_->encode(c.text, false, false)), c.text);
  }
}

TEST(TokenizerRules, Llama3BosSpecialsAndEndOfGeneration) {
  auto tok = test::load_tokenizer_fixture("tokenizers/llama3/tokenizer.model");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->encode("Hello world", true, false), (Ids{128000, 9906, 1917}));
  EXPECT_EQ(tok->encode("Hello world", false, false), (Ids{9906, 1917}));
  EXPECT_EQ(tok->encode("<|start_header_id|>user<|end_header_id|>", false, true).front(), 128006);
  EXPECT_EQ(tok->encode("<|start_header_id|>user<|end_header_id|>", false, true).back(), 128007);
  EXPECT_EQ(tok->token_text(128009), "<|eot_id|>");
  for (int32_t id : {128001, 128008, 128009}) EXPECT_TRUE(tok->is_eog(id)) << id;
  EXPECT_FALSE(tok->is_eog(128000));
  for (const auto& c : test::read_golden(test::fixture("vocab/vectors-without-vocab/ggml-vocab-llama-bpe.gguf"))) {
    EXPECT_EQ(tok->decode(tok->encode(c.text, false, false)), c.text);
  }
}

TEST(TokenizerRules, SpmBosEosAndLeadingSpaceOnDecode) {
  auto tok = test::load_tokenizer_fixture("vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("Hello world", true, false), (Ids{1, 15043, 3186}));
  EXPECT_EQ(tok->encode("", true, false), (Ids{1}));
  // llama.cpp's token_to_piece keeps the dummy-prefix space of the first piece.
  for (const auto& c : test::read_golden(test::fixture("vocab/ggml-vocab-llama-spm.gguf"))) {
    EXPECT_EQ(tok->decode(tok->encode(c.text, false, false)), c.text.empty() ? "" : " " + c.text);
  }
  // Control tokens are split out only with parse_special; a space follows them (dummy prefix).
  EXPECT_EQ(tok->encode("<s>Hello", false, true), (Ids{1, 15043}));
  EXPECT_NE(tok->encode("<s>Hello", false, false).front(), 1);
}

TEST(TokenizerRules, BertAddsClsAndSep) {
  auto tok = test::load_tokenizer_fixture("vocab/ggml-vocab-bert-bge.gguf");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->kind(), TokenizerKind::kWordPiece);
  EXPECT_EQ(tok->encode("Hello world", true, false), (Ids{101, 7592, 2088, 102}));
}

TEST(TokenizerRules, StreamingHoldsSplitUtf8) {
  auto tok = test::load_tokenizer_fixture("vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_NE(tok, nullptr);
  // From the golden vectors: " this is 🦙.cpp" has 🦙 as byte tokens 243 162 169 156 (<0xF0>...).
  const Ids ids = tok->encode(" this is \xF0\x9F\xA6\x99.cpp", false, false);
  StreamDecoder s(*tok);
  std::string out;
  std::vector<std::string> steps;
  for (int32_t id : ids) steps.push_back(s.push(id)), out += steps.back();
  out += s.flush();
  EXPECT_EQ(out, "  this is \xF0\x9F\xA6\x99.cpp");
  const auto llama_at = std::find(ids.begin(), ids.end(), 243) - ids.begin();
  ASSERT_LT(size_t(llama_at + 3), ids.size());
  EXPECT_EQ(steps[llama_at], "");
  EXPECT_EQ(steps[llama_at + 1], "");
  EXPECT_EQ(steps[llama_at + 2], "");
  EXPECT_EQ(steps[llama_at + 3], "\xF0\x9F\xA6\x99");
  // An incomplete sequence left at the end is flushed as one U+FFFD (its maximal subpart).
  StreamDecoder t(*tok);
  EXPECT_EQ(t.push(243), "");
  EXPECT_EQ(t.push(162), "");
  EXPECT_EQ(t.flush(), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace shoal
