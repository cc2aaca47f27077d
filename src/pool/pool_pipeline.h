// The whole model as the pool's host sees it (a runtime Pipeline): the host's own slice (embedding
// + its layers), the remote stages of the chain host -> w1 -> ... -> wN -> host, and the host's
// head slice (final norm + LM head, no layers). With no workers the host's slice holds everything
// and the pipeline is a plain local one.
//
// forward() cuts the tokens into frames of at most kFrameTokens and keeps up to kFramesInFlight
// of them around the chain, so that while the workers run frame i the host already embeds frame
// i+1 (prefill as a pipeline); a single token is one decode lap. Only frames whose output is asked
// for run the head (the last one, or all for kLogitsAll / kArgmaxAll); the sampled token never
// leaves the host. While it waits for frames it watches every stage: a worker whose connection
// closes or goes silent for dead-after, or that reports an ERROR, ends the call at once with an
// error naming the worker and its layer range; the pipeline is then broken() until the host sets
// up a new chain.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pool/chain.h"
#include "pool/link.h"
#include "runtime/pipeline.h"

namespace shoal::pool {

/// A remote stage as the pipeline watches it.
struct RemoteStage {
  std::string label;       // "worker 'w1' (layers 2-3)"
  Link* control = nullptr; // its control link (owned by the host, outlives the chain)
};

/// The chain of one plan.
struct Chain {
  uint64_t epoch = 0;
  std::unique_ptr<Link> out;        // host -> first worker
  std::unique_ptr<Link> in;         // last worker -> host
  std::vector<RemoteStage> stages;  // chain order
  bool keep_rows = false;           // every worker announced kCapKeepRows: frames say which rows the head reads
};

class PoolPipeline final : public Pipeline {
 public:
  /// Borrows the model and the backend (they outlive the pipeline). `slice_opts` are the host
  /// slice's (context, KV type, prefill step); `progress` shows loads.
  PoolPipeline(ModelFile& file, const ModelConfig& cfg, const WeightMap& weights, Backend& backend,
               SliceOptions slice_opts, HopDType hop_dtype, LoadProgress progress = {});
  ~PoolPipeline() override;

  const ModelConfig& config() const override { return cfg_; }
  int n_ctx() const override { return opts_.n_ctx; }
  /// Errors: kOutOfRange (context), kFailedPrecondition (no plan yet, or broken), kUnavailable
  /// (a stage failed: named with its layers), stage ERRORs, slice errors.
  Status forward(std::span<const int32_t> ids, int64_t pos0, StepOutput& out) override;
  /// Rewinds the host's slices and sends REWIND along the chain.
  Status rewind(int64_t pos) override;
  /// Chained on the device when the host runs the whole model alone; per step over the chain.
  Result<int> decode(int32_t id, int64_t pos0, int max_steps, const DecodeSampling& how,
                     const std::function<bool(int32_t)>& on_token) override;

  /// Loads the host's part: the embedding and layers [0, n_local), plus the head when `alone`
  /// (no workers). Slices whose layer range is unchanged are kept (their caches rewound).
  Status set_local(int n_local, bool alone);
  /// Takes the chain of a new plan (after set_local(.., false)).
  void set_chain(Chain chain);
  /// Closes the chain's hops (before a new plan), saying why.
  void clear_chain(std::string_view reason = "the host sets up a new plan");
  /// True after a chain failure, until the next set_chain.
  bool broken() const { return broken_; }
  bool ready() const { return host_ != nullptr && (alone_ || (chain_.out && chain_.in && !broken_)); }
  HopDType hop_dtype() const { return hop_dtype_; }
  /// Bytes of weights the host's slices hold on its backend.
  uint64_t weight_bytes() const;

 private:
  /// Sends ids around the chain in frames of kFrameTokens (kFramesInFlight at once) and runs the
  /// head on what comes back: with chain_.keep_rows, only the rows the head reads come back.
  /// Errors: kCorrupt (a frame back with another seq, position, count or flags), link errors.
  Status forward_chain(std::span<const int32_t> ids, int64_t pos0, StepOutput& out);
  Status send_frame(std::span<const int32_t> ids, int64_t pos, FrameKind kind, uint8_t flags);
  // The first remote stage whose control link is down, named; Ok if none.
  Status dead_stage() const;
  // The first ERROR a remote stage sent, named; Ok if none.
  Status stage_error();
  // Ok while every stage and hop is up and no stage reported an error; else the failure.
  Status check_stages();
  // Marks the chain broken and returns the failure, naming the worker at fault when one is.
  Status fail(const Status& why);

  ModelFile& file_;
  const ModelConfig& cfg_;
  const WeightMap& weights_;
  Backend& backend_;
  SliceOptions opts_;
  HopDType hop_dtype_;
  LoadProgress progress_;
  std::unique_ptr<Slice> host_;  // embedding + layers [0, n_local) (+ head when alone)
  std::unique_ptr<Slice> head_;  // final norm + LM head, when there is a chain
  bool alone_ = false;
  Chain chain_;
  bool broken_ = false;
};

}  // namespace shoal::pool
