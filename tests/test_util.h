// Helpers shared by the tests: where the fixtures are, the shoal binary, running a command, expected
// errors (of a Status or a Result).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
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

}  // namespace shoal::test
