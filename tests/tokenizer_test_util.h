// Helpers for the tokenizer tests: llama.cpp's golden .inp/.out vectors.
#pragma once

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace shoal::test {

/// The tokenizer of fixture file `rel` (e.g. "models/stories260K.gguf"); null, with a failed
/// expectation naming the file, if it does not load.
inline std::unique_ptr<Tokenizer> load_tokenizer_fixture(const std::string& rel) {
  auto t = load_tokenizer_from_path(fixture(rel));
  EXPECT_TRUE(t.ok()) << rel << ": " << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// One test string and the ids llama.cpp expects for it (no BOS, parse_special false).
struct GoldenCase {
  std::string text;
  std::vector<int32_t> ids;
};

/// Reads `<base>.inp` / `<base>.out` (format: fixtures/SOURCES.md). Strings are separated by
/// "\n__ggml_vocab_test__\n"; a separator that closes the file ends the last string.
inline std::vector<GoldenCase> read_golden(const std::string& base) {
  const std::string inp = slurp(base + ".inp");
  const std::string out = slurp(base + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  while (true) {
    const size_t hit = inp.find(sep, pos);
    if (hit == std::string::npos) {
      if (pos < inp.size()) texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  std::vector<GoldenCase> cases;
  std::istringstream lines(out);
  std::string line;
  for (const std::string& t : texts) {
    if (!std::getline(lines, line)) break;
    GoldenCase c{t, {}};
    std::istringstream nums(line);
    int64_t id;
    while (nums >> id) c.ids.push_back(int32_t(id));
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace shoal::test
