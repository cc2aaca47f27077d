// GGUF parse figures: how fast a Qwen-sized vocabulary block (151,936 tokens + their types +
// 151,387 merges) parses, and how long open_model_file takes on a given model (e.g. one written
// by synthetic_gguf). Tokens are Qwen2's real vocab.json + merges.txt when --vocab-dir is given
// (fixtures/tokenizers/qwen2), else synthetic strings of the same count.
//
//   gguf_bench [--reps N] [--vocab-dir DIR] [--open MODEL]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/mmap_file.h"
#include "format/gguf.h"
#include "format/model_file.h"

namespace shoal {
namespace {

constexpr int64_t kVocab = 151936;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// tokenizer.ggml.* arrays of the Qwen2/Qwen3 size.
Status add_vocab(GgufWriter& w, const std::string& dir) {
  std::vector<MetaValue> tokens, types, merges;
  if (!dir.empty()) {
    SHOAL_ASSIGN_OR_RETURN(std::string text, read_file(dir + "/vocab.json"));
    nlohmann::json vocab = nlohmann::json::parse(text, nullptr, false);
    if (!vocab.is_object()) return make_error(Code::kCorrupt, "'{}/vocab.json' is not an object", dir);
    std::vector<std::string> by_id(vocab.size());
    for (auto& [s, id] : vocab.items()) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() >= by_id.size()) {
        return make_error(Code::kCorrupt, "'{}/vocab.json': bad id for '{}'", dir, s);
      }
      by_id[id.get<size_t>()] = s;
    }
    for (auto& s : by_id) tokens.push_back(MetaValue::str(std::move(s)));
    std::ifstream mf(dir + "/merges.txt");
    for (std::string line; std::getline(mf, line);) {
      if (!line.empty() && line.rfind("#version", 0) != 0) merges.push_back(MetaValue::str(line));
    }
  } else {
    for (int64_t i = 0; i < 151643; ++i) tokens.push_back(MetaValue::str("tok" + std::to_string(i)));
    for (int64_t i = 256; i < 151643; ++i) {
      merges.push_back(MetaValue::str("tok" + std::to_string(i % 256) + " tok" + std::to_string(i / 256)));
    }
  }
  while (int64_t(tokens.size()) < kVocab) tokens.push_back(MetaValue::str("[PAD" + std::to_string(tokens.size()) + "]"));
  for (int64_t i = 0; i < kVocab; ++i) types.push_back(MetaValue::i32(1));
  w.set("tokenizer.ggml.model", MetaValue::str("gpt2"));
  w.set("tokenizer.ggml.tokens", MetaValue::array(MetaType::kString, std::move(tokens)));
  w.set("tokenizer.ggml.token_type", MetaValue::array(MetaType::kI32, std::move(types)));
  w.set("tokenizer.ggml.merges", MetaValue::array(MetaType::kString, std::move(merges)));
  return Status::Ok();
}

int run(int reps, const std::string& vocab_dir, const std::string& open_path) {
  GgufWriter w;
  if (Status s = add_vocab(w, vocab_dir); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  auto bytes = w.write_to_bytes();
  if (!bytes.ok()) {
    std::fprintf(stderr, "%s\n", bytes.status().to_string().c_str());
    return 1;
  }
  double best = 1e9, best_cpu = 1e9;  // wall and process CPU time (the machine may be shared)
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    auto g = parse_gguf(bytes->data(), bytes->size(), "vocab");
    best_cpu = std::min(best_cpu, double(std::clock() - c0) / CLOCKS_PER_SEC);
    best = std::min(best, seconds_since(t0));
    if (!g.ok()) {
      std::fprintf(stderr, "%s\n", g.status().to_string().c_str());
      return 1;
    }
  }
  std::printf("parse vocab block (%s tokens, %.2f MB): best of %d: %.1f ms wall, %.1f ms CPU "
              "(%.0f MB/s of CPU time)\n", vocab_dir.empty() ? "synthetic" : "qwen2",
              double(bytes->size()) / 1e6, reps, best * 1e3, best_cpu * 1e3,
              double(bytes->size()) / 1e6 / best_cpu);
  if (open_path.empty()) return 0;
  auto t0 = std::chrono::steady_clock::now();
  auto m = open_model_file(open_path);
  const double t = seconds_since(t0);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().to_string().c_str());
    return 1;
  }
  std::printf("open %s: %zu tensors, %.1f MB of weights, %zu metadata keys: %.1f ms\n",
              open_path.c_str(), m->index.size(), double(m->index.total_bytes()) / 1e6,
              m->metadata.size(), t * 1e3);
  return 0;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  CLI::App app{"GGUF parse figures"};
  int reps = 5;
  std::string vocab_dir, open_path;
  app.add_option("--reps", reps, "parse repetitions")->capture_default_str();
  app.add_option("--vocab-dir", vocab_dir, "folder with Qwen2 vocab.json + merges.txt");
  app.add_option("--open", open_path, "also time open_model_file on this model");
  CLI11_PARSE(app, argc, argv);
  return shoal::run(reps, vocab_dir, open_path);
}
