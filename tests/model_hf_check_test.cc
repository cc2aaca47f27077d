// Rung 2 of the verification ladder: logits against the Hugging Face references
// (../shared/fixtures/hf/<arch>/reference.safetensors), through `shoal check`, loading both the
// HF folder and its llama.cpp-converted model-bf16.gguf.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "core/mmap_file.h"
#include "format/safetensors.h"
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

/// hf/llama's reference.safetensors written to TempDir()/name with `edit` applied to its tensors.
std::string edited_reference(const std::string& name,
                             const std::function<void(std::vector<SafetensorsTensor>&)>& edit) {
  const std::string src = test::fixture("hf/llama/reference.safetensors");
  auto f = MappedFile::open(src);
  EXPECT_TRUE(f.ok());
  auto st = parse_safetensors(f->data(), f->size(), src);
  EXPECT_TRUE(st.ok());
  std::vector<SafetensorsTensor> ts;
  for (const TensorInfo& t : st->tensors)
    ts.push_back({t.name, t.dtype, t.shape,
                  std::vector<uint8_t>(f->data() + t.offset, f->data() + t.offset + t.nbytes)});
  edit(ts);
  auto bytes = write_safetensors(ts, {});
  EXPECT_TRUE(bytes.ok());
  const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes->data()), std::streamsize(bytes->size()));
  return path;
}

SafetensorsTensor& tensor_named(std::vector<SafetensorsTensor>& ts, const std::string& name) {
  for (SafetensorsTensor& t : ts)
    if (t.name == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return ts.front();
}

TEST(HfCheckCli, ReferenceDecodeRowsMustMatchItsGeneratedIds) {
  // decode_logits holds one row per generated id: 3 rows for 16 ids is refused, not skipped.
  const std::string ref = edited_reference("ref_decode3.safetensors", [](std::vector<SafetensorsTensor>& ts) {
    SafetensorsTensor& d = tensor_named(ts, "decode_logits");
    d.shape[0] = 3;
    d.bytes.resize(size_t(3 * d.shape[1]) * 4);
  });
  const auto r = test::run_command(test::shoal_bin() + " --log-level off check -m " + test::fixture("hf/llama") +
                                   " --reference " + test::q(ref) + " 2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("decode_logits are [3, 512], expected [16, 512]"), std::string::npos) << r.out;
}

TEST(HfCheckCli, ReferenceLogitsOfTheRightCountButAnotherShapeAreRefused) {
  // The prompt's logits as [2T, V/2]: the same number of values, rows that would not line up.
  int64_t rows = 0;
  const std::string ref = edited_reference("ref_logits_shape.safetensors", [&](std::vector<SafetensorsTensor>& ts) {
    SafetensorsTensor& l = tensor_named(ts, "logits");
    rows = l.shape[0];
    l.shape = {2 * l.shape[0], l.shape[1] / 2};
  });
  const auto r = test::run_command(test::shoal_bin() + " --log-level off check -m " + test::fixture("hf/llama") +
                                   " --reference " + test::q(ref) + " 2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find(fmt::format("reference logits are [{}, 256], expected [{}, 512]", 2 * rows, rows)),
            std::string::npos) << r.out;
}

TEST(HfCheckCli, ReferenceWithoutGeneratedIdsOrWithMistypedDecodeLogitsIsRefused) {
  const std::string empty = edited_reference("ref_gen0.safetensors", [](std::vector<SafetensorsTensor>& ts) {
    SafetensorsTensor& g = tensor_named(ts, "generated_ids");
    g.shape = {0};
    g.bytes.clear();
  });
  auto r = test::run_command(test::shoal_bin() + " --log-level off check -m " + test::fixture("hf/llama") +
                             " --reference " + test::q(empty) + " 2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("generated_ids is empty"), std::string::npos) << r.out;

  const std::string typed = edited_reference("ref_dec_i32.safetensors", [](std::vector<SafetensorsTensor>& ts) {
    tensor_named(ts, "decode_logits").dtype = DType::kI32;
  });
  r = test::run_command(test::shoal_bin() + " --log-level off check -m " + test::fixture("hf/llama") + " --reference " +
                        test::q(typed) + " 2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("reference tensor 'decode_logits' should be F32 of rank 2"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shoal
