// Prompt in, text out on stdout: shared by `shoal run` (one process or --pool) and `shoal host`.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace shoal::app {

/// What `shoal run` and `shoal host` share: the prompt, how much to generate, sampling, output form.
struct PromptFlags {
  std::string prompt;
  bool prompt_set = false;  // -p was given (its text may be empty)
  std::string prompt_file;
  bool file_set = false;    // -f was given (its name may be empty: an error, not "no file")
  bool escape = true;       // -p's escape sequences processed (-e, the default; --no-escape)
  int n_predict = -1;        // -1 (and -2, llama.cpp's "fill the context"): until end of generation or a full context
  bool ignore_eos = false;   // --ignore-eos: end-of-generation tokens do not stop the generation
  SamplingParams sampling;
  bool output_ids = false;
  bool special = false;      // --special: control tokens' text shown (llama.cpp's -sp)

  /// -p's text (escape sequences processed unless --no-escape), or the contents of -f's file
  /// ("-": stdin) less one trailing newline. Errors: kNotFound / kIoError reading the file.
  Result<std::string> text() const;
  /// n_predict, ignore_eos and sampling as the generator takes them.
  GenerateOptions generate_options() const;
};

/// -p/--prompt (described by `prompt_help`), -f/--file (not with -p), -e/--escape and --no-escape,
/// -n/--n-predict, the sampling flags and --output-ids.
void add_prompt_flags(CLI::App* cmd, PromptFlags& f, const std::string& prompt_help);

/// The bytes of the file at `path`, or of stdin to its end for "-". Errors: read_file's (kNotFound,
/// kIoError...), kIoError reading stdin.
Result<std::string> read_text_input(const std::string& path);

/// `text` with llama.cpp's escape sequences replaced: \n, \r, \t, \', \", \\ and \xHH (two hex
/// digits, one byte); a backslash before anything else stays as it is. Source: llama.cpp
/// common/common.cpp, string_process_escapes.
std::string process_escapes(std::string_view text);

/// Token ids of a prompt: BOS added as the model asks, special-token text parsed; an empty
/// prompt is just BOS. Errors: kInvalidArgument when it is empty and the model has no BOS.
Result<std::vector<int32_t>> encode_prompt(const Tokenizer& tok, const std::string& prompt);

/// Something that generates: Session::generate or pool::Host::generate.
using GenerateFn = std::function<Result<std::vector<int32_t>>(std::span<const int32_t>, const GenerateOptions&,
                                                              const TokenCallback&, GenerateStats*)>;

/// Flushes stdout. Errors: kIoError when that or an earlier write to it failed (a full disk, a
/// closed pipe where SIGPIPE is ignored), naming the cause.
Status stdout_status();
/// Writes `text` to stdout and flushes it. Errors: as stdout_status(), the failing call's cause.
Status write_stdout(std::string_view text);

/// Generates from `ids`, streaming the text (control tokens' too with form.special; with
/// form.output_ids the ids as one JSON array instead) to stdout as it comes, ending with a newline; logs the prompt and decode speed on stderr. What was
/// shown when the generator fails stays, ended (the array closed). Errors: the generator's;
/// stdout_status()'s, the generation stopped at the first failed write.
Status generate_to_stdout(const Tokenizer& tok, std::span<const int32_t> ids, const GenerateOptions& go,
                          const PromptFlags& form, const GenerateFn& generate);

/// For a stop by signal, from any thread: ends the answer generate_to_stdout is writing (its id
/// array closed, its text line ended) and drops whatever it would write after, so that what the
/// process leaves on stdout is whole. Waits at most 0.1 s for a write in progress (a full pipe):
/// then it ends nothing.
void end_answer_on_stdout();
/// Says that an answer line is owed (a prompt of `shoal host --output-ids` taken): a stop before
/// any of it is written writes `null` for it.
void expect_answer_line();
/// Writes one whole line of an answer (`null` for a prompt that failed), unless a stop ended the
/// output (then nothing). Errors: as write_stdout().
Status write_answer_line(std::string_view line);

}  // namespace shoal::app
