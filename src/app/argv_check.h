// Checks of the command line before CLI11 parses it, for what CLI11 would misread: llama.cpp's
// multi-letter single-dash flags (CLI11 reads `-ngl 99` as -n "gl", `-hf` as --help, `-fa` as
// -f "a") and a command line that gives options before the command's name.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace shoal::app {

/// The error for the first argument (before a `--`) that is one of llama.cpp's multi-letter
/// single-dash flags, or one of its long flags that Shoal has under another name: it names the
/// flag, says what it is in llama.cpp and what Shoal does instead. nullopt when there is none.
/// Source: llama.cpp common/arg.cpp (the flags' names and meanings).
std::optional<std::string> foreign_flag_error(int argc, const char* const* argv);

}  // namespace shoal::app
