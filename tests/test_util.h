// Helpers shared by the tests: where the fixtures are, the shoal binary, running a command.
#pragma once

#include <cstdlib>
#include <string>

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

}  // namespace shoal::test
