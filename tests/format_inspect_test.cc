// `shoal inspect`: runs the binary on fixtures; expected facts come from fixtures/README.md,
// SOURCES.md and the checkpoints' config.json.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace shoal {
namespace {

struct CmdResult {
  int status = -1;
  std::string out;
};

// Runs `shoal inspect ARGS`, capturing stdout; stderr goes to `err_path` when given.
CmdResult inspect(const std::string& args, const std::string& err_path = "/dev/null") {
  const std::string cmd = test::shoal_bin() + " inspect " + args + " 2>" + err_path;
  CmdResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(FormatInspect, GgufText) {
  CmdResult r = inspect(test::fixture("models/stories260K.gguf"));
  ASSERT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("GGUF"), std::string::npos);
  EXPECT_NE(r.out.find("llama.block_count = 5"), std::string::npos);
  EXPECT_NE(r.out.find("tokenizer.ggml.tokens = string[512] ["), std::string::npos);
  EXPECT_NE(r.out.find("vocab_size: 512"), std::string::npos);
  EXPECT_NE(r.out.find("bos_id: 1"), std::string::npos);
  EXPECT_NE(r.out.find("token_embd.weight"), std::string::npos);
  EXPECT_NE(r.out.find("[512, 64]"), std::string::npos);
  EXPECT_NE(r.out.find("tensors (48)"), std::string::npos);
}

TEST(FormatInspect, GgufJson) {
  CmdResult r = inspect("--json " + test::fixture("quant/q-Q8_0.gguf"));
  ASSERT_EQ(r.status, 0);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["file_size"], 1549760);  // SOURCES.md
  EXPECT_EQ(j["metadata"]["general.name"], "shoal-quant-base");  // quant/README.md
  EXPECT_EQ(j["metadata"]["tokenizer.ggml.tokens"]["count"], 512);
  EXPECT_EQ(j["tokenizer"]["eos_id"], 2);
  EXPECT_EQ(j["totals"]["tensors"], 21);
  EXPECT_EQ(j["totals"]["parameters"], 1443072);
  bool found = false;
  for (const auto& t : j["tensors"]) {
    if (t["name"] == "blk.0.attn_k.weight") {
      EXPECT_EQ(t["dtype"], "Q8_0");
      EXPECT_EQ(t["shape"], nlohmann::json::array({128, 256}));
      EXPECT_EQ(t["nbytes"], 128 * 256 / 32 * 34);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(FormatInspect, HfFolderJson) {
  CmdResult r = inspect("--json " + test::fixture("hf/gpt2"));
  ASSERT_EQ(r.status, 0);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "huggingface");
  EXPECT_EQ(j["hf_config"]["model_type"], "gpt2");
  EXPECT_EQ(j["tokenizer"]["source"], "tokenizer.json");
  EXPECT_EQ(j["tokenizer"]["model"], "BPE");
  EXPECT_EQ(j["tokenizer"]["vocab_size"], j["hf_config"]["vocab_size"]);
}

TEST(FormatInspect, SentencePieceFolder) {
  CmdResult r = inspect(test::fixture("hf/gemma3_text"));
  ASSERT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("source: \"tokenizer.model\""), std::string::npos);
}

TEST(FormatInspect, MalformedFileGivesOneErrorLine) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string bad = (dir / ("shoal_inspect_" + std::to_string(::getpid()) + ".gguf")).string();
  const std::string err = bad + ".err";
  {
    std::ifstream in(test::fixture("models/stories260K.gguf"), std::ios::binary);
    std::string head(20000, '\0');
    in.read(head.data(), head.size());
    std::ofstream(bad, std::ios::binary) << head;  // cut inside the tensor data
  }
  CmdResult r = inspect(bad, err);
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(r.out.empty());
  std::ifstream e(err);
  std::string all((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  EXPECT_EQ(std::count(all.begin(), all.end(), '\n'), 1) << all;
  EXPECT_NE(all.find("corrupt"), std::string::npos) << all;
  EXPECT_NE(all.find("ends past end of file"), std::string::npos) << all;
  std::filesystem::remove(bad);
  std::filesystem::remove(err);
}

TEST(FormatInspect, MissingFile) {
  CmdResult r = inspect("/no/such/model.gguf");
  EXPECT_NE(r.status, 0);
}

}  // namespace
}  // namespace shoal
