// synthetic_gguf: writes a random-weight GGUF with the exact tensor shapes of a real model, with
// the project's own GGUF writer, for benchmarks (decode/prefill speed depends on shapes and
// dtypes, not on the values). Weights are uniform with the variance of fan-in scaling; norms are
// near 1. Streamed: the file is never held in memory.
//
//   synthetic_gguf --shape qwen3-0.6b --type q8_0 -o qwen3-0.6b-q8_0.gguf
//   synthetic_gguf --shape llama3-8b --type q4_0 -o llama3-8b-q4_0.gguf
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>

#include "core/log.h"
#include "format/synthetic_gguf.h"

int main(int argc, char** argv) {
  CLI::App app{"Write a random-weight GGUF with the shapes of a real model (for benchmarks)"};
  std::string shape = "qwen3-0.6b", type = "q8_0", out;
  app.add_option("--shape", shape, "qwen3-0.6b or llama3-8b")->capture_default_str();
  app.add_option("--type", type, "Weight type of the matrices: f32, f16, bf16, q8_0, q4_0")->capture_default_str();
  app.add_option("-o,--output", out, "Output .gguf path")->required();
  CLI11_PARSE(app, argc, argv);
  shoal::init_logging("info");
  const shoal::SyntheticShape* s = shape == "qwen3-0.6b" ? &shoal::kQwen3_0_6B : shape == "llama3-8b" ? &shoal::kLlama3_8B : nullptr;
  auto dt = shoal::dtype_from_name(type);
  if (!s || !dt || !(*dt == shoal::DType::kF32 || *dt == shoal::DType::kF16 || *dt == shoal::DType::kBF16 ||
                     *dt == shoal::DType::kQ8_0 || *dt == shoal::DType::kQ4_0)) {
    std::fprintf(stderr, "synthetic_gguf: unknown --shape '%s' or --type '%s'\n", shape.c_str(), type.c_str());
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  shoal::Status st = shoal::write_synthetic_gguf(*s, *dt, out);
  if (!st.ok()) {
    std::fprintf(stderr, "synthetic_gguf: %s\n", st.to_string().c_str());
    return 1;
  }
  spdlog::info("wrote {} ({} {}) in {:.1f} s", out, shape, type,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}
