// Rung 4 of the verification ladder: a real trained model (stories260K, llama.cpp's CI model)
// must produce exactly llama.cpp's greedy output (../shared/fixtures/expected/).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <regex>

#include "runtime/local_model.h"
#include "runtime/session.h"
#include "test_util.h"

namespace shoal {
namespace {

nlohmann::json expected() {
  std::ifstream in(test::fixture("expected/stories260K_greedy.json"));
  return nlohmann::json::parse(in);
}

struct StoriesCase {
  std::string device;
  DType kv;
  int threads;
};

class StoriesGreedy : public ::testing::TestWithParam<StoriesCase> {};

TEST_P(StoriesGreedy, MatchesLlamaCpp) {
  LocalModelOptions o;
  o.device = GetParam().device;
  o.kv_dtype = GetParam().kv;
  o.threads = GetParam().threads;
  o.progress = false;
  auto m = load_local_model(test::fixture("models/stories260K.gguf"), o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  Session session(*m->pipeline, [&](int32_t id) { return m->tokenizer->is_eog(id); });
  const nlohmann::json want_all = expected();
  for (const auto& c : want_all["cases"]) {
    const auto want_prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["generated_ids"].get<std::vector<int32_t>>();
    auto ids = m->tokenizer->encode(c["prompt"].get<std::string>(), true, true);
    EXPECT_EQ(ids, want_prompt) << c["prompt"];
    GenerateOptions g;
    g.n_predict = int(want.size());
    g.sampling.temperature = 0;
    auto out = session.generate(want_prompt, g, {});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(*out, want) << c["prompt"];
    EXPECT_EQ(m->tokenizer->decode(*out), c["generated_text"].get<std::string>());
  }
}

std::string stories_case_name(const ::testing::TestParamInfo<StoriesCase>& i) {
  std::string d = i.param.device == "cpu-ref" ? "cpu_ref" : i.param.device;
  return d + "_kv_" + std::string(dtype_name(i.param.kv)) + "_" + std::to_string(i.param.threads) + "t";
}

INSTANTIATE_TEST_SUITE_P(Devices, StoriesGreedy,
                         ::testing::Values(StoriesCase{"cpu-ref", DType::kF32, 1}, StoriesCase{"cpu", DType::kF16, 2},
                                           StoriesCase{"cpu", DType::kF32, 1}, StoriesCase{"cpu", DType::kQ8_0, 3}),
                         stories_case_name);

TEST(StoriesCli, RunPrintsTheExpectedContinuation) {
  const auto c = expected()["cases"][0];
  const std::string cmd = test::shoal_bin() + " --log-level off run -m " + test::fixture("models/stories260K.gguf") +
                          " -p \"Once upon a time\" -n 48 --temp 0";
  const auto r = test::run_command(cmd);
  ASSERT_EQ(r.status, 0);
  const std::string& out = r.out;
  EXPECT_EQ(out, c["generated_text"].get<std::string>() + "\n");
}

TEST(StoriesCli, OutputIdsPrintsJson) {
  const auto c = expected()["cases"][1];
  const std::string cmd = test::shoal_bin() + " --log-level off run -m " + test::fixture("models/stories260K.gguf") +
                          " -p \"The little dog\" -n 48 --temp 0 --output-ids";
  const auto r = test::run_command(cmd);
  ASSERT_EQ(r.status, 0);
  const std::string& out = r.out;
  EXPECT_EQ(nlohmann::json::parse(out).get<std::vector<int32_t>>(), c["generated_ids"].get<std::vector<int32_t>>());
}

std::string stories_cmd(const std::string& args) {
  return test::shoal_bin() + " --log-level off " + args + " 2>&1";
}

// --seed follows llama.cpp: -1 asks for a random seed; a seed gives the same text every run;
// other text (past 2^63-1, below -1, not decimal) is refused before the model loads.
TEST(StoriesCli, SeedFlag) {
  const std::string run =
      "run -m " + test::fixture("models/stories260K.gguf") + " -p \"The little dog\" -n 24 --output-ids ";
  const auto a = test::run_command(stories_cmd(run + "--temp 1 --seed 7"));
  const auto b = test::run_command(stories_cmd(run + "--temp 1 --seed 7"));
  ASSERT_EQ(a.status, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(test::run_command(stories_cmd(run + "--temp 1 --seed -1")).status, 0);
  for (const char* ok : {"0", "9223372036854775807"})
    EXPECT_EQ(test::run_command(stories_cmd(run + "--temp 1 --seed " + ok)).status, 0) << ok;
  // Decimal, never octal: 010 is ten.
  EXPECT_EQ(test::run_command(stories_cmd(run + "--temp 1 --seed 010")).out,
            test::run_command(stories_cmd(run + "--temp 1 --seed 10")).out);
  for (const char* bad : {"-2", "9223372036854775808", "18446744073709551615", "+5", "0x10", "seven"}) {
    const auto r = test::run_command(stories_cmd(run + "--seed " + bad));
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_NE(r.out.find("--seed"), std::string::npos) << bad << ": " << r.out;
  }
}

// A random seed is logged, and --seed with it repeats the run.
TEST(StoriesCli, LoggedRandomSeedRepeatsTheRun) {
  const std::string run = test::shoal_bin() + " --log-level info run -m " + test::fixture("models/stories260K.gguf") +
                          " -p \"The little dog\" -n 24 --temp 1 --output-ids";
  const std::string log_path = ::testing::TempDir() + "shoal_seed_log.txt";
  const auto first = test::run_command(run + " 2>" + log_path);
  ASSERT_EQ(first.status, 0);
  std::ifstream log(log_path);
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  const size_t at = text.find("sampler seed: ");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string seed = text.substr(at + 14, text.find_first_not_of("0123456789", at + 14) - (at + 14));
  EXPECT_EQ(test::run_command(run + " --seed " + seed + " 2>/dev/null").out, first.out) << "seed " << seed;
}

TEST(StoriesCli, UnknownLogLevelIsRefused) {
  const auto r = test::run_command(test::shoal_bin() + " --log-level bogus run -m " +
                                   test::fixture("models/stories260K.gguf") + " -p hi -n 4 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--log-level: bogus not in"), std::string::npos) << r.out;
}

TEST(StoriesCli, BenchGivesEachRateWithItsStandardDeviation) {
  // As llama-bench: "rate ± sd" over the repetitions; one repetition has none (0.0).
  const std::string cmd = "bench -m " + test::fixture("models/stories260K.gguf") + " -p 16 -n 8 -t 1";
  const auto three = test::run_command(stories_cmd(cmd + " -r 3"));
  EXPECT_EQ(three.status, 0) << three.out;
  EXPECT_TRUE(std::regex_search(three.out, std::regex(R"(\| pp16 \| [0-9]+\.[0-9] ± [0-9]+\.[0-9] \| - \|)"))) << three.out;
  EXPECT_TRUE(std::regex_search(three.out, std::regex(R"(\| tg8 \| [0-9]+\.[0-9] ± [0-9]+\.[0-9] \| [0-9.]+ \|)"))) << three.out;
  const auto one = test::run_command(stories_cmd(cmd + " -r 1"));
  EXPECT_TRUE(std::regex_search(one.out, std::regex(R"(\| pp16 \| [0-9]+\.[0-9] ± 0\.0 \|)"))) << one.out;
}

// -o json (llama-bench's): one object per test; the median and the sample standard deviation are
// those of its samples, computed here; the GB/s of tg and the TFLOP/s of pp scale with the median.
TEST(StoriesCli, BenchWritesJson) {
  const auto r = test::run_command(test::shoal_bin() + " --log-level warn bench -m " +
                                   test::fixture("models/stories260K.gguf") + " -p 16 -n 8 -t 1 -r 4 -o json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2u) << r.out;
  EXPECT_EQ(j[0]["test"], "pp16");
  EXPECT_EQ(j[0]["n_prompt"], 16);
  EXPECT_EQ(j[0]["n_gen"], 0);
  EXPECT_EQ(j[0]["prefill_precision"], "exact");
  EXPECT_EQ(j[1]["test"], "tg8");
  EXPECT_EQ(j[1]["n_gen"], 8);
  for (const auto& t : j) {
    std::vector<double> v = t["samples_ts"].get<std::vector<double>>();
    ASSERT_EQ(v.size(), 4u);
    double mean = 0, var = 0;
    for (double x : v) mean += x / 4;
    for (double x : v) var += (x - mean) * (x - mean);
    std::sort(v.begin(), v.end());
    EXPECT_EQ(t["median_ts"].get<double>(), v[2]);  // (as the table: the upper of the middle two)
    EXPECT_NEAR(t["stddev_ts"].get<double>(), std::sqrt(var / 3), 1e-9 * mean);
    EXPECT_EQ(t["weight_bytes"], j[0]["weight_bytes"]);
  }
  EXPECT_NEAR(j[1]["gbps"].get<double>(), j[1]["median_ts"].get<double>() * j[1]["weight_bytes"].get<double>() / 1e9,
              1e-9 * j[1]["gbps"].get<double>());
  EXPECT_GT(j[0]["tflops"].get<double>(), 0);
}

TEST(StoriesCli, BenchRefusesPositionsPastTheContext) {
  const auto r =
      test::run_command(stories_cmd("bench -m " + test::fixture("models/stories260K.gguf") + " -p 16 -n 16 -c 8"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("-p 16 and -n 16 need 32 positions; the context (-c) has 8"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shoal
