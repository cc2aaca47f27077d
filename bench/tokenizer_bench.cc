// Tokenizer figures (not pass/fail): load time of each fixture tokenizer form, and encode /
// decode throughput (MB/s of UTF-8 text, tokens/s) on the golden test strings repeated to
// about 1 MB (mixed English, code-like, Cyrillic, CJK, emoji and whitespace runs).
// Build in a Release build dir without sanitizers:
//   cmake -S . -B build-rel -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHOAL_TESTS=OFF -DSHOAL_CUDA=OFF
//   cmake --build build-rel --target tokenizer_bench && build-rel/bench/tokenizer_bench
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <string>
#include <vector>

#include "core/mmap_file.h"
#include "tokenizer/tokenizer.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokenizer load and encode/decode throughput"};
  std::string fixtures = "../shared/fixtures";
  size_t target_bytes = 1 << 20;
  app.add_option("--fixtures", fixtures, "Fixture folder")->capture_default_str();
  app.add_option("--bytes", target_bytes, "Size of the text to encode")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto inp = shoal::read_file(fixtures + "/vocab/ggml-vocab-gpt-2.gguf.inp");
  if (!inp.ok()) {
    fmt::print(stderr, "{}\n", inp.status().to_string());
    return 1;
  }
  std::string text;
  while (text.size() < target_bytes) text += *inp;

  const std::vector<std::pair<const char*, const char*>> cases = {
      {"qwen2 vocab.json+merges.txt", "tokenizers/qwen2"},
      {"llama3 tiktoken", "tokenizers/llama3/tokenizer.model"},
      {"llama-spm gguf (SPM)", "vocab/ggml-vocab-llama-spm.gguf"},
      {"gpt-2 gguf", "vocab/ggml-vocab-gpt-2.gguf"},
      {"deepseek-llm gguf", "vocab/ggml-vocab-deepseek-llm.gguf"},
      {"bert-bge gguf (WPM)", "vocab/ggml-vocab-bert-bge.gguf"},
      {"hf/llama tokenizer.json", "hf/llama"},
      {"hf/phi3 SentencePiece", "hf/phi3"},
  };
  fmt::print("text: {:.2f} MB\n", double(text.size()) / 1e6);
  fmt::print("{:<30} {:>9} {:>10} {:>12} {:>13} {:>10}\n", "tokenizer", "load ms", "encode MB/s",
             "encode tok/s", "tokens", "decode MB/s");
  for (auto [name, rel] : cases) {
    auto t0 = std::chrono::steady_clock::now();
    auto tok = shoal::load_tokenizer_from_path(fixtures + "/" + rel);
    const double load_s = seconds_since(t0);
    if (!tok.ok()) {
      fmt::print("{:<30} {}\n", name, tok.status().to_string());
      continue;
    }
    t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = (*tok)->encode(text, false, false);
    const double enc_s = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    const std::string back = (*tok)->decode(ids);
    const double dec_s = seconds_since(t0);
    fmt::print("{:<30} {:>9.1f} {:>10.2f} {:>12.0f} {:>13} {:>10.1f}\n", name, load_s * 1e3,
               double(text.size()) / 1e6 / enc_s, double(ids.size()) / enc_s, ids.size(),
               double(back.size()) / 1e6 / dec_s);
  }
  return 0;
}
