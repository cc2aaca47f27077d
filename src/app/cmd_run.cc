// shoal run: generate text from a prompt (llama.cpp's llama-cli / llama-completion flags); with
// --pool N as a pool of N local processes (the host and N-1 workers on loopback).
#include <cstdio>
#include <memory>
#include <vector>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/generate_text.h"
#include "app/pool_flags.h"
#include "app/signal_watch.h"
#include "core/log.h"
#include "core/mmap_file.h"
#include "runtime/session.h"

namespace shoal::app {

namespace {

struct RunOptions {
  ModelFlags model;
  PromptFlags gen;
  PoolFlags pool;
};

int run(const RunOptions& o) {
  auto text = o.gen.text();
  if (!text.ok()) return fail(text.status());
  const std::string& prompt = *text;
  const GenerateOptions go = o.gen.generate_options();
  auto pool_flags = local_pool_flags(o.model, o.pool);  // a --device list without --pool: one process per entry
  if (!pool_flags.ok()) return fail(pool_flags.status());
  if (pool_flags->pool > 1) {
    // SIGINT / SIGTERM / SIGHUP: bye to the pool, exit 128 + signo; before any thread starts.
    HostSignals signals;
    std::vector<int32_t> ids;  // the prompt is checked before the workers load their layers
    auto lp = start_local_pool(o.model, *pool_flags, /*tokenizer=*/true, [&](pool::Host& h) -> Status {
      SHOAL_ASSIGN_OR_RETURN(ids, encode_prompt(*h.tokenizer(), prompt));
      return check_prompt_fits(ids.size(), h.n_ctx());
    });
    if (!lp.ok()) return fail(lp.status());
    pool::Host& host = *(*lp)->host;
    const HostSignals::Hold held(signals, host);
    Status st = generate_to_stdout(*host.tokenizer(), ids, go, o.gen,
                                   [&](auto p, const auto& g, const auto& cb, auto* s) { return host.generate(p, g, cb, s); });
    return st.ok() ? 0 : fail(st);
  }
  if (Status st = check_pool_flags_alone(o.pool); !st.ok()) return fail(st);
  // SIGINT / SIGTERM / SIGHUP: the stop said on stderr (each token's text is flushed as it comes),
  // then the process dies by the signal, as it would without the watch (a shell loop stops on Ctrl-C).
  SignalWatch signals([](int sig) {
    spdlog::warn("{}: stopped", signal_name(sig));
    end_answer_on_stdout();
    die_by_signal(sig);
  });
  auto opts = local_options(o.model);
  if (!opts.ok()) return fail(opts.status());
  auto loaded = load_local_model(o.model.model, *opts);
  if (!loaded.ok()) return fail(loaded.status());
  LocalModel& m = *loaded;
  auto ids = encode_prompt(*m.tokenizer, prompt);
  if (!ids.ok()) return fail(ids.status());
  Session session(*m.pipeline, [&](int32_t id) { return m.tokenizer->is_eog(id); });
  Status st = generate_to_stdout(*m.tokenizer, *ids, go, o.gen,
                                 [&](auto p, const auto& g, const auto& cb, auto* s) { return session.generate(p, g, cb, s); });
  return st.ok() ? 0 : fail(st);
}

}  // namespace

CommandFn add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt");
  add_model_flags(cmd, o->model, "f16");
  add_prompt_flags(cmd, o->gen, "Prompt text (special-token text such as <|im_start|> is parsed)");
  add_pool_flags(cmd, o->pool, /*local_pool=*/true);
  return [o] { return run(*o); };
}

}  // namespace shoal::app
