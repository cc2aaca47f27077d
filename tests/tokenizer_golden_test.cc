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
  }
  EXPECT_EQ(failures, 0) << vectors_base;
}

std::unique_ptr<Tokenizer> load(const std::string& rel) {
  auto t = load_tokenizer_from_path(test::fixture(rel));
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

class VocabGguf : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabGguf, MatchesLlamaCppVectors) {
  const std::string name = std::string("vocab/ggml-vocab-") + GetParam() + ".gguf";
  auto tok = load(name);
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

TEST(TokenizerGolden, Qwen2VocabMergesMatchesLlamaCppVectors) {
  auto tok = load("tokenizers/qwen2");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->describe(), "gpt2/qwen2");
  expect_golden(*tok, test::fixture("vocab/vectors-without-vocab/ggml-vocab-qwen2.gguf"));
}

TEST(TokenizerGolden, Llama3TiktokenMatchesLlamaCppVectors) {
  auto tok = load("tokenizers/llama3/tokenizer.model");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->describe(), "tiktoken/llama3");
  expect_golden(*tok, test::fixture("vocab/vectors-without-vocab/ggml-vocab-llama-bpe.gguf"));
}

}  // namespace
}  // namespace shoal
