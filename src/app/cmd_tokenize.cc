// `shoal tokenize -m MODEL [-p TEXT | -f FILE] [--bos] [--special]`: prints the token ids of the
// text as one JSON array on stdout.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/generate_text.h"
#include "core/mmap_file.h"
#include "tokenizer/tokenizer.h"

namespace shoal::app {

CommandFn add_tokenize_command(CLI::App& app) {
  struct Options {
    std::string model;
    std::string prompt;
    std::string file;
    bool bos = false;
    bool special = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  cmd->add_option("-m,--model", o->model,
                  "GGUF file (full or vocab-only), HF folder with tokenizer.json, folder with vocab.json + "
                  "merges.txt, or a tiktoken tokenizer.model (file or folder)")
      ->required();
  CLI::Option* prompt = cmd->add_option("-p,--prompt", o->prompt, "The text to tokenize");
  CLI::Option* file = cmd->add_option("-f,--file", o->file, "Read the text from this file (as it is); -: from stdin");
  prompt->excludes(file);
  cmd->add_flag("--bos", o->bos, "Add BOS (and EOS) where the model's tokenizer adds them");
  cmd->add_flag("--special", o->special,
                "Parse special-token text such as <|im_start|> into its token (otherwise plain text)");

  return [o, prompt, file]() -> int {
    if (prompt->count() == 0 && file->count() == 0) {
      std::fprintf(stderr, "shoal: tokenize: give the text with -p TEXT or -f FILE\n");
      return 2;
    }
    std::string text = o->prompt;
    if (file->count() > 0) {
      auto r = read_text_input(o->file);
      if (!r.ok()) return fail(r.status());
      text = std::move(r).value();
    }
    auto tok = load_tokenizer_from_path(o->model);
    if (!tok.ok()) return fail(tok.status());
    const std::vector<int32_t> ids = (*tok)->encode(text, o->bos, o->special);
    if (Status st = write_stdout(fmt::format("[{}]\n", fmt::join(ids, ", "))); !st.ok()) return fail(st);
    return 0;
  };
}

}  // namespace shoal::app
