// `shoal tokenize`: the ids as one JSON array on stdout, for each kind of MODEL argument.
// Expected ids: fixtures/README.md (Qwen2 "Hello" 9707, " world" 1879, <|im_start|> 151644;
// Llama 3 "Hello" 9906, " world" 1917, <|begin_of_text|> 128000) and the llama-spm golden vectors.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "test_util.h"

namespace shoal {
namespace {

test::CommandResult tokenize(const std::string& args) {
  return test::run_command(test::shoal_bin() + " --log-level off tokenize " + args);
}

using test::q;

TEST(TokenizerCli, VocabMergesFolderAndSpecialFlag) {
  const std::string m = "-m " + q(test::fixture("tokenizers/qwen2"));
  auto r = tokenize(m + " --bos -p 'Hello world'");  // Qwen2 has no BOS to add
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "[9707, 1879]\n");
  r = tokenize(m + " --special -p '<|im_start|>'");
  EXPECT_EQ(r.out, "[151644]\n");
}

TEST(TokenizerCli, TiktokenFileAndFolderWithBos) {
  auto r = tokenize("-m " + q(test::fixture("tokenizers/llama3/tokenizer.model")) + " --bos -p 'Hello world'");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "[128000, 9906, 1917]\n");
  r = tokenize("-m " + q(test::fixture("tokenizers/llama3")) + " -p 'Hello world'");
  EXPECT_EQ(r.out, "[9906, 1917]\n");
}

TEST(TokenizerCli, VocabOnlyGgufAndTextFromFile) {
  const std::string path = ::testing::TempDir() + "tokenizer_cli_input.txt";
  {
    std::ofstream f(path, std::ios::binary);
    f << "Hello world";
  }
  auto r = tokenize("-m " + q(test::fixture("vocab/ggml-vocab-llama-spm.gguf")) + " --bos -f " + q(path));
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "[1, 15043, 3186]\n");
  std::remove(path.c_str());
}

TEST(TokenizerCli, FullGgufAndHfFolder) {
  // hf/llama: " self" is one merged token (289), see tokenizer_forms_test.
  auto a = tokenize("-m " + q(test::fixture("hf/llama/model-bf16.gguf")) + " -p ' self'");
  auto b = tokenize("-m " + q(test::fixture("hf/llama")) + " -p ' self'");
  EXPECT_EQ(a.out, "[289]\n");
  EXPECT_EQ(b.out, "[289]\n");
}

TEST(TokenizerCli, Errors) {
  EXPECT_EQ(tokenize("-m " + q(test::fixture("tokenizers/qwen2"))).status, 2);  // no -p / -f
  auto r = tokenize("-m /nonexistent/model -p hi");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(r.out.empty());
  // A file of another kind (here a llama2.c checkpoint) is named as not a tokenizer, not as a
  // malformed SentencePiece model.
  r = test::run_command(test::shoal_bin() + " tokenize -m " + q(test::fixture("models/stories260K.bin")) +
                        " -p hi 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("stories260K.bin' is not a tokenizer Shoal reads"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shoal
