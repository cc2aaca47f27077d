// Rung 2 of the verification ladder: logits against the Hugging Face references
// (../shared/fixtures/hf/<arch>/reference.safetensors), through `shoal check`, loading both the
// HF folder and its llama.cpp-converted model-bf16.gguf.
#include <gtest/gtest.h>

#include <regex>

#include "test_util.h"

namespace shoal {
namespace {

struct HfCase {
  std::string arch;
  std::string form;  // "hf" (the folder) or "gguf"
  std::string device;
};

std::string hf_case_name(const ::testing::TestParamInfo<HfCase>& i) {
  std::string d = i.param.device;
  for (char& c : d)
    if (c == '-' || c == ':') c = '_';
  return i.param.arch + "_" + i.param.form + "_" + d;
}

class HfCheck : public ::testing::TestWithParam<HfCase> {};

TEST_P(HfCheck, LogitsAndGreedyMatchTheReference) {
  const HfCase& c = GetParam();
  const std::string dir = test::fixture("hf/" + c.arch);
  const std::string model = c.form == "hf" ? dir : dir + "/model-bf16.gguf";
  const auto r = test::run_command(test::shoal_bin() + " --log-level warn check -m " + model + " --reference " + dir +
                                   "/reference.safetensors --device " + c.device);
  EXPECT_EQ(r.status, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(max_abs_err=(\S+) greedy=(\d+)/(\d+))"))) << r.out;
  EXPECT_LE(std::stod(m[1]), 1e-3);
  EXPECT_EQ(m[2], m[3]);
  EXPECT_EQ(m[3], "16");
}

INSTANTIATE_TEST_SUITE_P(Llama, HfCheck,
                         ::testing::Values(HfCase{"llama", "hf", "cpu"}, HfCase{"llama", "gguf", "cpu"},
                                           HfCase{"qwen3", "hf", "cpu"}, HfCase{"qwen3", "gguf", "cpu"},
                                           HfCase{"llama", "hf", "cpu-ref"}, HfCase{"qwen3", "gguf", "cpu-ref"}),
                         hf_case_name);

TEST(HfCheckCli, FailsWhenTheToleranceIsTooTight) {
  const std::string dir = test::fixture("hf/llama");
  const auto r = test::run_command(test::shoal_bin() + " --log-level off check -m " + dir + " --reference " + dir +
                                   "/reference.safetensors --tol 0");
  EXPECT_EQ(r.status, 1) << r.out;
}

TEST(HfCheckCli, ReferenceLongerThanTheContextIsRefusedBeforeTheLoad) {
  const std::string dir = test::fixture("hf/llama");
  const auto r = test::run_command(test::shoal_bin() + " --log-level off check -m " + dir + " --reference " + dir +
                                   "/reference.safetensors -c 4 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("positions"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the context (-c) has 4"), std::string::npos) << r.out;
}

TEST(HfCheckCli, MissingReferenceIsAClearError) {
  const auto r = test::run_command(test::shoal_bin() + " check -m " + test::fixture("hf/llama") +
                                   " --reference /nonexistent.safetensors 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("/nonexistent.safetensors"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shoal
