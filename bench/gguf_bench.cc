// GGUF figures: how fast a Qwen-sized vocabulary (151,936 tokens + 151,387 merges) parses, and,
// with --write, writing and re-opening a synthetic random-weight model of the Qwen3-0.6B shape
// (see bench/synthetic_model.h for the shape) through the streaming writer.
//
//   gguf_bench [--reps N] [--write PATH --dtype bf16|f32|q8_0|q4_0 [--vocab-dir DIR]]
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "format/gguf.h"
#include "format/model_file.h"
#include "synthetic_model.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GGUF parse / write figures"};
  int reps = 5;
  std::string write_path, dtype_name = "bf16", vocab_dir;
  app.add_option("--reps", reps, "parse repetitions")->capture_default_str();
  app.add_option("--write", write_path, "also write a synthetic Qwen3-0.6B-shaped GGUF here");
  app.add_option("--dtype", dtype_name, "weight dtype of the synthetic model: f32, bf16, q8_0, q4_0")
      ->capture_default_str();
  app.add_option("--vocab-dir", vocab_dir,
                 "folder with Qwen2 vocab.json + merges.txt (fixtures/tokenizers/qwen2) for a real "
                 "tokenizer; synthetic token strings otherwise");
  CLI11_PARSE(app, argc, argv);

  // 1. Parse speed of a vocabulary-sized metadata block.
  shoal::bench::SyntheticModelOptions vo;
  vo.n_layers = 0;
  vo.tensors = false;
  vo.vocab_dir = vocab_dir;
  auto vocab_only = shoal::bench::synthetic_qwen3_writer(vo);
  if (!vocab_only.ok()) {
    std::fprintf(stderr, "%s\n", vocab_only.status().to_string().c_str());
    return 1;
  }
  auto bytes = vocab_only->write_to_bytes();
  if (!bytes.ok()) {
    std::fprintf(stderr, "%s\n", bytes.status().to_string().c_str());
    return 1;
  }
  double best = 1e9;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto g = shoal::parse_gguf(bytes->data(), bytes->size(), "vocab");
    const double s = seconds_since(t0);
    if (!g.ok()) {
      std::fprintf(stderr, "%s\n", g.status().to_string().c_str());
      return 1;
    }
    best = std::min(best, s);
  }
  std::printf("parse vocab-only gguf (%s tokens): %.2f MB, 151936 tokens + merges: best of %d %.1f ms "
              "(%.0f MB/s)\n", vocab_dir.empty() ? "synthetic" : "qwen2", double(bytes->size()) / 1e6,
              reps, best * 1e3, double(bytes->size()) / 1e6 / best);

  // 2. Optional: write a full synthetic model, then open it.
  if (write_path.empty()) return 0;
  shoal::bench::SyntheticModelOptions mo;
  auto dt = shoal::dtype_from_name(dtype_name);
  if (!dt) {
    std::fprintf(stderr, "unknown dtype '%s'\n", dtype_name.c_str());
    return 1;
  }
  mo.weight_dtype = *dt;
  mo.vocab_dir = vocab_dir;
  auto w = shoal::bench::synthetic_qwen3_writer(mo);
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().to_string().c_str());
    return 1;
  }
  auto t0 = std::chrono::steady_clock::now();
  shoal::Status s = w->write(write_path);
  const double tw = seconds_since(t0);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  const double size = double(std::filesystem::file_size(write_path));
  std::printf("write %s: %.1f MB in %.2f s (%.0f MB/s)\n", write_path.c_str(), size / 1e6, tw,
              size / 1e6 / tw);
  t0 = std::chrono::steady_clock::now();
  auto m = shoal::open_model_file(write_path);
  const double to = seconds_since(t0);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().to_string().c_str());
    return 1;
  }
  std::printf("open: %zu tensors, %.1f MB of weights, %.1f ms\n", m->index.size(),
              double(m->index.total_bytes()) / 1e6, to * 1e3);
  return 0;
}
