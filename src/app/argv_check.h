// A check of the command line before CLI11 parses it, for what CLI11 would misread or report
// badly: llama.cpp's multi-letter single-dash flags (CLI11 reads `-ngl 99` as -n "gl", `-hf` as
// --help, `-fa` as -f "a"), a word that is no command, options before the command.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

namespace shoal::app {

/// The error of `app`'s command line that CLI11 would report badly, or nullopt:
/// - first, an argument that is one of llama.cpp's flags that Shoal has not (or has under another
///   name), or any other unknown word that starts with two letters after one dash (-ngl99, -top-k,
///   -phi: CLI11 would read -n "gl99"...): it names the flag and, for llama.cpp's, what it is there
///   and what Shoal does instead;
/// - else a first word that names no command, or a command's option before any command (CLI11
///   would only say that a command is required), naming the commands.
/// The values of options that take one (`-p -ngl`, `--log-level warn`), given apart, are skipped;
/// a `--` that is no option's value ends the options.
/// Source: llama.cpp common/arg.cpp (the flags' names and meanings).
std::optional<std::string> command_line_error(const CLI::App& app, int argc, const char* const* argv);

}  // namespace shoal::app
