// The `shoal` CLI's subcommands. Each file cmd_<name>.cc adds one subcommand to the app and
// returns the callback main() runs when it was chosen. Output rules: generated text and JSON go to
// stdout; logs and progress go to stderr; exit status 0 only on success.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace shoal::app {

/// Runs the chosen subcommand; returns the process exit status.
using CommandFn = std::function<int()>;

CommandFn add_run_command(CLI::App& app);
CommandFn add_inspect_command(CLI::App& app);
CommandFn add_tokenize_command(CLI::App& app);
CommandFn add_check_command(CLI::App& app);
CommandFn add_bench_command(CLI::App& app);
CommandFn add_host_command(CLI::App& app);
CommandFn add_join_command(CLI::App& app);

}  // namespace shoal::app
