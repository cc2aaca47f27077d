// What a llama.cpp user types, on the command line: llama.cpp's multi-letter flags are refused by
// name (CLI11 would read -ngl as -n "gl" and -hf as --help), an option given twice takes its last
// value, -p's escape sequences are processed (--no-escape: not), -f - reads stdin, -t -1 and
// --repeat-last-n -1 are accepted, options before the command are named, a .safetensors file
// finds its tokenizer beside it, the context cap of -c 0 is logged and a stopped `run` says so
// (and dies by the signal).
// Expected values are the outputs of the same model for the text written out by hand.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <regex>
#include <thread>
#include <fstream>
#include <string>

#include "pool_test_util.h"
#include "test_util.h"

namespace shoal {
namespace llama_habits {  // (named: the tests are built as unity files, beside other tests' helpers)

using namespace std::chrono_literals;

using test::q;

std::string stories() { return q(test::fixture("models/stories260K.gguf")); }

// `shoal --log-level warn run -m stories260K ARGS` (greedy, ids), stdout and stderr together.
test::CommandResult run_ids(const std::string& args) {
  return test::run_command(test::shoal_bin() + " --log-level warn run -m " + stories() + " -n 6 --temp 0 -t 1 " +
                           "--output-ids " + args + " 2>&1");
}

std::string temp_file(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// The length of run's prompt for ARGS, from its log line "prompt: N tokens" (-1: none).
int prompt_tokens(const std::string& args) {
  const auto r = test::run_command(test::shoal_bin() + " run -m " + stories() + " -n 1 --temp 0 -t 1 " + args + " 2>&1");
  const size_t at = r.out.find("prompt: ");
  return at == std::string::npos ? -1 : std::stoi(r.out.substr(at + 8));
}

// How many ids `tokenize --bos --special` gives the file's text (as run encodes a prompt).
int tokenized(const std::string& path) {
  const auto r = test::run_command(test::shoal_bin() + " tokenize --bos --special -m " + stories() + " -f " + q(path));
  int n = 0;
  for (char c : r.out) n += c == ',';
  return r.status == 0 && r.out.size() > 3 ? n + 1 : -1;
}

TEST(AppLlamaHabits, LlamaCppMultiLetterFlagsAreRefusedByName) {
  const struct {
    const char* args;
    const char* says;
  } cases[] = {
      {"run -m x -p hi -ngl 99", "-ngl is llama.cpp's flag for layers to offload to the GPU"},
      {"run -hf ggml-org/gemma-3-1b-it-GGUF -p hi", "-hf is llama.cpp's flag for a model to download"},
      {"run -m x -fa -n 5", "-fa is llama.cpp's flag for flash attention"},
      {"bench -m x -ctk q8_0", "the KV cache type is --kv"},
      {"--log-level warn run -m x -ub 512", "the prompt step is -b"},
      {"run -m x --no-mmap", "--no-mmap is llama.cpp's flag for how the weights are held"},
      {"run -m x --mirostat 2", "--mirostat is llama.cpp's flag for a sampler"},
      {"run -m x --log-disable", "--log-level off"},
      {"run -m x -r User:", "-r is llama.cpp's flag for a stop text"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = test::run_command(test::shoal_bin() + " " + c.args + " 2>&1");
    EXPECT_EQ(r.status, 2) << r.out;  // a usage error
    EXPECT_EQ(r.out.rfind("shoal: ", 0), 0u) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("Shoal has no such option"), std::string::npos) << r.out;
  }
  // An option's value is not a flag: -p -ngl is the prompt "-ngl" (as from a file).
  const std::string path = temp_file("habits_ngl.txt", "-ngl");
  const auto value = test::run_command(test::shoal_bin() + " tokenize -m " + stories() + " -p -ngl 2>&1");
  const auto file = test::run_command(test::shoal_bin() + " tokenize -m " + stories() + " -f " + q(path) + " 2>&1");
  std::remove(path.c_str());
  ASSERT_EQ(file.status, 0) << file.out;
  EXPECT_EQ(value.status, 0) << value.out;
  EXPECT_EQ(value.out, file.out);
  // Nor a --flag=value form of one.
  const auto eq = test::run_command(test::shoal_bin() + " run -m x --n-gpu-layers=99 2>&1");
  EXPECT_EQ(eq.status, 2);
  EXPECT_NE(eq.out.find("--n-gpu-layers is llama.cpp's flag"), std::string::npos) << eq.out;
  // Other words that start with two letters after one dash: CLI11 would read -mmp as -m "mp".
  for (const char* w : {"-ngl99", "-top-k", "-phi", "-pHello"}) {
    const auto r = test::run_command(test::shoal_bin() + " run -m x " + w + " 2>&1");
    EXPECT_EQ(r.status, 2) << w;
    EXPECT_NE(r.out.find(std::string(w) + " is not an option"), std::string::npos) << r.out;
  }
  const auto number = run_ids("-p Once -n5");  // a letter and its number stay one option
  EXPECT_EQ(number.status, 0) << number.out;
  const auto other = test::run_command(test::shoal_bin() + " run -m x -mmp y.gguf 2>&1");
  EXPECT_EQ(other.status, 2);
  EXPECT_NE(other.out.find("-mmp is not an option (one dash goes with one letter"), std::string::npos) << other.out;
}

TEST(AppLlamaHabits, AnOptionBeforeTheCommandIsNamed) {
  const auto r = test::run_command(test::shoal_bin() + " -m " + stories() + " -p hi 2>&1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("shoal: -m before a command: a command's options follow its name"), std::string::npos) << r.out;
  // Global options still go before it.
  const auto ok = test::run_command(test::shoal_bin() + " --log-level=warn tokenize -m " + stories() + " -p Once");
  EXPECT_EQ(ok.status, 0) << ok.out;
}

TEST(AppLlamaHabits, AnOptionGivenTwiceTakesItsLastValue) {
  const auto twice = run_ids("-p Once -n 3 -n 8 --temp 1 --temp 0");
  const auto once = test::run_command(test::shoal_bin() + " --log-level warn run -m " + stories() +
                                      " -p Once -n 8 --temp 0 -t 1 --output-ids 2>&1");
  ASSERT_EQ(once.status, 0) << once.out;
  EXPECT_EQ(twice.status, 0) << twice.out;
  EXPECT_EQ(twice.out, once.out);
}

// run ARGS reads the prompt `text`: its prompt has as many tokens as `tokenize --bos --special`
// gives `text`, and it generates what the same text from a file (read as it is) generates.
void expect_prompt(const std::string& args, const std::string& text) {
  SCOPED_TRACE(args);
  const std::string path = temp_file("habits_prompt.txt", text);
  const int want = tokenized(path);
  ASSERT_GT(want, 0);
  EXPECT_EQ(prompt_tokens(args), want);
  const auto from_args = run_ids(args);
  const auto from_file = run_ids("-f " + q(path));
  ASSERT_EQ(from_file.status, 0) << from_file.out;
  EXPECT_EQ(from_args.status, 0) << from_args.out;
  EXPECT_EQ(from_args.out, from_file.out);
  std::remove(path.c_str());
}

TEST(AppLlamaHabits, EscapeSequencesInThePromptAreProcessed) {
  expect_prompt("-p 'Once\\nupon a\\ttime'", "Once\nupon a\ttime");
  // \xHH, \\, \" and what stays as it is: an unknown escape, \x without two hex digits, a last backslash.
  expect_prompt("-p 'a\\x41\\\\b\\\"c\\q\\xZZ\\x4\\'", "aA\\b\"c\\q\\xZZ\\x4\\");
  // --no-escape (or -e then --no-escape: the last one counts): -p as it is.
  expect_prompt("--no-escape -p 'Once\\nupon a\\ttime'", "Once\\nupon a\\ttime");
  expect_prompt("-e --no-escape -p 'Once\\nupon'", "Once\\nupon");
  EXPECT_EQ(prompt_tokens("--no-escape -e -p 'Once\\nupon'"), prompt_tokens("-p 'Once\\nupon'"));
  EXPECT_NE(prompt_tokens("-p 'Once\\nupon a\\ttime'"), prompt_tokens("--no-escape -p 'Once\\nupon a\\ttime'"));
}

TEST(AppLlamaHabits, AnEmptyPromptFileNameIsAnError) {
  const auto run = run_ids("-f ''");
  EXPECT_EQ(run.status, 1) << run.out;
  EXPECT_NE(run.out.find("cannot open ''"), std::string::npos) << run.out;
  const auto host = test::run_command("SHOAL_SECRET=s " + test::shoal_bin() + " --log-level warn host -m " + stories() +
                                      " --listen 127.0.0.1:0 --workers 0 -n 2 -f '' </dev/null 2>&1");
  EXPECT_EQ(host.status, 1) << host.out;
  EXPECT_NE(host.out.find("cannot open ''"), std::string::npos) << host.out;
}

TEST(AppLlamaHabits, PromptFileDashReadsStdin) {
  const std::string plain = temp_file("habits_stdin.txt", "Once upon a time\n");
  const auto from_stdin = test::run_command("printf 'Once upon a time\\n' | " + test::shoal_bin() +
                                            " --log-level warn run -m " + stories() +
                                            " -n 6 --temp 0 -t 1 --output-ids -f - 2>&1");
  const auto from_file = run_ids("-f " + q(plain));
  ASSERT_EQ(from_file.status, 0) << from_file.out;
  EXPECT_EQ(from_stdin.status, 0) << from_stdin.out;
  EXPECT_EQ(from_stdin.out, from_file.out);
  const auto tok = test::run_command("printf 'Once' | " + test::shoal_bin() + " tokenize -m " + stories() + " -f -");
  const auto tok_p = test::run_command(test::shoal_bin() + " tokenize -m " + stories() + " -p Once");
  EXPECT_EQ(tok.status, 0);
  EXPECT_EQ(tok.out, tok_p.out);
  std::remove(plain.c_str());
}

TEST(AppLlamaHabits, MinusOneForThreadsAndRepeatWindow) {
  const auto all_threads = run_ids("-p Once -t -1");
  const auto one_thread = run_ids("-p Once");
  EXPECT_EQ(all_threads.status, 0) << all_threads.out;
  EXPECT_EQ(all_threads.out, one_thread.out);
  // -1: the penalty looks at every token so far; with 42 tokens that is what a window of 64 sees,
  // and not what no window (0: the penalty off) gives.
  const auto whole = run_ids("-p Once -n 40 --repeat-penalty 1.5 --repeat-last-n -1");
  const auto window = run_ids("-p Once -n 40 --repeat-penalty 1.5 --repeat-last-n 64");
  const auto none = run_ids("-p Once -n 40 --repeat-penalty 1.5 --repeat-last-n 0");
  EXPECT_EQ(whole.status, 0) << whole.out;
  EXPECT_EQ(whole.out, window.out);
  EXPECT_NE(whole.out, none.out);
  const auto below = run_ids("-p Once --repeat-last-n -2");
  EXPECT_NE(below.status, 0);
  EXPECT_NE(below.out.find("-2 is not in [-1, "), std::string::npos) << below.out;
}

// llama.cpp's spellings of "off" and "all": a negative temperature is greedy, a negative top-k is
// off, -n -2 fills the context (as -1 does).
TEST(AppLlamaHabits, NegativeTemperatureTopKAndNPredict) {
  const auto greedy = run_ids("-p Once --temp 0");
  const auto negative = run_ids("-p Once --temp -1");
  ASSERT_EQ(greedy.status, 0) << greedy.out;
  EXPECT_EQ(negative.status, 0) << negative.out;
  EXPECT_EQ(negative.out, greedy.out);
  const auto off = run_ids("-p Once -n 20 --temp 1 --seed 7 --top-k 0");
  const auto minus = run_ids("-p Once -n 20 --temp 1 --seed 7 --top-k -1");
  ASSERT_EQ(off.status, 0) << off.out;
  EXPECT_EQ(minus.status, 0) << minus.out;
  EXPECT_EQ(minus.out, off.out);
  const auto full = run_ids("-p Once -c 24 -n -1");
  const auto fill = run_ids("-p Once -c 24 -n -2");
  ASSERT_EQ(full.status, 0) << full.out;
  EXPECT_EQ(fill.status, 0) << fill.out;
  EXPECT_EQ(fill.out, full.out);
  // The prompt "<s> Once" (2 tokens) and 22 ids fed back fill 24 positions: 23 ids (the last not fed).
  EXPECT_EQ(std::count(full.out.begin(), full.out.end(), ','), 23 - 1) << full.out;
}

// stories260K with its eos_token_id (GGUF u32 after its key and type) made `id`, at `path`.
void write_with_eos(const std::string& path, uint32_t id) {
  std::ifstream in(test::fixture("models/stories260K.gguf"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "tokenizer.ggml.eos_token_id";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  uint32_t type = 0;
  std::memcpy(&type, bytes.data() + at + key.size(), 4);
  ASSERT_EQ(type, 4u);  // GGUF_TYPE_UINT32
  std::memcpy(bytes.data() + at + key.size() + 4, &id, 4);
  std::ofstream(path, std::ios::binary) << bytes;
}

// Greedy "Once upon a time" gives 432, 383, 286, 261, 376, ... (expected/stories260K_greedy.json):
// with 376 as the end-of-generation token the run stops before it; --ignore-eos goes on through it
// to -n, the same ids.
TEST(AppLlamaHabits, IgnoreEosGoesOnPastEndOfGeneration) {
  const std::string path = ::testing::TempDir() + "habits_eos376.gguf";
  write_with_eos(path, 376);
  const std::string run = test::shoal_bin() + " --log-level warn run -m " + q(path) +
                          " -p 'Once upon a time' -n 12 --temp 0 -t 1 --output-ids";
  const auto stopped = test::run_command(run + " 2>&1");
  const auto on = test::run_command(run + " --ignore-eos 2>&1");
  std::remove(path.c_str());
  ASSERT_EQ(stopped.status, 0) << stopped.out;
  ASSERT_EQ(on.status, 0) << on.out;
  const auto a = nlohmann::json::parse(stopped.out), b = nlohmann::json::parse(on.out);
  ASSERT_EQ(b.size(), 12u) << on.out;
  ASSERT_LT(a.size(), b.size()) << stopped.out;
  EXPECT_EQ(b[a.size()], 376) << on.out;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << i;
}

// --special shows control tokens' text (llama.cpp's -sp): a sampled run that draws <s> (id 1).
TEST(AppLlamaHabits, SpecialShowsControlTokens) {
  const std::string args = "-p 'Once upon a time' -n 300 --temp 1 --seed 4";
  const auto ids = run_ids(args);
  ASSERT_EQ(ids.status, 0) << ids.out;
  const auto drawn = nlohmann::json::parse(ids.out);
  ASSERT_NE(std::find(drawn.begin(), drawn.end(), 1), drawn.end()) << "no <s> drawn: " << ids.out;
  const std::string run = test::shoal_bin() + " --log-level warn run -m " + stories() + " -t 1 " + args;
  const auto with = test::run_command(run + " --special 2>/dev/null");
  const auto without = test::run_command(run + " 2>/dev/null");
  ASSERT_EQ(with.status, 0);
  ASSERT_EQ(without.status, 0);
  EXPECT_NE(with.out.find("<s>"), std::string::npos) << with.out;
  EXPECT_EQ(without.out.find("<s>"), std::string::npos) << without.out;
  const auto sp = test::run_command(test::shoal_bin() + " run -m x -sp 2>&1");
  EXPECT_EQ(sp.status, 2);
  EXPECT_NE(sp.out.find("-sp is llama.cpp's short form of --special: spell it out"), std::string::npos) << sp.out;
  const auto bench = test::run_command(test::shoal_bin() + " bench -m x -sp 2>&1");  // no --special there
  EXPECT_EQ(bench.status, 2);
  EXPECT_NE(bench.out.find("-sp is not an option"), std::string::npos) << bench.out;
}

TEST(AppLlamaHabits, ASafetensorsFileFindsTheTokenizerBesideIt) {
  const std::string dir = test::fixture("hf/llama");
  const std::string cmd = test::shoal_bin() + " --log-level warn run -n 4 --temp 0 -t 1 --output-ids -p Once -m ";
  const auto folder = test::run_command(cmd + q(dir) + " 2>&1");
  const auto file = test::run_command(cmd + q(dir + "/model.safetensors") + " 2>&1");
  ASSERT_EQ(folder.status, 0) << folder.out;
  EXPECT_EQ(file.status, 0) << file.out;
  EXPECT_EQ(file.out, folder.out);
}

TEST(AppLlamaHabits, TheDefaultContextCapIsLogged) {
  namespace fs = std::filesystem;
  auto context = [](const std::string& value) {
    return [value](std::string& config) {
      const std::string key = "\"max_position_embeddings\": 256";
      const size_t at = config.find(key);
      ASSERT_NE(at, std::string::npos) << config;
      config.replace(at, key.size(), "\"max_position_embeddings\": " + value);
    };
  };
  fs::path dir = test::hf_llama_copy_with("hf_llama_long_context", context("32768"));
  const std::string cmd = test::shoal_bin() + " run -n 1 --temp 0 -t 1 -p Once -m " + q(dir.string());
  const auto capped = test::run_command(cmd + " 2>&1");
  EXPECT_EQ(capped.status, 0) << capped.out;
  EXPECT_NE(capped.out.find("context 4096 tokens of the model's 32768 (-c 32768 for all of them)"), std::string::npos)
      << capped.out;
  const auto asked = test::run_command(cmd + " -c 8192 2>&1");
  EXPECT_EQ(asked.status, 0) << asked.out;
  EXPECT_EQ(asked.out.find("-c 32768 for all"), std::string::npos) << asked.out;
  // A model's context past what -c takes: the hint names the most -c takes.
  fs::remove_all(dir);
  dir = test::hf_llama_copy_with("hf_llama_long_context", context("100000000"));
  const auto huge = test::run_command(cmd + " 2>&1");
  EXPECT_EQ(huge.status, 0) << huge.out;
  EXPECT_NE(huge.out.find("context 4096 tokens of the model's 100000000 (-c 16777216 for the most -c takes)"),
            std::string::npos) << huge.out;
  fs::remove_all(dir);
}

TEST(AppLlamaHabits, RunStoppedBySigintSaysSoAndDiesByIt) {
  // What was shown stays, ended: the text's line, or --output-ids' array (valid JSON).
  for (const bool ids : {false, true}) {
    std::vector<std::string> argv = {test::shoal_bin(), "run", "-m", test::fixture("models/stories260K.gguf"), "-p",
                                     "Once", "-n", "-1", "-c", "100000", "--temp", "0", "-t", "1"};
    if (ids) argv.push_back("--output-ids");
    auto child = test::Child::start(argv);
    ASSERT_TRUE(child->wait_out(ids ? "\\[[0-9]+, [0-9]+" : ".", 60s)) << child->err();  // generating
    child->kill(SIGINT);
    EXPECT_EQ(child->wait_exit(30s), -1) << child->err();  // not an exit: killed by the signal, for a shell
    EXPECT_EQ(child->term_signal(), SIGINT) << child->err();
    EXPECT_NE(child->err().find("SIGINT: stopped"), std::string::npos) << child->err();
    const std::string out = child->out();
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back(), '\n');
    if (!ids) continue;
    const auto parsed = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(parsed.is_array()) << out;
    EXPECT_GE(parsed.size(), 2u);
    for (const auto& id : parsed) EXPECT_TRUE(id.is_number_integer() && id.get<int>() >= 0 && id.get<int>() < 512) << out;
  }
}

TEST(AppLlamaHabits, BenchStoppedBySigintSaysSoAndDiesByIt) {
  auto child = test::Child::start({test::shoal_bin(), "bench", "-m", test::fixture("models/stories260K.gguf"), "-p",
                                   "256", "-n", "4000", "-r", "1000", "-t", "1"});
  ASSERT_TRUE(child->wait_err("KV cache: ", 60s)) << child->err();  // loaded, measuring
  std::this_thread::sleep_for(200ms);
  child->kill(SIGINT);
  EXPECT_EQ(child->wait_exit(30s), -1) << child->err();  // killed by the signal, for a shell
  EXPECT_EQ(child->term_signal(), SIGINT) << child->err();
  EXPECT_NE(child->err().find("SIGINT: stopped"), std::string::npos) << child->err();
}

TEST(AppLlamaHabits, RunStopsOnASignalWhileItsStdoutIsFull) {
  // stdout is a FIFO whose reader never reads: once it is full the answer's write blocks, holding
  // the output. SIGTERM still ends the run at once (the stop gives up ending the answer).
  const std::string fifo = ::testing::TempDir() + "habits_full_stdout.fifo";
  const std::string script = "F=\"" + fifo + "\"; rm -f \"$F\"; mkfifo \"$F\" || exit 9; sleep 60 < \"$F\" & R=$!; " +
                             test::shoal_bin() + " --log-level off run -m " + test::fixture("models/stories260K.gguf") +
                             " -p Once -n -1 -c 100000 --temp 0 -t 1 > \"$F\" & P=$!; sleep 3; kill -TERM $P; " +
                             "t0=$(date +%s%N); wait $P; rc=$?; t1=$(date +%s%N); kill $R; rm -f \"$F\"; " +
                             "echo rc=$rc ms=$(( (t1 - t0) / 1000000 ))";
  const auto r = test::run_command("bash -c " + q(script));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(rc=(\d+) ms=(\d+))"))) << r.out;
  EXPECT_EQ(m[1], std::to_string(128 + SIGTERM)) << r.out;
  EXPECT_LT(std::stoi(m[2]), 2000) << r.out;
}

}  // namespace llama_habits
}  // namespace shoal
