// A test adapter: any pipeline, decoding through Pipeline's default decode() (one forward() per
// step, draws on the host), to compare with the pipeline's own (chained) decode.
#pragma once

#include <vector>

#include "runtime/pipeline.h"

namespace shoal::test {

class StepwisePipeline final : public Pipeline {
 public:
  explicit StepwisePipeline(Pipeline& p) : p_(p) {}
  const ModelConfig& config() const override { return p_.config(); }
  int n_ctx() const override { return p_.n_ctx(); }
  Status forward(std::span<const int32_t> ids, int64_t pos0, StepOutput& out) override {
    return p_.forward(ids, pos0, out);
  }
  Status rewind(int64_t pos) override { return p_.rewind(pos); }

 private:
  Pipeline& p_;
};

/// The greedy token after `prompt` (prefilled from position 0), -1 on error.
inline int32_t prefill_argmax(Pipeline& p, const std::vector<int32_t>& prompt) {
  StepOutput out;
  out.mode = HeadMode::kArgmaxLast;
  return p.forward(prompt, 0, out).ok() ? out.ids.at(0) : -1;
}

/// Collects ids into v; false (stop) once v holds stop_at.
inline auto collect(std::vector<int32_t>& v, size_t stop_at) {
  return [&v, stop_at](int32_t id) {
    v.push_back(id);
    return v.size() < stop_at;
  };
}

/// Sampled decoding as the CLI's defaults (top-k 40, temperature 0.8, top-p 0.95, min-p 0.05).
inline DecodeSampling sampled(uint64_t seed, uint64_t first_draw) {
  DecodeSampling how;
  how.greedy = false;
  how.top_k = 40;
  how.draw = DeviceSampling{0.8f, 0.95f, 0.05f, 0, seed, first_draw};
  return how;
}

}  // namespace shoal::test
