#include "pool/pool_pipeline.h"

#include <thread>

#include "core/log.h"

namespace shoal::pool {
namespace {

constexpr Millis kWatchSlice{20};     // how often a waiting forward() looks at the stages
constexpr Millis kBlameWindow{500};   // after a hop fails, how long to wait for the worker at fault

DType to_dtype(HopDType t) { return t == HopDType::kF16 ? DType::kF16 : DType::kF32; }

}  // namespace

PoolPipeline::PoolPipeline(ModelFile& file, const ModelConfig& cfg, const WeightMap& weights, Backend& backend,
                           SliceOptions slice_opts, HopDType hop_dtype, LoadProgress progress)
    : file_(file),
      cfg_(cfg),
      weights_(weights),
      backend_(backend),
      opts_(slice_opts),
      hop_dtype_(hop_dtype),
      progress_(std::move(progress)) {}

PoolPipeline::~PoolPipeline() { clear_chain("the host is shutting down"); }

uint64_t PoolPipeline::weight_bytes() const {
  return (host_ ? host_->weight_bytes() : 0) + (head_ ? head_->weight_bytes() : 0);
}

Status PoolPipeline::set_local(int n_local, bool alone) {
  const SliceSpec spec{0, n_local, true, alone};
  const auto& cur = host_ ? host_->spec() : SliceSpec{};
  if (host_ && cur.end == spec.end && cur.head == spec.head) {
    host_->rewind(0);
  } else {
    host_.reset();
    SliceOptions so = opts_;
    so.max_tokens = std::max(opts_.max_tokens, kFrameTokens);
    auto s = Slice::load(file_, cfg_, weights_, spec, so, backend_, progress_);
    if (!s.ok()) return s.status().with_context(fmt::format("loading the host's layers 0-{}", n_local - 1));
    host_ = std::move(*s);
  }
  alone_ = alone;
  if (alone) {
    head_.reset();
  } else if (!head_) {
    SliceOptions so = opts_;
    so.max_tokens = kFrameTokens;
    auto s = Slice::load(file_, cfg_, weights_, SliceSpec{cfg_.n_layers, cfg_.n_layers, false, true}, so, backend_);
    if (!s.ok()) return s.status().with_context("loading the host's head");
    head_ = std::move(*s);
  } else {
    head_->rewind(0);
  }
  return Status::Ok();
}

void PoolPipeline::set_chain(Chain chain) {
  clear_chain("the host sets up a new plan");
  chain_ = std::move(chain);
  broken_ = false;
}

void PoolPipeline::clear_chain(std::string_view reason) {
  if (chain_.out) chain_.out->close(reason);
  if (chain_.in) chain_.in->close(reason);
  chain_ = Chain{};
}

Status PoolPipeline::dead_stage() const {
  for (const RemoteStage& s : chain_.stages) {
    if (Status st = s.control->status(); !st.ok()) {
      return make_error(Code::kUnavailable, "{} failed: {}", s.label, st.message());
    }
  }
  return Status::Ok();
}

Status PoolPipeline::stage_error() {
  for (const RemoteStage& s : chain_.stages) {
    auto m = s.control->recv(Millis(0));
    if (!m.ok()) continue;
    if (m->type == MsgType::kError) {
      auto e = pool::decode<ErrorMsg>(*m);
      return e.ok() ? e->to_status(s.label) : e.status().with_context(s.label);
    }
    spdlog::warn("{}: ignoring a {} message during a request", s.label, msg_type_name(m->type));
  }
  return Status::Ok();
}

Status PoolPipeline::check_stages() {
  if (Status st = dead_stage(); !st.ok()) {
    broken_ = true;
    return st.with_context("the request failed");
  }
  if (Status st = stage_error(); !st.ok()) return fail(st);
  for (Link* l : {chain_.out.get(), chain_.in.get()}) {
    if (Status st = l->status(); !st.ok()) return fail(st);
  }
  return Status::Ok();
}

Status PoolPipeline::fail(const Status& why) {
  broken_ = true;
  // A hop breaks, or a worker cannot send on, usually because another worker died: its control
  // link says which one soon after, and that is the error worth reporting.
  Status reported;  // the first ERROR a worker sent
  const auto until = Clock::now() + kBlameWindow;
  while (Clock::now() < until) {
    if (Status st = dead_stage(); !st.ok()) return st.with_context("the request failed");
    if (reported.ok()) reported = stage_error();
    std::this_thread::sleep_for(kWatchSlice);
  }
  return (reported.ok() ? why : reported).with_context("the request failed");
}

Status PoolPipeline::rewind(int64_t pos) {
  if (host_) host_->rewind(pos);
  if (head_) head_->rewind(pos);
  if (alone_ || !chain_.out || broken_) return Status::Ok();
  if (Status st = chain_.out->send(encode(Rewind{chain_.epoch, uint32_t(pos)})); !st.ok()) return fail(st);
  return Status::Ok();
}

Status PoolPipeline::forward(std::span<const int32_t> ids, int64_t pos0, StepOutput& out) {
  if (!ready()) {
    return make_error(Code::kFailedPrecondition, "{}",
                      broken_ ? "the pool's chain failed; the host must plan again" : "the pool has no plan yet");
  }
  if (alone_) return forward_whole_slice(*host_, ids, pos0, out);
  if (ids.empty()) return make_error(Code::kInvalidArgument, "no tokens to run");
  if (pos0 < 0 || pos0 + int64_t(ids.size()) > opts_.n_ctx) {
    return make_error(Code::kOutOfRange, "positions {}..{} exceed the context of {} tokens", pos0,
                      pos0 + int64_t(ids.size()) - 1, opts_.n_ctx);
  }
  Status st = forward_chain(ids, pos0, out);
  if (!st.ok()) broken_ = true;  // frames may still be in flight: this chain cannot be trusted
  return st;
}

Result<int> PoolPipeline::decode(int32_t id, int64_t pos0, int max_steps, const DecodeSampling& how,
                                 const std::function<bool(int32_t)>& on_token) {
  if (ready() && alone_) return host_->decode(id, pos0, max_steps, how, on_token);
  return Pipeline::decode(id, pos0, max_steps, how, on_token);
}

Status PoolPipeline::send_frame(std::span<const int32_t> ids, int64_t pos, FrameKind kind, uint8_t flags) {
  const int n = int(ids.size());
  FrameHeader h;
  h.seq = chain_.epoch;
  h.pos = uint32_t(pos);
  h.n_tokens = uint16_t(n);
  h.kind = kind;
  h.flags = flags;
  h.dtype = hop_dtype_;
  Message m = encode_frame(h, {});
  m.payload.resize(kFrameHeaderSize + size_t(n) * size_t(cfg_.d_model) * hop_dtype_size(hop_dtype_));
  StepInput in;
  in.n = n;
  in.pos0 = pos;
  in.ids = ids.data();
  StepOutput o;
  o.hidden = m.payload.data() + kFrameHeaderSize;
  o.hidden_dtype = to_dtype(hop_dtype_);
  SHOAL_RETURN_IF_ERROR(host_->forward(in, o));
  if (Status st = chain_.out->send(m); !st.ok()) return fail(st);
  return Status::Ok();
}

Status PoolPipeline::forward_chain(std::span<const int32_t> ids, int64_t pos0, StepOutput& out) {
  const bool per_row = out.mode == HeadMode::kLogitsAll || out.mode == HeadMode::kArgmaxAll;
  const size_t n_frames = (ids.size() + kFrameTokens - 1) / kFrameTokens;
  const FrameKind kind = ids.size() == 1 ? FrameKind::kDecode : FrameKind::kPrefill;
  // The rows the head reads of each frame: all of them, or (when every worker can keep rows) the
  // last frame's last row and none of the others, so the last worker computes and sends no more.
  auto flags_of = [&](bool last) -> uint8_t {
    if (out.mode == HeadMode::kLogitsAll) return kFrameWantAllLogits;
    if (per_row || !chain_.keep_rows) return 0;
    return last && out.mode != HeadMode::kNone ? kFrameHeadReadsLast : kFrameHeadReadsNone;
  };
  const FrameLimits limits{uint32_t(cfg_.d_model), uint32_t(opts_.n_ctx)};
  std::vector<float> logits;
  std::vector<int32_t> row_ids;
  size_t sent = 0, done = 0;
  while (done < n_frames) {
    for (; sent < n_frames && sent - done < size_t(kFramesInFlight); ++sent) {
      const size_t first = sent * kFrameTokens, n = std::min<size_t>(kFrameTokens, ids.size() - first);
      const uint8_t flags = flags_of(sent + 1 == n_frames);
      SHOAL_RETURN_IF_ERROR(send_frame(ids.subspan(first, n), pos0 + int64_t(first), kind, flags));
    }
    auto m = chain_.in->recv(kWatchSlice);
    if (!m.ok()) {
      if (m.status().code() != Code::kDeadlineExceeded) return fail(m.status());
      SHOAL_RETURN_IF_ERROR(check_stages());
      continue;
    }
    if (m->type == MsgType::kRewind) continue;  // a rewind that went around the chain
    auto f = decode_frame(*m, limits);
    if (!f.ok()) return fail(f.status().with_context(chain_.in->name()));
    const size_t first = done * kFrameTokens, n = std::min<size_t>(kFrameTokens, ids.size() - first);
    const FrameHeader& h = f->header;
    const bool last = done + 1 == n_frames;
    const uint8_t sent_flags = flags_of(last);
    if (h.seq != chain_.epoch || int64_t(h.pos) != pos0 + int64_t(first) || h.n_tokens != n ||
        (h.flags & ~kFrameRowsKept) != sent_flags) {
      return fail(make_error(Code::kCorrupt,
                             "{} returned frame seq {} at {} x {} tokens, flags 0x{:02x}; expected seq {} at {} x {}, "
                             "flags 0x{:02x} (bit 3, rows kept, may be added)",
                             chain_.in->name(), h.seq, h.pos, h.n_tokens, h.flags, chain_.epoch,
                             pos0 + int64_t(first), n, sent_flags));
    }
    // Rows kept by the last worker are the frame's last ones (frame_rows).
    const int rows = frame_rows(h);
    StepOutput part;
    part.mode = (last || per_row) ? out.mode : HeadMode::kNone;
    part.top_k = out.top_k;
    if (rows < head_rows(part.mode, int(n))) {
      return fail(make_error(Code::kCorrupt, "{} returned {} rows of a {}-token frame whose head reads {}",
                             chain_.in->name(), rows, n, head_rows(part.mode, int(n))));
    }
    StepInput in;
    in.n = rows;
    in.pos0 = int64_t(h.pos) + int64_t(n) - rows;
    in.hidden = f->data.data();
    in.hidden_dtype = to_dtype(h.dtype);
    if (rows > 0) SHOAL_RETURN_IF_ERROR(head_->forward(in, part));
    if (per_row) {
      logits.insert(logits.end(), part.logits.begin(), part.logits.end());
      row_ids.insert(row_ids.end(), part.ids.begin(), part.ids.end());
    } else if (last) {
      logits = std::move(part.logits);
      row_ids = std::move(part.ids);
    }
    ++done;
  }
  out.logits = std::move(logits);
  out.ids = std::move(row_ids);
  return Status::Ok();
}

}  // namespace shoal::pool
