// The command line's edges: a write to stdout that fails (a full disk: /dev/full) fails the
// command with the cause on stderr instead of an exit status of 0, a prompt file that is a
// directory is refused, a GGUF whose layer count disagrees with its tensors does not open (nor one
// whose count is too large: the missing layer is named), a word
// that names no command is named as such, --version prints the version, a failed run prints
// nothing on stdout, `host` reads CRLF prompt lines as LF ones, integer flags are decimal integers
// (named as such when they are not), --log-level may follow the command's name, and a vocab-only
// GGUF given as a model is named as such.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "runtime/local_model.h"
#include "test_util.h"

namespace shoal {
namespace {

using test::q;

/// Runs `shoal ARGS` with stdout on /dev/full; CommandResult::out holds its stderr.
test::CommandResult to_full_disk(const std::string& args) {
  return test::run_command(test::shoal_bin() + " " + args + " 2>&1 >/dev/full");
}

TEST(AppCli, AFullDiskFailsTheCommand) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string m = "-m " + q(test::fixture("models/stories260K.gguf"));
  const std::string cases[] = {
      "inspect " + q(test::fixture("models/stories260K.gguf")),
      "--log-level warn run " + m + " -p Once -n 4 --temp 0",
      "--log-level warn run " + m + " -p Once -n 4 --temp 0 --output-ids",
      "--log-level warn tokenize " + m + " -p Once",
  };
  for (const std::string& c : cases) {
    SCOPED_TRACE(c);
    const auto r = to_full_disk(c);
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("No space left on device"), std::string::npos) << r.out;
  }
  // Over 4 KiB at once (glibc writes such a chunk itself, drops it where that fails, and a later
  // flush succeeds): the cause still named.
  const std::string path = ::testing::TempDir() + "app_cli_long_prompt.txt";
  {
    std::ofstream f(path, std::ios::binary);
    for (int i = 0; i < 800; ++i) f << "Once upon a time ";
  }
  const auto r = to_full_disk("--log-level warn tokenize " + m + " -f " + q(path));
  std::remove(path.c_str());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("No space left on device"), std::string::npos) << r.out;
}

// -f drops one trailing newline (a text file's end of line, as llama.cpp's -f): the same prompt
// tokens and text as -p; a second newline stays part of the prompt.
TEST(AppCli, APromptFileLosesOneTrailingNewline) {
  const std::string m = q(test::fixture("models/stories260K.gguf"));
  const std::string run = test::shoal_bin() + " --log-level warn run -m " + m + " -n 8 --temp 0 --output-ids ";
  const std::string one = ::testing::TempDir() + "app_cli_prompt_one.txt";
  const std::string two = ::testing::TempDir() + "app_cli_prompt_two.txt";
  std::ofstream(one, std::ios::binary) << "Once upon a time\n";
  std::ofstream(two, std::ios::binary) << "Once upon a time\n\n";
  const auto want = test::run_command(run + "-p 'Once upon a time' 2>&1");
  const auto got = test::run_command(run + "-f " + q(one) + " 2>&1");
  const auto kept = test::run_command(run + "-f " + q(two) + " 2>&1");
  std::remove(one.c_str());
  std::remove(two.c_str());
  ASSERT_EQ(want.status, 0) << want.out;
  EXPECT_EQ(got.status, 0);
  EXPECT_EQ(got.out, want.out);
  EXPECT_NE(kept.out, want.out);  // ("\n\n" keeps one newline: the ids of a prompt that ends in one)
}

TEST(AppCli, ABosWrittenInThePromptIsWarnedOf) {
  const std::string run = test::shoal_bin() + " run -m " + q(test::fixture("models/stories260K.gguf")) +
                          " -n 2 --temp 0 --output-ids 2>&1 >/dev/null -p ";
  const auto twice = test::run_command(run + "'<s>Once upon a time'");
  const auto once = test::run_command(run + "'Once upon a time'");
  EXPECT_EQ(twice.status, 0) << twice.out;
  EXPECT_NE(twice.out.find("starts with 2 now"), std::string::npos) << twice.out;
  EXPECT_EQ(once.out.find("starts with"), std::string::npos) << once.out;
  const auto thrice = test::run_command(run + "'<s><s>Once upon a time'");  // the model's BOS and two written
  EXPECT_NE(thrice.out.find("starts with 3 now"), std::string::npos) << thrice.out;
}

// -c 16 holds the 5 prompt tokens and 11 fed back, so 12 are generated (the last is not fed).
TEST(AppCli, AContextThatFillsBeforeNIsWarnedOf) {
  const std::string run = test::shoal_bin() + " run -m " + q(test::fixture("models/stories260K.gguf")) +
                          " -p 'Once upon a time' --temp 0 -c 16 2>&1 >/dev/null -n ";
  const auto short_ctx = test::run_command(run + "100");
  EXPECT_EQ(short_ctx.status, 0) << short_ctx.out;
  EXPECT_NE(short_ctx.out.find("the context is full: 12 of the 100 tokens asked were generated (raise -c)"),
            std::string::npos)
      << short_ctx.out;
  const auto fits = test::run_command(run + "4");
  EXPECT_EQ(fits.out.find("the context is full"), std::string::npos) << fits.out;
}

TEST(AppCli, InspectTakesTheModelAsMOrPositional) {
  const std::string m = q(test::fixture("models/stories260K.gguf"));
  const auto pos = test::run_command(test::shoal_bin() + " inspect " + m + " 2>&1");
  const auto flag = test::run_command(test::shoal_bin() + " inspect -m " + m + " 2>&1");
  ASSERT_EQ(pos.status, 0) << pos.out;
  EXPECT_EQ(flag.status, 0) << flag.out;
  EXPECT_EQ(flag.out, pos.out);
  // One of the two: neither is CLI11's missing-option error, both its excludes error.
  const auto neither = test::run_command(test::shoal_bin() + " inspect 2>&1");
  EXPECT_EQ(neither.status, 2);  // a usage error (CLI11's RequiredError)
  EXPECT_NE(neither.out.find("model is required"), std::string::npos) << neither.out;
  const auto both = test::run_command(test::shoal_bin() + " inspect " + m + " -m " + m + " 2>&1");
  EXPECT_EQ(both.status, 2);  // a usage error (CLI11's ExcludesError)
  EXPECT_NE(both.out.find("model excludes --model"), std::string::npos) << both.out;
  // --help lists the model once.
  const auto help = test::run_command(test::shoal_bin() + " inspect --help");
  EXPECT_EQ(help.status, 0);
  const size_t first = help.out.find("Hugging Face checkpoint folder");
  ASSERT_NE(first, std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("Hugging Face checkpoint folder", first + 1), std::string::npos) << help.out;
}

TEST(AppCli, ADirectoryAsThePromptFileIsRefused) {
  const std::string dir = ::testing::TempDir();
  const auto r = test::run_command(test::shoal_bin() + " --log-level warn run -m " +
                                   q(test::fixture("models/stories260K.gguf")) + " -n 4 -f " + q(dir) + " 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("is a directory"), std::string::npos) << r.out;
}

TEST(AppCli, AGgufWhoseLayerCountDisagreesWithItsTensorsDoesNotOpen) {
  // stories260K has 5 layers; its llama.block_count (a UINT32) patched to 4 leaves blk.4.* over.
  std::ifstream in(test::fixture("models/stories260K.gguf"), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "llama.block_count";
  auto at = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  ASSERT_NE(at, bytes.end());
  const size_t type_at = size_t(at - bytes.begin()) + key.size();
  uint32_t type = 0, value = 0;
  std::memcpy(&type, &bytes[type_at], 4);
  std::memcpy(&value, &bytes[type_at + 4], 4);
  ASSERT_EQ(type, 4u);  // GGUF_TYPE_UINT32
  ASSERT_EQ(value, 5u);
  value = 4;
  std::memcpy(&bytes[type_at + 4], &value, 4);
  const std::string path = ::testing::TempDir() + "stories_block_count_4.gguf";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
  }
  auto m = open_model(path, /*with_tokenizer=*/false);
  std::remove(path.c_str());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kCorrupt);
  EXPECT_NE(m.status().message().find("layer 4, but the model has 4 layers"), std::string::npos)
      << m.status().to_string();
}

// A layer count larger than the tensors: the first missing tensor is named as the file names it,
// and the error says where the tensors end (a Hugging Face checkpoint, then a GGUF).
TEST(AppCli, ALayerCountLargerThanTheTensorsNamesTheMissingLayer) {
  namespace fs = std::filesystem;
  const fs::path dir = test::hf_llama_copy_with("hf_llama_one_layer_more", [](std::string& config) {
    const std::string key = "\"num_hidden_layers\": 3";  // the fixture's 3 layers (blk.0-2)
    const size_t at = config.find(key);
    ASSERT_NE(at, std::string::npos) << config;
    config.replace(at, key.size(), "\"num_hidden_layers\": 4");
  });
  auto m = open_model(dir.string(), /*with_tokenizer=*/false);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const Status hf = m->weights.missing("blk.3.attn_norm.weight");
  EXPECT_EQ(hf.code(), Code::kNotFound);
  EXPECT_EQ(hf.message(), "tensor 'model.layers.3.input_layernorm.weight' (blk.3.attn_norm.weight) is missing from "
                          "the model, whose tensors end at layer 2 (its layer count disagrees with its tensors)");
  EXPECT_EQ(m->weights.missing("output_norm.weight").message(),
            "tensor 'model.norm.weight' (output_norm.weight) is missing from the model");
  // The command says the same.
  const auto r = test::run_command(test::shoal_bin() + " --log-level warn run -m " + q(dir.string()) +
                                   " -p Once -n 1 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("'model.layers.3.input_layernorm.weight' (blk.3.attn_norm.weight) is missing from the model, "
                       "whose tensors end at layer 2"), std::string::npos) << r.out;
  fs::remove_all(dir);
  // A GGUF keeps its own names; a tensor missing from a layer that has others is only named.
  auto g = open_model(test::fixture("models/stories260K.gguf"), /*with_tokenizer=*/false);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->weights.missing("blk.5.attn_norm.weight").message(),
            "tensor 'blk.5.attn_norm.weight' is missing from the model, whose tensors end at layer 4 (its layer count "
            "disagrees with its tensors)");
  EXPECT_EQ(g->weights.missing("blk.1.attn_q_norm.weight").message(),
            "tensor 'blk.1.attn_q_norm.weight' is missing from the model");
  // No layer tensor under a known name at all (stories260K's "blk." renamed "blq."): not the count.
  std::ifstream in(test::fixture("models/stories260K.gguf"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int renamed = 0;
  for (size_t at = bytes.find("blk."); at != std::string::npos; at = bytes.find("blk.", at + 4), ++renamed) bytes[at + 2] = 'q';
  ASSERT_GT(renamed, 0);
  const std::string path = ::testing::TempDir() + "stories_blq.gguf";
  std::ofstream(path, std::ios::binary) << bytes;
  auto none = open_model(path, /*with_tokenizer=*/false);
  std::remove(path.c_str());
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->weights.missing("blk.0.attn_norm.weight").message(),
            "tensor 'blk.0.attn_norm.weight' is missing from the model, which has no layer tensor that Shoal knows "
            "(names of another architecture?)");
}

// Integers of config.json that would not fit an int, or are not integers, are refused by name.
TEST(AppCli, ConfigIntegersOutOfRangeOrNotIntegersAreRefused) {
  const struct {
    const char* value;
    const char* says;
  } cases[] = {
      {"4294967297", "config.json: 'max_position_embeddings' = 4294967297 is outside [0, 2147483647]"},
      {"1e5", "config.json: 'max_position_embeddings' = 100000.0 is not an integer"},
      {"\"8192\"", "config.json: 'max_position_embeddings' = \"8192\" is not an integer"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.value);
    const auto dir = test::hf_llama_copy_with("hf_llama_bad_int", [&](std::string& config) {
      const std::string key = "\"max_position_embeddings\": 256";
      const size_t at = config.find(key);
      ASSERT_NE(at, std::string::npos);
      config.replace(at, key.size(), std::string("\"max_position_embeddings\": ") + c.value);
    });
    auto m = open_model(dir.string(), /*with_tokenizer=*/false);
    std::filesystem::remove_all(dir);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), Code::kCorrupt);
    EXPECT_EQ(m.status().message(), dir.string() + ": " + c.says);
  }
  // null is "not given" (as transformers writes head_dim: null): the default applies, here one KV
  // head per head (the fixture: 4 heads, 2 KV heads).
  const auto dir = test::hf_llama_copy_with("hf_llama_null_kv", [](std::string& config) {
    const std::string key = "\"num_key_value_heads\": 2";
    const size_t at = config.find(key);
    ASSERT_NE(at, std::string::npos) << config;
    config.replace(at, key.size(), "\"num_key_value_heads\": null");
  });
  auto m = open_model(dir.string(), /*with_tokenizer=*/false);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->config.layers[0].n_kv_heads, 4);
}

// stories260K's u32 key `key` (llama.context_length: 2048) rewritten to `type` (a GGUF type code)
// and `value` (4 bytes), then opened as a model.
Status open_stories_with_context_key(uint32_t type, uint32_t value, const std::string& key = "llama.context_length") {
  std::ifstream in(test::fixture("models/stories260K.gguf"), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto at = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  if (at == bytes.end()) return make_error(Code::kNotFound, "no {}", key);
  const size_t type_at = size_t(at - bytes.begin()) + key.size();
  std::memcpy(&bytes[type_at], &type, 4);
  std::memcpy(&bytes[type_at + 4], &value, 4);
  const std::string path = ::testing::TempDir() + "stories_context_key.gguf";
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  auto m = open_model(path, /*with_tokenizer=*/false);
  std::remove(path.c_str());
  return m.ok() ? Status::Ok() : m.status();
}

// An optional GGUF integer key of another type, or past an int, is refused by name (no silent
// fallback, no wrap into a negative context).
TEST(AppCli, AGgufContextLengthOfAnotherTypeOrPastAnIntIsRefused) {
  ASSERT_TRUE(open_stories_with_context_key(4, 2048).ok());  // GGUF_TYPE_UINT32, as the file has it
  const Status f32 = open_stories_with_context_key(6, 0x45000000);  // GGUF_TYPE_FLOAT32 2048.0f
  EXPECT_EQ(f32.code(), Code::kCorrupt);
  const std::string file = ::testing::TempDir() + "stories_context_key.gguf: ";
  EXPECT_EQ(f32.message(), file + "key 'llama.context_length' is f32, not an integer");
  const Status big = open_stories_with_context_key(4, 3000000000u);
  EXPECT_EQ(big.code(), Code::kCorrupt);
  EXPECT_EQ(big.message(), file + "key 'llama.context_length' = 3000000000 is outside [0, 2147483647]");
  // A required one (the layer count) of another type is named with its type, not as missing.
  const Status layers = open_stories_with_context_key(6, 0x40a00000, "llama.block_count");  // 5.0f
  EXPECT_EQ(layers.code(), Code::kCorrupt);
  EXPECT_EQ(layers.message(), file + "key 'llama.block_count' is f32, not an integer");
}

// A name read from a damaged file reaches the terminal escaped, and whole: a NUL cut the message
// short (printf's %s) and an escape sequence went to the terminal as it was.
TEST(AppCli, ANameFromADamagedFileIsPrintedEscaped) {
  std::ifstream in(test::fixture("models/stories260K.gguf"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key("\x0c\0\0\0\0\0\0\0general.name", 20);  // u64 length 12, then the key
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at + 8, 12, std::string("gen\0ral\x1b[2Jx", 12));
  const uint32_t type = 99;  // no GGUF type
  std::memcpy(&bytes[at + 20], &type, 4);
  const std::string path = ::testing::TempDir() + "escaped_key.gguf";
  std::ofstream(path, std::ios::binary) << bytes;
  const auto r = test::run_command(test::shoal_bin() + " inspect " + q(path) + " 2>&1 >/dev/null");
  std::remove(path.c_str());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("metadata key 'gen\\x00ral\\x1b[2Jx' has unknown value type 99"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
}

TEST(AppCli, AWordThatNamesNoCommandIsNamed) {
  for (const std::string args : {"serve", "--log-level warn rn -m x"}) {
    SCOPED_TRACE(args);
    const auto r = test::run_command(test::shoal_bin() + " " + args + " 2>&1");
    EXPECT_EQ(r.status, 2);  // a usage error (CLI11's ExtrasError)
    EXPECT_NE(r.out.find("is not a command (commands: run, "), std::string::npos) << r.out;
  }
  const auto v = test::run_command(test::shoal_bin() + " --version");
  EXPECT_EQ(v.status, 0);
  EXPECT_EQ(v.out.rfind("shoal ", 0), 0u) << v.out;
}

TEST(AppCli, AnUnknownOptionOrAStrayArgumentIsNamed) {
  // CLI11 said "The following arguments were not expected: 5 --draft" (the value first).
  const struct {
    const char* args;
    const char* says;
  } cases[] = {
      {"run -m x --draft 5 -p hi", "shoal: unknown option '--draft'\n"},
      {"run -m x -p hi stray more", "shoal: unexpected argument 'stray'\n"},
      {"bench -m x -p 0 -n 0", "shoal: nothing to measure: -p and -n are both 0\n"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = test::run_command(test::shoal_bin() + " " + c.args + " 2>&1");
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.out, std::string(c.says) + "Run with --help for more information.\n");
  }
}

TEST(AppCli, AnUnknownKvTypeOrDeviceIsAUsageError) {
  const std::string run = test::shoal_bin() + " run -m " + q(test::fixture("models/stories260K.gguf")) + " -p hi ";
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"--kv bogus", "KV cache type 'bogus' (expected f32, f16 or q8_0)"},
           {"--kv q4_0", "KV cache type 'q4_0'"},
           {"--device gpu", "unknown device 'gpu' (expected cpu, cpu-ref or cuda:N)"},
           {"--device cuda:x", "bad device 'cuda:x': expected cuda:N"},
           {"--device cpu,gpu", "unknown device 'gpu'"}}) {
    SCOPED_TRACE(flags);
    const auto r = test::run_command(run + flags + " 2>&1");
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << r.out;
  }
  const auto join = test::run_command(test::shoal_bin() + " join 127.0.0.1:1 --secret s --device gpu 2>&1");
  EXPECT_EQ(join.status, 2) << join.out;
  EXPECT_NE(join.out.find("unknown device 'gpu'"), std::string::npos) << join.out;
}

TEST(AppCli, AVocabOnlyGgufIsNamedAsSuchNotByAMissingTensor) {
  test::expect_error(open_model(test::fixture("vocab/ggml-vocab-llama-spm.gguf"), /*with_tokenizer=*/true),
                     Code::kInvalidArgument, "holds no tensors: a vocab-only GGUF");
}

TEST(AppCli, AFailedRunPrintsNothingOnStdout) {
  const std::string err = ::testing::TempDir() + "app_cli_failed_run.err";
  const auto r = test::run_command(test::shoal_bin() + " --log-level off run -m " +
                                   q(test::fixture("models/stories260K.gguf")) + " -c 2 -p 'Once upon a time' 2>" +
                                   q(err));
  std::ifstream in(err);
  const std::string why((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(err.c_str());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(why.find("raise -c"), std::string::npos) << why;  // the prompt does not fit the context
  EXPECT_EQ(r.out, "");
}

TEST(AppCli, HostReadsCrlfPromptLinesAsLfOnes) {
  auto ids = [](const std::string& line_end) {
    return test::run_command("printf 'Once upon a time" + line_end + "' | SHOAL_SECRET=crlf " + test::shoal_bin() +
                             " --log-level off host -m " + q(test::fixture("models/stories260K.gguf")) +
                             " --workers 0 --listen 127.0.0.1:0 -n 8 --temp 0 -t 1 --output-ids");
  };
  const auto lf = ids("\\n"), crlf = ids("\\r\\n");
  EXPECT_EQ(lf.status, 0);
  EXPECT_EQ(crlf.status, 0);
  EXPECT_EQ(lf.out.rfind("[432, 383, 286", 0), 0u) << lf.out;  // expected/stories260K_greedy.json
  EXPECT_EQ(crlf.out, lf.out);
}

TEST(AppCli, HostAnswersEachPromptLineOnceWithOutputIds) {
  // One line out per prompt line (empty lines are none): its ids, or null where it failed (the
  // second prompt is longer than -c 16), named by its line on stderr.
  const std::string err = ::testing::TempDir() + "app_cli_host_lines.err";
  const auto r = test::run_command(
      "printf 'Once upon a time\\n\\nOnce upon a time there was a little girl named Lily who\\nOnce upon a "
      "time\\n' | SHOAL_SECRET=lines " + test::shoal_bin() + " host -m " + q(test::fixture("models/stories260K.gguf")) +
      " --workers 0 --listen 127.0.0.1:0 -c 16 -n 4 --temp 0 -t 1 --output-ids 2>" + q(err));
  std::ifstream in(err);
  const std::string why((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(err.c_str());
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "[432, 383, 286, 261]\nnull\n[432, 383, 286, 261]\n") << why;  // expected/stories260K_greedy.json
  EXPECT_NE(why.find("line 3: out of range: the prompt is"), std::string::npos) << why;
  EXPECT_NE(why.find("1 of 3 prompts failed"), std::string::npos) << why;
}

TEST(AppCli, IntegerFlagsAreDecimalIntegers) {
  const std::string run = test::shoal_bin() + " run -m " + q(test::fixture("models/stories260K.gguf")) + " -p x -n ";
  const std::pair<std::string, std::string> bad[] = {
      {"abc", "--n-predict: 'abc' is not an integer"},
      {"5x", "--n-predict: '5x' is not an integer"},
      {"''", "--n-predict: '' is not an integer"},
      {"' 5'", "--n-predict: ' 5' is not an integer"},
      {"-5", "--n-predict: -5 is not in [-2, 16777216]"},
      {"99999999999999999999", "--n-predict: 99999999999999999999 is not in [-2, 16777216]"},
  };
  for (const auto& [value, message] : bad) {
    SCOPED_TRACE(value);
    const auto r = test::run_command(run + value + " 2>&1");
    EXPECT_EQ(r.status, 2);  // a usage error (CLI11's ValidationError)
    EXPECT_NE(r.out.find(message), std::string::npos) << r.out;
  }
  // A leading zero is decimal (CLI11 alone would read 010 as octal 8), and --log-level may follow
  // the command: nothing but the ids on stdout and stderr together.
  const auto r = test::run_command(test::shoal_bin() + " run -m " + q(test::fixture("models/stories260K.gguf")) +
                                   " -p 'Once upon a time' -n 010 --temp 0 --output-ids --log-level off 2>&1");
  EXPECT_EQ(r.status, 0);
  // expected/stories260K_greedy.json's first 10 generated ids
  EXPECT_EQ(r.out, "[432, 383, 286, 261, 376, 298, 315, 421, 395, 317]\n");
}

}  // namespace
}  // namespace shoal
