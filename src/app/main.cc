// shoal: run one large language model across a pool of machines (or one).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "app/argv_check.h"
#include "app/commands.h"
#include "app/generate_text.h"
#include "core/log.h"

int main(int argc, char** argv) {
  CLI::App app{"shoal: one language model across a pool of machines (one machine is a pool of one)"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Print help for every subcommand");
  app.set_version_flag("--version", std::string("shoal ") + SHOAL_VERSION, "Print the version and exit");
  std::string log_level = "info";
  app.add_option("--log-level", log_level,
                 "stderr log level: trace, debug, info, warn (or warning), error, critical, off (before or after the command)")
      ->capture_default_str()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->transform(CLI::IsMember({"trace", "debug", "info", "warn", "warning", "error", "critical", "off"},
                                CLI::ignore_case));

  // An option given twice takes its last value, as llama.cpp does (an alias's flag overridden on
  // the command line); inherited by every subcommand's options.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.fallthrough();  // global options after the command's name too (inherited by each subcommand)

  // Each add_* call adds one subcommand (the newest) and returns what runs it.
  std::vector<std::pair<std::string, shoal::app::CommandFn>> commands;
  auto reg = [&](shoal::app::CommandFn fn) {
    auto subs = app.get_subcommands([](CLI::App*) { return true; });
    commands.emplace_back(subs.back()->get_name(), std::move(fn));
  };
  reg(shoal::app::add_run_command(app));
  reg(shoal::app::add_inspect_command(app));
  reg(shoal::app::add_tokenize_command(app));
  reg(shoal::app::add_check_command(app));
  reg(shoal::app::add_bench_command(app));
  reg(shoal::app::add_host_command(app));
  reg(shoal::app::add_join_command(app));

  // A usage error exits with status 2, as POSIX utilities do (1 is a command that failed); its
  // message says "shoal:" first, like the others.
  constexpr int kUsageError = 2;
  app.failure_message([](const CLI::App* failed, const CLI::Error& e) {
    std::string what = e.what();
    if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
      // CLI11's own message lists them last first ("5 --draft"): the first unknown option, or the
      // first stray argument, by name.
      const std::vector<std::string> extra = failed->remaining(true);
      const auto opt = std::find_if(extra.begin(), extra.end(), [](const std::string& a) { return a.starts_with("-"); });
      if (opt != extra.end()) {
        what = "unknown option '" + *opt + "'";
      } else if (!extra.empty()) {
        what = "unexpected argument '" + extra.front() + "'";
      }
    }
    return "shoal: " + what + "\nRun with --help for more information.\n";
  });
  // What CLI11 would misread (-ngl as -n "gl", -hf as --help) or report badly (no command).
  if (const auto e = shoal::app::command_line_error(app, argc, argv)) {
    std::fprintf(stderr, "shoal: %s\n", e->c_str());
    return kUsageError;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // --help and --version: 0
    return rc == 0 ? 0 : kUsageError;
  }
  shoal::init_logging(log_level);
  for (auto& [name, fn] : commands) {
    if (!app.got_subcommand(name)) continue;
    int rc = 1;
    try {
      rc = fn();
    } catch (const std::exception& e) {  // fmt::print throws where a write to stdout fails
      std::fprintf(stderr, "shoal %s: %s\n", name.c_str(), e.what());
      return 1;
    }
    // Output that did not reach stdout (a full disk) fails the command.
    if (const shoal::Status st = shoal::app::stdout_status(); rc == 0 && !st.ok()) {
      std::fprintf(stderr, "shoal %s: %s\n", name.c_str(), st.to_string().c_str());
      return 1;
    }
    return rc;
  }
  return 1;
}
