// shoal host: open a room, wait for workers, plan, and answer prompts with the pool
// (docs/protocol.md, "Host and worker"). The -p prompt, or one prompt per line on stdin.
#include <cstdio>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/generate_text.h"
#include "app/pool_flags.h"
#include "app/signal_watch.h"
#include "core/log.h"
#include "core/mmap_file.h"
#include "pool/transport_tcp.h"

namespace shoal::app {

namespace {

constexpr pool::Millis kForever{365LL * 24 * 3600 * 1000};
constexpr int kPromptRounds = 4;  // runs of a prompt (each of Host::generate's runs) while workers keep leaving

struct HostCmdOptions {
  ModelFlags model;
  PoolFlags pool;
  PromptFlags gen;
  std::string listen = "127.0.0.1:7000";
  std::string secret;
  int workers = 1;
  std::string mem;
};

int host(const HostCmdOptions& o) {
  // SIGINT / SIGTERM / SIGHUP: bye to the pool, exit 128 + signo; before any thread starts.
  HostSignals signals;
  auto opts = host_options(o.model, o.pool);
  if (!opts.ok()) return fail(opts.status());
  auto secret = room_secret(o.secret);
  if (!secret.ok()) return usage_error(secret.status().message());
  opts->secret = *secret;
  opts->listen = o.listen;
  opts->workers = size_t(o.workers);  // (a --split of more ranges than the host and N workers is refused at once)
  if (!o.mem.empty()) {
    auto mem = parse_bytes(o.mem);
    if (!mem.ok()) return usage_error(mem.status().with_context("--mem").message());
    opts->mem = *mem;
  }
  auto text = o.gen.text();
  if (!text.ok()) return fail(text.status());
  const std::string& prompt = *text;
  // One prompt (-p or -f, whose text may be empty: a BOS-only prompt, as `run` takes it), else
  // lines from stdin.
  const bool one_prompt = o.gen.prompt_set || o.gen.file_set;
  auto h = pool::Host::open(*opts, pool::tcp_network());
  if (!h.ok()) return fail(h.status());
  pool::Host& host = **h;
  const HostSignals::Hold held(signals, host);
  const Tokenizer& tok = *host.tokenizer();
  std::vector<int32_t> prompt_ids;  // a -p prompt is checked before waiting for workers
  if (one_prompt) {
    auto ids = encode_prompt(tok, prompt);
    if (!ids.ok()) return fail(ids.status());
    if (Status st = check_prompt_fits(ids->size(), host.n_ctx()); !st.ok()) return fail(st);
    prompt_ids = std::move(*ids);
  }
  // A plan for the next prompt. One that fails while fewer than --workers workers are in the pool
  // (one left, or was refused while the plan was made: another model, a load that failed) waits
  // for them again and plans again; with them all there, its error is the prompt's.
  const auto plan = [&]() -> Status {
    for (;;) {
      const Status st = host.ensure_plan();
      if (st.ok() || o.workers == 0 || host.wait_for_workers(size_t(o.workers), pool::Millis(0)).ok()) return st;
      spdlog::warn("no plan with the pool as it is ({}); waiting for {} worker{} on {}", st.to_string(), o.workers,
                   o.workers == 1 ? "" : "s", host.address());
      SHOAL_RETURN_IF_ERROR(host.wait_for_workers(size_t(o.workers), kForever));
    }
  };
  if (o.workers > 0) {
    spdlog::info("waiting for {} worker{} on {}", o.workers, o.workers == 1 ? "" : "s", host.address());
    if (Status st = host.wait_for_workers(size_t(o.workers), kForever); !st.ok()) return fail(st);
  }
  // (Reading stdin, no prompt waits yet: a failed first plan is said, and made again for each.)
  if (Status st = one_prompt ? plan() : host.ensure_plan(); !st.ok()) {
    if (one_prompt) return fail(st);
    spdlog::error("{}", st.to_string());
  }

  const GenerateOptions go = o.gen.generate_options();
  // A request whose chain broke before its first token and whose new plans failed (Host::generate
  // makes them: kUnavailable) while fewer than --workers are there waits for them, as a prompt's
  // plan does, and runs again (nothing of it was shown yet), in up to kPromptRounds rounds.
  bool shown = false;  // a token of the current prompt's answer went out
  auto answer = [&](std::span<const int32_t> ids) -> Status {
    shown = false;
    const GenerateFn gen = [&](auto p, const auto& g, const auto& cb, auto* s) {
      return host.generate(p, g, [&](int32_t id) { return shown = true, cb(id); }, s);
    };
    Status st = generate_to_stdout(tok, ids, go, o.gen, gen);
    for (int round = 2; round <= kPromptRounds; ++round) {
      if (st.ok() || shown || st.code() != Code::kUnavailable || o.workers == 0 ||
          host.n_workers() >= size_t(o.workers))
        break;
      spdlog::warn("{}; waiting for {} worker{} to run the prompt again (round {} of {})", st.to_string(), o.workers,
                   o.workers == 1 ? "" : "s", round, kPromptRounds);
      SHOAL_RETURN_IF_ERROR(host.wait_for_workers(size_t(o.workers), kForever));
      SHOAL_RETURN_IF_ERROR(plan());
      st = generate_to_stdout(tok, ids, go, o.gen, gen);
    }
    return st;
  };
  if (one_prompt) {
    Status st = answer(prompt_ids);
    return st.ok() ? 0 : fail(st);
  }
  spdlog::info("reading prompts from stdin, one per line");
  std::string line;
  size_t n_lines = 0, n_prompts = 0, n_failed = 0;
  while (std::getline(std::cin, line)) {
    ++n_lines;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF lines
    if (line.empty()) continue;
    ++n_prompts;
    shown = false;
    if (o.gen.output_ids) expect_answer_line();  // (a stop before its first id says null for it)
    auto ids = encode_prompt(tok, line);
    Status st = ids.ok() ? check_prompt_fits(ids->size(), host.n_ctx()) : ids.status();  // before a wait
    if (st.ok()) st = plan();
    if (st.ok()) st = answer(*ids);
    if (!st.ok()) {
      if (std::ferror(stdout)) return fail(st);  // no later answer could be read either
      spdlog::error("line {}: {}", n_lines, st.to_string());  // the host stays up for the next prompt
      ++n_failed;
      // With --output-ids each prompt's answer is one line: null for one that failed before any id.
      if (o.gen.output_ids && !shown) {
        if (Status w = write_answer_line("null\n"); !w.ok()) return fail(w);
      }
    }
  }
  if (n_failed == 0) return 0;
  spdlog::error("{} of {} prompts failed", n_failed, n_prompts);
  return 1;
}

}  // namespace

CommandFn add_host_command(CLI::App& app) {
  auto o = std::make_shared<HostCmdOptions>();
  CLI::App* cmd = app.add_subcommand("host", "Open a pool: wait for workers, deal them layers, answer prompts");
  add_model_flags(cmd, o->model, "f16");
  add_pool_flags(cmd, o->pool, /*local_pool=*/false);
  cmd->add_option("--listen", o->listen, "The room's address, HOST:PORT (0.0.0.0:PORT to accept other machines)")
      ->check(address_check(true))
      ->capture_default_str();
  cmd->add_option("--secret", o->secret, "The room secret workers must know (default: $SHOAL_SECRET)");
  cmd->add_option("--workers", o->workers,
                  "Workers to wait for before the first plan, and again for a prompt whose plan fails while fewer "
                  "are in the pool (more may join; 0: start alone)")
      ->capture_default_str()
      ->transform(int_range(0, 1023));
  cmd->add_option("--mem", o->mem, "Memory the host lends for layers and head, e.g. 8G (default: what it has free)");
  add_prompt_flags(cmd, o->gen, "Prompt text; without it, prompts are read from stdin, one per line (exit status 1 "
                  "if any of them failed)");
  return [o] { return host(*o); };
}

}  // namespace shoal::app
