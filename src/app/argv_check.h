// A check of the command line before CLI11 parses it, for what CLI11 would misread: llama.cpp's
// multi-letter single-dash flags (CLI11 reads `-ngl 99` as -n "gl", `-hf` as --help, `-fa` as
// -f "a").
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

namespace shoal::app {

/// The error for the first argument of `app`'s command line that is one of llama.cpp's flags that
/// Shoal has not (or has under another name), or any other unknown word that starts with two
/// letters after one dash (-ngl99, -top-k, -phi: CLI11 would read -n "gl99"...): it names the
/// flag and, for llama.cpp's, what it is there and what Shoal does instead. The values of options
/// that take one (`-p -ngl`), given apart, are skipped; a `--` that is no option's value ends the
/// options. nullopt when there is none.
/// Source: llama.cpp common/arg.cpp (the flags' names and meanings).
std::optional<std::string> foreign_flag_error(const CLI::App& app, int argc, const char* const* argv);

}  // namespace shoal::app
