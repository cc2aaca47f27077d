// The whole model as the host sees it: token ids in, head output out. A local pipeline is one
// slice with every layer; the pool's pipeline chains the host's slices and remote workers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "runtime/slice.h"

namespace shoal {

class Pipeline {
 public:
  virtual ~Pipeline() = default;
  virtual const ModelConfig& config() const = 0;
  /// Context length (KV positions) every stage holds.
  virtual int n_ctx() const = 0;
  /// Runs ids at positions pos0 .. pos0 + ids.size() - 1 through every layer; the head output
  /// follows out.mode (for kLogitsAll / kArgmaxAll: one row per id). Any number of ids: the
  /// pipeline splits them into steps. Errors: kOutOfRange (context), stage errors.
  virtual Status forward(std::span<const int32_t> ids, int64_t pos0, StepOutput& out) = 0;
  /// Drops positions >= pos in every stage.
  virtual Status rewind(int64_t pos) = 0;
  /// Decoding from `id` at pos0: each step's token (the argmax, or a draw from its top-k as
  /// `how` says) is the next step's input, for at most max_steps steps; on_token gets each id in
  /// order and returns false to stop. Returns the steps whose ids were delivered (positions
  /// pos0 .. pos0 + steps - 1 are then cached; a sampled step k used draw how.draw.draw + k).
  /// This default runs forward() per step and draws on the host; a pipeline whose whole model is
  /// one slice chains the steps on its device instead (Slice::decode: no host round trip
  /// between steps). Errors: check_decode_steps and check_decode_sampling (before any step runs),
  /// and as forward().
  virtual Result<int> decode(int32_t id, int64_t pos0, int max_steps, const DecodeSampling& how,
                             const std::function<bool(int32_t)>& on_token);
};

/// One slice holding the embedding, every layer and the head.
class LocalPipeline final : public Pipeline {
 public:
  explicit LocalPipeline(std::unique_ptr<Slice> slice) : slice_(std::move(slice)) {}
  const ModelConfig& config() const override { return slice_->config(); }
  int n_ctx() const override { return slice_->options().n_ctx; }
  Status forward(std::span<const int32_t> ids, int64_t pos0, StepOutput& out) override;
  Status rewind(int64_t pos) override {
    slice_->rewind(pos);
    return Status::Ok();
  }
  Result<int> decode(int32_t id, int64_t pos0, int max_steps, const DecodeSampling& how,
                     const std::function<bool(int32_t)>& on_token) override {
    return slice_->decode(id, pos0, max_steps, how, on_token);
  }
  Slice& slice() { return *slice_; }

 private:
  std::unique_ptr<Slice> slice_;
};

/// Splits ids into steps of at most `max_tokens` for `step(ids, pos0, out)`, running the head
/// only where out.mode needs it, and concatenates per-row outputs. Shared by every pipeline.
Status forward_in_steps(std::span<const int32_t> ids, int64_t pos0, int max_tokens, StepOutput& out,
                        const std::function<Status(std::span<const int32_t>, int64_t, StepOutput&)>& step);

/// Runs ids on one slice that holds the whole model (embedding to head), in steps of its
/// options().max_tokens: the one-process path of LocalPipeline and of a pool that plans the host alone.
Status forward_whole_slice(Slice& slice, std::span<const int32_t> ids, int64_t pos0, StepOutput& out);

}  // namespace shoal
