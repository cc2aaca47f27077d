// Helpers shared by the tests: where the fixtures are, the shoal binary, running a command, expected
// errors (of a Status or a Result).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "core/status.h"

namespace shoal::test {

/// $SHOAL_FIXTURES, else ../shared/fixtures beside the source tree.
inline std::string fixtures_dir() {
  const char* env = std::getenv("SHOAL_FIXTURES");
  return (env && *env) ? std::string(env) : std::string(SHOAL_DEFAULT_FIXTURES);
}

/// Path of one fixture file, e.g. fixture("models/stories260K.gguf").
inline std::string fixture(const std::string& rel) { return fixtures_dir() + "/" + rel; }

/// Path of the built `shoal` executable.
inline std::string shoal_bin() { return SHOAL_BIN; }

/// Output of a shell command: exit status (-1 if it did not exit normally) and stdout.
struct CommandResult {
  int status = -1;
  std::string out;
};

/// Runs `cmd` through /bin/sh and collects its stdout (stderr passes through).
inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

/// Expects `st` to carry `code` and a message containing `needle`.
inline void expect_status(const Status& st, Code code, const std::string& needle) {
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
}

/// Expects `r` to hold an error carrying `code` and a message containing `needle`.
template <typename T>
void expect_error(const Result<T>& r, Code code, const std::string& needle) {
  ASSERT_FALSE(r.ok()) << "expected an error containing '" << needle << "'";
  expect_status(r.status(), code, needle);
}

/// `s` in single quotes, as one word of a shell command (paths without a quote in them).
inline std::string q(const std::string& s) { return "'" + s + "'"; }

/// The hf/llama fixture (weights, tokenizer, config) copied to TempDir()/name, with `edit` applied
/// to the text of its config.json first; the folder's path.
inline std::filesystem::path hf_llama_copy_with(const std::string& name, const std::function<void(std::string&)>& edit) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(fixture(std::string("hf/llama/") + f), dir / f);
  }
  std::ifstream in(fixture("hf/llama/config.json"));
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  edit(config);
  std::ofstream(dir / "config.json") << config;
  return dir;
}

}  // namespace shoal::test
