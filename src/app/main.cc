// shoal: run one large language model across a pool of machines (or one).
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

  // llama.cpp's flags that CLI11 would misread (-ngl as -n "gl", -hf as --help).
  if (const auto e = shoal::app::foreign_flag_error(app, argc, argv)) {
    std::fprintf(stderr, "shoal: %s\n", e->c_str());
    return static_cast<int>(CLI::ExitCodes::ExtrasError);
  }
  // A first word that names no command, or a command's option before any command (CLI11 would
  // only say that a command is required); global options (--log-level X, --help) are skipped.
  std::string names;
  for (const auto& [name, fn] : commands) names += (names.empty() ? "" : ", ") + name;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.starts_with("-")) {
      const CLI::Option* opt = app.get_option_no_throw(a.substr(0, a.find('=')));
      if (!opt && a != "-h" && a != "--help") {
        std::fprintf(stderr, "shoal: %s before a command: a command's options follow its name, shoal COMMAND %s ... "
                     "(commands: %s; see shoal --help)\n", a.c_str(), a.c_str(), names.c_str());
        return static_cast<int>(CLI::ExitCodes::ExtrasError);
      }
      if (opt && opt->get_items_expected_min() > 0 && a.find('=') == std::string::npos) ++i;
      continue;
    }
    if (app.get_subcommands([&](CLI::App* sub) { return sub->get_name() == a; }).empty()) {
      std::fprintf(stderr, "shoal: '%s' is not a command (commands: %s; see shoal --help)\n", a.c_str(), names.c_str());
      return static_cast<int>(CLI::ExitCodes::ExtrasError);
    }
    break;
  }
  CLI11_PARSE(app, argc, argv);
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
