// A conversation with a model: prompt in, generated tokens out, streamed one by one. Keeps the
// tokens whose KV is cached so a follow-up prompt that extends them only prefills the new part
// (as llama.cpp's server does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/pipeline.h"
#include "runtime/sampler.h"

namespace shoal {

struct GenerateOptions {
  int n_predict = -1;  // tokens to generate; -1: until end of generation or a full context
  SamplingParams sampling;
  bool stop_at_eog = true;
};

struct GenerateStats {
  int n_prompt = 0;     // prompt tokens
  int n_reused = 0;     // prompt tokens whose KV was already cached
  int n_generated = 0;
  double prefill_s = 0;  // seconds to process the prompt (up to the first token)
  double decode_s = 0;   // seconds for the rest
  bool hit_eog = false;
  bool hit_context = false;
};

/// Called with each generated id; return false to stop.
using TokenCallback = std::function<bool(int32_t id)>;

/// Whether a prompt of n_prompt tokens leaves at least one position of a context of n_ctx tokens
/// free for the answer. Errors: kInvalidArgument (empty prompt), kOutOfRange (too long, saying so).
Status check_prompt_fits(size_t n_prompt, int64_t n_ctx);

class Session {
 public:
  /// is_eog: which ids end generation (from the tokenizer); may be empty.
  Session(Pipeline& pipeline, std::function<bool(int32_t)> is_eog)
      : pipeline_(pipeline), is_eog_(std::move(is_eog)) {}

  /// Generates a continuation of `prompt`. Errors: kOutOfRange when the prompt does not fit the
  /// context (naming both lengths), kInvalidArgument for an empty prompt, pipeline errors (the
  /// cache is then dropped so the next call starts clean).
  Result<std::vector<int32_t>> generate(std::span<const int32_t> prompt, const GenerateOptions& opts,
                                        const TokenCallback& on_token, GenerateStats* stats = nullptr);
  /// Forgets the cached tokens.
  void reset();
  const std::vector<int32_t>& cached() const { return cached_; }

 private:
  Status step(std::span<const int32_t> ids, int64_t pos0, Sampler& sampler, int32_t& next);

  Pipeline& pipeline_;
  std::function<bool(int32_t)> is_eog_;
  std::vector<int32_t> cached_;
};

}  // namespace shoal
