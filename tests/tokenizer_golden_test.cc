// llama.cpp's golden tokenizer vectors (fixtures/vocab, SOURCES.md): every string must encode to
// exactly the ids llama.cpp's test-tokenizer-0 expects (add_special = false, parse_special = false).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace shoal {
namespace {

void expect_golden(const Tokenizer& tok, const std::string& vectors_base) {
  const auto cases = test::read_golden(vectors_base);
  ASSERT_GE(cases.size(), 40u) << vectors_base;
  int failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto ids = tok.encode(cases[i].text, false, false);
    EXPECT_EQ(ids, cases[i].ids) << "case " << i << ": '" << cases[i].text << "'";
    failures += ids != cases[i].ids;
    // Byte-level BPE is lossless on valid UTF-8: the pieces give back the text.
    if (tok.kind() == TokenizerKind::kByteBpe) {
      EXPECT_EQ(tok.decode(ids), cases[i].text) << "case " << i;
    }
  }
  EXPECT_EQ(failures, 0) << vectors_base;
}

class VocabGguf : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabGguf, MatchesLlamaCppVectors) {
  const std::string name = std::string("vocab/ggml-vocab-") + GetParam() + ".gguf";
  auto tok = test::load_tokenizer_fixture(name);
  ASSERT_NE(tok, nullptr);
  expect_golden(*tok, test::fixture(name));
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, VocabGguf,
                         ::testing::Values("llama-spm", "phi-3", "gpt-2", "falcon", "mpt", "starcoder",
                                           "refact", "deepseek-llm", "deepseek-coder", "bert-bge"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) c = c == '-' ? '_' : c;
                           return s;
                         });

// Vocab files without vectors upstream: they load, and encode/decode consistently.
TEST(TokenizerGolden, BaichuanAndGptNeoxLoad) {
  auto baichuan = test::load_tokenizer_fixture("vocab/ggml-vocab-baichuan.gguf");
  ASSERT_NE(baichuan, nullptr);
  EXPECT_EQ(baichuan->describe(), "llama/spm");
  const auto ids = baichuan->encode("Hello world", true, false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(baichuan->decode(ids), " Hello world");
  auto neox = test::load_tokenizer_fixture("vocab/ggml-vocab-gpt-neox.gguf");
  ASSERT_NE(neox, nullptr);
  EXPECT_EQ(neox->describe(), "gpt2/default");  // no tokenizer.ggml.pre: llama.cpp's default
  for (const auto& c : test::read_golden(test::fixture("vocab/ggml-vocab-mpt.gguf"))) {
    EXPECT_EQ(neox->decode(neox->encode(c.text, false, false)), c.text);
  }
}

TEST(TokenizerGolden, Qwen2VocabMergesMatchesLlamaCppVectors) {
  auto tok = test::load_tokenizer_fixture("tokenizers/qwen2");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->describe(), "gpt2/qwen2");
  expect_golden(*tok, test::fixture("vocab/vectors-without-vocab/ggml-vocab-qwen2.gguf"));
}

TEST(TokenizerGolden, Llama3TiktokenMatchesLlamaCppVectors) {
  auto tok = test::load_tokenizer_fixture("tokenizers/llama3/tokenizer.model");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->describe(), "tiktoken/llama3");
  expect_golden(*tok, test::fixture("vocab/vectors-without-vocab/ggml-vocab-llama-bpe.gguf"));
}

}  // namespace
}  // namespace shoal
