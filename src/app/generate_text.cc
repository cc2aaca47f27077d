#include "app/generate_text.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "app/common_options.h"
#include "core/log.h"
#include "core/mmap_file.h"

namespace shoal::app {

std::string process_escapes(std::string_view text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 == text.size()) {
      out += text[i];
      continue;
    }
    const char c = text[i + 1];
    switch (c) {
      case 'n': out += '\n'; ++i; break;
      case 'r': out += '\r'; ++i; break;
      case 't': out += '\t'; ++i; break;
      case '\'': case '"': case '\\': out += c; ++i; break;
      case 'x':
        if (i + 3 < text.size() && hex(text[i + 2]) >= 0 && hex(text[i + 3]) >= 0) {
          out += char(hex(text[i + 2]) * 16 + hex(text[i + 3]));
          i += 3;
          break;
        }
        [[fallthrough]];
      default: out += '\\';  // kept, the next character taken as it is
    }
  }
  return out;
}

Result<std::string> read_text_input(const std::string& path) {
  if (path != "-") return read_file(path);
  std::string text;
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, stdin)) > 0;) text.append(buf, n);
  if (std::ferror(stdin)) return make_error(Code::kIoError, "reading stdin: {}", std::strerror(errno));
  return text;
}

Result<std::string> PromptFlags::text() const {
  if (!file_set) return escape ? process_escapes(prompt) : prompt;
  SHOAL_ASSIGN_OR_RETURN(std::string text, read_text_input(prompt_file));
  // One trailing newline is the file's end of line, not part of the prompt (as llama.cpp's -f).
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

GenerateOptions PromptFlags::generate_options() const {
  GenerateOptions go;
  go.n_predict = n_predict < 0 ? -1 : n_predict;
  go.stop_at_eog = !ignore_eos;
  go.sampling = sampling;
  return go;
}

void add_prompt_flags(CLI::App* cmd, PromptFlags& f, const std::string& prompt_help) {
  CLI::Option* prompt =
      cmd->add_option("-p,--prompt", f.prompt, prompt_help)->each([&f](const std::string&) { f.prompt_set = true; });
  cmd->add_option("-f,--file", f.prompt_file,
                  "Read the prompt from a file, as it is but for one trailing newline; -: from stdin")
      ->excludes(prompt)
      ->each([&f](const std::string&) { f.file_set = true; });
  // Two flags, the last one given counting (their callbacks run as they are parsed).
  cmd->add_flag_callback("-e,--escape", [&f] { f.escape = true; },
                         "Process escape sequences in -p (\\n, \\r, \\t, \\', \\\", \\\\, \\xHH): the default, as in "
                         "llama.cpp (unlike llama.cpp, a -f file and lines from stdin are read as they are)")
      ->trigger_on_parse();
  cmd->add_flag_callback("--no-escape", [&f] { f.escape = false; }, "Take -p as it is (no escape sequences)")
      ->trigger_on_parse();
  cmd->add_option("-n,--n-predict", f.n_predict,
                  "Tokens to generate (-1, or -2 as llama.cpp spells a full context: until end of generation or a "
                  "full context)")
      ->capture_default_str()
      ->transform(int_range(-2, 1 << 24));
  cmd->add_flag("--ignore-eos", f.ignore_eos,
                "Go on past end-of-generation tokens, until -n or a full context (as vLLM's ignore_eos; for "
                "benchmarks)");
  add_sampling_flags(cmd, f.sampling);
  cmd->add_flag("--output-ids", f.output_ids, "Print the generated token ids as one JSON array instead of text");
  cmd->add_flag("--special", f.special,
                "Show the text of control tokens (such as <|im_end|> or </s>) in the output, as llama.cpp's -sp");
}

Result<std::vector<int32_t>> encode_prompt(const Tokenizer& tok, const std::string& prompt) {
  std::vector<int32_t> ids = tok.encode(prompt, /*add_special=*/true, /*parse_special=*/true);
  if (ids.empty()) {
    if (tok.bos_id() < 0) return make_error(Code::kInvalidArgument, "the prompt is empty and the model has no BOS token");
    ids.push_back(tok.bos_id());
  }
  // As llama.cpp: a prompt that writes the BOS token the model adds anyway starts with two (or more).
  if (tok.add_bos() && ids.size() >= 2 && ids[0] == tok.bos_id() && ids[1] == tok.bos_id()) {
    size_t n = 2;
    while (n < ids.size() && ids[n] == tok.bos_id()) ++n;
    spdlog::warn("the prompt starts with the BOS token the model adds itself: it starts with {} now", n);
  }
  return ids;
}

Status stdout_status() { return write_stdout({}); }

Status write_stdout(std::string_view text) {
  // (glibc writes a large chunk at once and drops it where that fails, so a later fflush
  // succeeds: errno is taken from whichever call fails.)
  errno = 0;
  const bool wrote = text.empty() || std::fwrite(text.data(), 1, text.size(), stdout) == text.size();
  int e = errno;
  if (wrote) {
    errno = 0;
    const bool flushed = std::fflush(stdout) == 0;
    if (!flushed) e = errno;
    if (flushed && !std::ferror(stdout)) return Status::Ok();
  }
  return make_error(Code::kIoError, "writing the output to stdout: {}", e ? std::strerror(e) : "a write failed");
}

namespace {

// The answer generate_to_stdout is writing, for end_answer_on_stdout() on a signal's thread.
std::timed_mutex answer_mu;
enum class Open { kNothing, kPending, kText, kIds } answer_open = Open::kNothing;  // what a stop must end
bool answer_ended = false;  // ended by a stop: later writes are dropped

// Writes `text` of the answer in progress; `now` is what then stands open. Nothing after a stop.
Status write_answer(std::string_view text, Open now) {
  std::lock_guard lock(answer_mu);
  if (answer_ended) return Status::Ok();
  answer_open = now;
  return write_stdout(text);
}

}  // namespace

Status write_answer_line(std::string_view line) { return write_answer(line, Open::kNothing); }

void expect_answer_line() {
  std::lock_guard lock(answer_mu);
  if (!answer_ended) answer_open = Open::kPending;
}

void end_answer_on_stdout() {
  // A write blocked on a full pipe holds the lock: the stop does not wait for a reader.
  std::unique_lock lock(answer_mu, std::chrono::milliseconds(100));
  if (!lock.owns_lock() || answer_ended) return;
  answer_ended = true;
  if (answer_open == Open::kIds) (void)write_stdout("]\n");
  if (answer_open == Open::kText) (void)write_stdout("\n");
  if (answer_open == Open::kPending) (void)write_stdout("null\n");
}

Status generate_to_stdout(const Tokenizer& tok, std::span<const int32_t> ids, const GenerateOptions& go,
                          const PromptFlags& form, const GenerateFn& generate) {
  spdlog::info("prompt: {} token{}", ids.size(), ids.size() == 1 ? "" : "s");
  const bool output_ids = form.output_ids;
  StreamDecoder stream(tok, form.special);
  GenerateStats st;
  Status written;  // the first failed write stops the generation
  Open open = Open::kNothing;  // text or ids written (a failure then ends the line or the array)
  auto out = generate(ids, go, [&](int32_t id) {
    if (output_ids) {
      written = write_answer(fmt::format("{}{}", open == Open::kIds ? ", " : "[", id), Open::kIds);
      open = Open::kIds;
    } else if (const std::string text = stream.push(id); !text.empty()) {
      written = write_answer(text, Open::kText);
      open = Open::kText;
    }
    return written.ok();
  }, &st);
  if (!written.ok()) return written;
  if (!out.ok()) {
    // What was shown stays, ended: the ids as a JSON array, the text with its line. (Nothing shown:
    // what stands open, a pending line, stays for the caller.)
    if (open != Open::kNothing) (void)write_answer(open == Open::kIds ? "]\n" : "\n", Open::kNothing);
    return out.status();
  }
  if (output_ids) {
    SHOAL_RETURN_IF_ERROR(write_answer(open == Open::kIds ? "]\n" : "[]\n", Open::kNothing));
  } else {
    SHOAL_RETURN_IF_ERROR(write_answer(stream.flush() + "\n", Open::kNothing));
  }
  // The decode rate counts the tokens after the first (which the prompt's pass gives): none for one token.
  const std::string decode_rate = st.decode_s > 0 && st.n_generated > 1
                                      ? fmt::format(" ({:.1f} tok/s)", (st.n_generated - 1) / st.decode_s)
                                      : "";
  spdlog::info("prompt {} tokens in {:.3f} s ({:.1f} tok/s); generated {} token{} in {:.3f} s{}{}", st.n_prompt,
               st.prefill_s, st.prefill_s > 0 ? st.n_prompt / st.prefill_s : 0.0, st.n_generated,
               st.n_generated == 1 ? "" : "s", st.decode_s, decode_rate,
               st.hit_eog ? "; stopped at end of generation" : (st.hit_context ? "; context full" : ""));
  if (st.hit_context && go.n_predict > 0 && int64_t(st.n_generated) < go.n_predict)
    spdlog::warn("the context is full: {} of the {} tokens asked were generated (raise -c)", st.n_generated,
                 go.n_predict);
  return Status::Ok();
}

}  // namespace shoal::app
