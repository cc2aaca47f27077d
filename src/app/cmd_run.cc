// shoal run: generate text from a prompt (llama.cpp's llama-cli / llama-completion flags).
#include <cstdio>
#include <memory>

#include "app/commands.h"
#include "app/common_options.h"
#include "core/log.h"
#include "core/mmap_file.h"
#include "runtime/session.h"

namespace shoal::app {

namespace {

struct RunOptions {
  ModelFlags model;
  SamplingParams sampling;
  std::string prompt;
  std::string prompt_file;
  int n_predict = -1;
  bool output_ids = false;
};

int run(const RunOptions& o) {
  auto opts = local_options(o.model);
  if (!opts.ok()) return fail(opts.status());
  auto loaded = load_local_model(o.model.model, *opts);
  if (!loaded.ok()) return fail(loaded.status());
  LocalModel& m = *loaded;
  const Tokenizer& tok = *m.tokenizer;

  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) {
    auto text = read_file(o.prompt_file);
    if (!text.ok()) return fail(text.status());
    prompt = *text;
  }
  std::vector<int32_t> ids = tok.encode(prompt, /*add_special=*/true, /*parse_special=*/true);
  if (ids.empty()) {
    if (tok.bos_id() < 0) return fail(make_error(Code::kInvalidArgument, "the prompt is empty and the model has no BOS token"));
    ids.push_back(tok.bos_id());
  }
  spdlog::info("prompt: {} tokens", ids.size());

  Session session(*m.pipeline, [&](int32_t id) { return tok.is_eog(id); });
  GenerateOptions go;
  go.n_predict = o.n_predict;
  go.sampling = o.sampling;
  StreamDecoder stream(tok);
  GenerateStats st;
  auto out = session.generate(ids, go, [&](int32_t id) {
    if (!o.output_ids) {
      const std::string text = stream.push(id);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  }, &st);
  if (!out.ok()) return fail(out.status());
  if (o.output_ids) {
    std::string json = "[";
    for (size_t i = 0; i < out->size(); ++i) json += fmt::format("{}{}", i ? ", " : "", (*out)[i]);
    std::printf("%s]\n", json.c_str());
  } else {
    const std::string rest = stream.flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::printf("\n");
  }
  std::fflush(stdout);
  spdlog::info("prompt {} tokens in {:.3f} s ({:.1f} tok/s); generated {} tokens in {:.3f} s ({:.1f} tok/s){}",
               st.n_prompt, st.prefill_s, st.prefill_s > 0 ? st.n_prompt / st.prefill_s : 0.0, st.n_generated,
               st.decode_s, st.decode_s > 0 ? (st.n_generated - 1) / st.decode_s : 0.0,
               st.hit_eog ? "; stopped at end of generation" : (st.hit_context ? "; context full" : ""));
  return 0;
}

}  // namespace

CommandFn add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt");
  add_model_flags(cmd, o->model, "f16");
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text (special-token text such as <|im_start|> is parsed)");
  cmd->add_option("-f,--file", o->prompt_file, "Read the prompt from a file");
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate (-1: until end of generation or a full context)")
      ->capture_default_str();
  add_sampling_flags(cmd, o->sampling);
  cmd->add_flag("--output-ids", o->output_ids, "Print the generated token ids as one JSON array instead of text");
  return [o] { return run(*o); };
}

}  // namespace shoal::app
