// What a llama.cpp user types, on the command line: llama.cpp's multi-letter flags are refused by
// name (CLI11 would read -ngl as -n "gl" and -hf as --help), an option given twice takes its last
// value, -p's escape sequences are processed (--no-escape: not), -f - reads stdin, -t -1 and
// --repeat-last-n -1 are accepted, options before the command are named, a .safetensors file
// finds its tokenizer beside it, the context cap of -c 0 is logged and a stopped `run` says so.
// Expected values are the outputs of the same model for the text written out by hand.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <thread>
#include <fstream>
#include <string>

#include "pool_test_util.h"
#include "test_util.h"

namespace shoal {
namespace {

using namespace std::chrono_literals;

std::string q(const std::string& s) { return "'" + s + "'"; }

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
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = test::run_command(test::shoal_bin() + " " + c.args + " 2>&1");
    EXPECT_EQ(r.status, 109) << r.out;  // as CLI11's ExtrasError
    EXPECT_EQ(r.out.rfind("shoal: ", 0), 0u) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("Shoal has no such option"), std::string::npos) << r.out;
  }
  // After "--" they are values (here: a prompt read as plain text by tokenize).
  const auto after = test::run_command(test::shoal_bin() + " tokenize -m " + stories() + " -p -- -ngl 2>&1");
  EXPECT_EQ(after.out.find("llama.cpp"), std::string::npos) << after.out;
}

TEST(AppLlamaHabits, AnOptionBeforeTheCommandIsNamed) {
  const auto r = test::run_command(test::shoal_bin() + " -m " + stories() + " -p hi 2>&1");
  EXPECT_EQ(r.status, 109);
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

TEST(AppLlamaHabits, EscapeSequencesInThePromptAreProcessed) {
  // The escaped -p against the same text written out (a file is read as it is).
  const std::string plain = temp_file("habits_plain.txt", "Once\nupon a\ttime\n");
  const auto escaped = run_ids("-p 'Once\\nupon a\\ttime'");
  const auto from_file = run_ids("-f " + q(plain));
  ASSERT_EQ(from_file.status, 0) << from_file.out;
  EXPECT_EQ(escaped.status, 0) << escaped.out;
  EXPECT_EQ(escaped.out, from_file.out);
  // \xHH, \\, \" and an unknown escape (kept): aA\b"c\q.
  const std::string odd = temp_file("habits_odd.txt", "aA\\b\"c\\q\n");
  const auto odd_escaped = run_ids("-p 'a\\x41\\\\b\\\"c\\q'");
  const auto odd_file = run_ids("-f " + q(odd));
  ASSERT_EQ(odd_file.status, 0) << odd_file.out;
  EXPECT_EQ(odd_escaped.out, odd_file.out);
  // --no-escape: -p as it is (a backslash and an n), as a file holding those bytes.
  const std::string raw = temp_file("habits_raw.txt", "Once\\nupon a\\ttime\n");
  const auto not_escaped = run_ids("--no-escape -p 'Once\\nupon a\\ttime'");
  const auto raw_file = run_ids("-f " + q(raw));
  ASSERT_EQ(raw_file.status, 0) << raw_file.out;
  EXPECT_EQ(not_escaped.out, raw_file.out);
  // The prompts' lengths against the tokenizer's ids for the texts (files without the newline).
  const std::string plain_text = temp_file("habits_plain_text.txt", "Once\nupon a\ttime");
  const std::string raw_text = temp_file("habits_raw_text.txt", "Once\\nupon a\\ttime");
  EXPECT_EQ(prompt_tokens("-p 'Once\\nupon a\\ttime'"), tokenized(plain_text));
  EXPECT_EQ(prompt_tokens("--no-escape -p 'Once\\nupon a\\ttime'"), tokenized(raw_text));
  EXPECT_NE(tokenized(plain_text), tokenized(raw_text));
  for (const auto& f : {plain, odd, raw, plain_text, raw_text}) std::remove(f.c_str());
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
  // -1: the penalty looks at every token so far; with 6 tokens that is a window of 64.
  const auto whole = run_ids("-p Once --repeat-penalty 1.5 --repeat-last-n -1");
  const auto window = run_ids("-p Once --repeat-penalty 1.5 --repeat-last-n 64");
  EXPECT_EQ(whole.status, 0) << whole.out;
  EXPECT_EQ(whole.out, window.out);
  const auto below = run_ids("-p Once --repeat-last-n -2");
  EXPECT_NE(below.status, 0);
  EXPECT_NE(below.out.find("-2 is not in [-1, "), std::string::npos) << below.out;
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
  const fs::path dir = fs::path(::testing::TempDir()) / "hf_llama_long_context";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(test::fixture(std::string("hf/llama/") + f), dir / f);
  }
  std::ifstream in(test::fixture("hf/llama/config.json"));
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "\"max_position_embeddings\": ";
  const size_t at = config.find(key);
  ASSERT_NE(at, std::string::npos) << config;
  config.replace(at + key.size(), config.find_first_of(",\n}", at + key.size()) - (at + key.size()), "32768");
  std::ofstream(dir / "config.json") << config;
  const std::string cmd = test::shoal_bin() + " run -n 1 --temp 0 -t 1 -p Once -m " + q(dir.string());
  const auto capped = test::run_command(cmd + " 2>&1");
  EXPECT_EQ(capped.status, 0) << capped.out;
  EXPECT_NE(capped.out.find("context 4096 tokens of the model's 32768 (-c 32768 for all of them)"), std::string::npos)
      << capped.out;
  const auto asked = test::run_command(cmd + " -c 8192 2>&1");
  EXPECT_EQ(asked.status, 0) << asked.out;
  EXPECT_EQ(asked.out.find("-c 32768 for all"), std::string::npos) << asked.out;
  fs::remove_all(dir);
}

TEST(AppLlamaHabits, RunStoppedBySigintSaysSo) {
  auto child = test::Child::start({test::shoal_bin(), "run", "-m", test::fixture("models/stories260K.gguf"), "-p", "Once",
                             "-n", "-1", "-c", "100000", "--temp", "0", "-t", "1"});
  ASSERT_TRUE(child->wait_err("prompt: 2 tokens", 30s)) << child->err();
  std::this_thread::sleep_for(200ms);
  child->kill(SIGINT);
  EXPECT_EQ(child->wait_exit(10s), 128 + SIGINT) << child->err();
  EXPECT_NE(child->err().find("SIGINT: stopped"), std::string::npos) << child->err();
  EXPECT_EQ(child->out().rfind(" upon a time", 0), 0u) << child->out().substr(0, 80);  // what it had written
}

}  // namespace
}  // namespace shoal
