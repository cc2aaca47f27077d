#include "runtime/slice.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <numeric>
#include <span>
#include <unordered_set>
#include <vector>

#include "core/log.h"
#include "model/rope.h"

namespace shoal {

namespace {

struct Need {
  std::string name;
  WeightRole role;
  Tensor* dst;
  std::vector<int64_t> shape;  // expected shape (outermost first)
  bool required;
  int group = 0;  // > 1: this tensor and the next group - 1 in one allocation (q, k, v; gate, up)
};

Status check_shape(const TensorInfo& t, const std::vector<int64_t>& want) {
  if (t.shape != want) {
    std::string w = "[";
    for (size_t i = 0; i < want.size(); ++i) w += fmt::format("{}{}", i ? ", " : "", want[i]);
    return make_error(Code::kCorrupt, "tensor '{}' has shape {}, expected {}", t.name, t.shape_string(), w + "]");
  }
  return Status::Ok();
}

/// The tensors one layer needs, with their expected shapes.
std::vector<Need> layer_needs(const ModelConfig& cfg, int l, LayerWeights& w) {
  const LayerConfig& L = cfg.layers[size_t(l)];
  const int64_t d = cfg.d_model, qw = int64_t(L.n_heads) * L.head_dim, kw = int64_t(L.n_kv_heads) * L.head_dim;
  const bool ln = cfg.norm == NormKind::kLayer;
  auto n = [&](std::string_view s) { return layer_tensor(l, s); };
  std::vector<Need> v = {
      {n("attn_norm.weight"), WeightRole::kVector, &w.attn_norm, {d}, true},
      {n("attn_norm.bias"), WeightRole::kVector, &w.attn_norm_b, {d}, ln},
      {n("attn_q.weight"), WeightRole::kMatrix, &w.wq, {qw, d}, true, 3},
      {n("attn_k.weight"), WeightRole::kMatrix, &w.wk, {kw, d}, true},
      {n("attn_v.weight"), WeightRole::kMatrix, &w.wv, {kw, d}, true},
      {n("attn_output.weight"), WeightRole::kMatrix, &w.wo, {d, qw}, true},
      {n("attn_q.bias"), WeightRole::kVector, &w.bq, {qw}, cfg.attn_bias},
      {n("attn_k.bias"), WeightRole::kVector, &w.bk, {kw}, cfg.attn_bias},
      {n("attn_v.bias"), WeightRole::kVector, &w.bv, {kw}, cfg.attn_bias},
      {n("attn_output.bias"), WeightRole::kVector, &w.bo, {d}, cfg.attn_out_bias},
      {n("ffn_up.weight"), WeightRole::kMatrix, &w.w_up, {L.d_ff, d}, true},  // (after the gate, below)
      {n("ffn_down.weight"), WeightRole::kMatrix, &w.w_down, {d, L.d_ff}, true},
      {n("ffn_down.bias"), WeightRole::kVector, &w.b_down, {d}, cfg.ffn_bias},
  };
  // (A gated FFN's gate / up take no bias: a file that has them is refused, or warned of as unread.)
  if (!cfg.gated_ffn) v.push_back({n("ffn_up.bias"), WeightRole::kVector, &w.b_up, {L.d_ff}, cfg.ffn_bias});
  if (cfg.qk_norm) {
    v.push_back({n("attn_q_norm.weight"), WeightRole::kVector, &w.q_norm, {L.head_dim}, true});
    v.push_back({n("attn_k_norm.weight"), WeightRole::kVector, &w.k_norm, {L.head_dim}, true});
  }
  if (!cfg.parallel_block) {
    v.push_back({n("ffn_norm.weight"), WeightRole::kVector, &w.ffn_norm, {d}, true});
    v.push_back({n("ffn_norm.bias"), WeightRole::kVector, &w.ffn_norm_b, {d}, ln});
  }
  if (cfg.gated_ffn) {  // the gate right before up, both in one allocation
    const auto up = std::find_if(v.begin(), v.end(), [&](const Need& x) { return x.dst == &w.w_up; });
    v.insert(up, {n("ffn_gate.weight"), WeightRole::kMatrix, &w.w_gate, {L.d_ff, d}, true, 2});
  }
  if (cfg.post_norms) {
    v.push_back({n("post_attention_norm.weight"), WeightRole::kVector, &w.post_attn_norm, {d}, true});
    v.push_back({n("post_ffw_norm.weight"), WeightRole::kVector, &w.post_ffn_norm, {d}, true});
  }
  return v;
}

uint64_t kv_row_bytes(DType kv, int64_t width) { return dtype_bytes(kv, width).value_or(0); }

// K and V cache bytes of one layer at n_ctx positions.
uint64_t layer_kv_bytes(const LayerConfig& L, int n_ctx, DType kv_dtype) {
  return 2 * uint64_t(n_ctx) * kv_row_bytes(kv_dtype, int64_t(L.n_kv_heads) * L.head_dim);
}

// K and V cache bytes of layers [first, end) at n_ctx positions.
uint64_t slice_kv_bytes(const ModelConfig& cfg, int first, int end, int n_ctx, DType kv_dtype) {
  uint64_t kv = 0;
  for (int l = first; l < end; ++l) kv += layer_kv_bytes(cfg.layers[size_t(l)], n_ctx, kv_dtype);
  return kv;
}

// A device backend (CUDA): the slice's weights and KV cache against the device's free memory,
// before anything is allocated, so that a slice too large is refused with the whole need rather
// than by the tensor that would have hit the limit (half the model loaded). Activation buffers and
// the backend's own scratch are left out (small): the activations are allocated next, the scratch
// by Slice::warm_up, and an allocation that fails names its size and the free memory.
// CPU backends are not checked: their free memory (MemAvailable) ignores swap and mmap'd pages.
Status check_device_fits(const ModelConfig& cfg, const WeightMap& weights, const SliceSpec& spec,
                         const SliceOptions& opts, Backend& backend) {
  if (backend.kind() == DeviceKind::kCpu) return Status::Ok();
  SHOAL_ASSIGN_OR_RETURN(const std::vector<uint64_t> per_layer, layer_bytes(cfg, weights, opts.n_ctx, opts.kv_dtype));
  SHOAL_ASSIGN_OR_RETURN(uint64_t need, global_bytes(cfg, weights, spec.embed, spec.head));
  const uint64_t kv = slice_kv_bytes(cfg, spec.first, spec.end, opts.n_ctx, opts.kv_dtype);
  for (int l = spec.first; l < spec.end; ++l) need += per_layer[size_t(l)];
  const uint64_t free_bytes = backend.free_memory();
  if (need <= free_bytes || free_bytes == 0) return Status::Ok();  // 0: not known (the allocations will say)
  std::string what = spec.first < spec.end ? fmt::format("layers {}-{}", spec.first, spec.end - 1) : "no layers";
  if (spec.embed) what += ", the embedding";
  if (spec.head) what += ", the head";
  return make_error(Code::kOutOfMemory,
                    "this slice ({}) needs {} on {} ({} of weights, {} of KV cache for {} positions in {}) but it "
                    "has {} free; lower -c, take --kv q8_0, or spread the model over a pool",
                    what, format_bytes(need), backend.name(), format_bytes(need - kv), format_bytes(kv), opts.n_ctx,
                    dtype_name(opts.kv_dtype), format_bytes(free_bytes));
}

}  // namespace

Result<Tensor> Slice::alloc(std::initializer_list<int64_t> shape, DType dtype) {
  SHOAL_ASSIGN_OR_RETURN(Tensor t, backend_.alloc(dtype, shape));
  owned_.push_back(t);
  return t;
}

Slice::~Slice() {
  backend_.drop_graphs(graph_owner_);  // they use these buffers
  for (Tensor& t : owned_) backend_.free(t);
}

uint64_t Slice::next_graph_owner() {
  static std::atomic<uint64_t> next{1};  // 0: callers without an owner (benchmarks, tests)
  return next.fetch_add(1, std::memory_order_relaxed);
}

Status Slice::plan_weights(WeightLoader& loader, const WeightMap& weights) {
  auto add = [&](const Need& need) -> Status {
    const TensorInfo* t = weights.find(need.name);
    if (!t) {
      if (need.required) return weights.missing(need.name);
      return Status::Ok();
    }
    SHOAL_RETURN_IF_ERROR(check_shape(*t, need.shape));
    SHOAL_RETURN_IF_ERROR(loader.add(*t, need.role, *need.dst));
    owned_.push_back(*need.dst);
    return Status::Ok();
  };
  // A layer's q / k / v, and its gate / up, in one allocation each (WeightLoader::add_matrices):
  // the CUDA backend's prefill computes weights that lie back to back in one GEMM.
  auto add_group = [&](std::span<const Need> group) -> Status {
    std::vector<const TensorInfo*> infos;
    std::vector<Tensor*> dsts;
    for (const Need& need : group) {
      infos.push_back(weights.find(need.name));
      dsts.push_back(need.dst);
    }
    if (std::find(infos.begin(), infos.end(), nullptr) != infos.end()) {  // one add() each: the
      for (const Need& need : group) SHOAL_RETURN_IF_ERROR(add(need));    // error of a missing one
      return Status::Ok();
    }
    for (size_t i = 0; i < group.size(); ++i) SHOAL_RETURN_IF_ERROR(check_shape(*infos[i], group[i].shape));
    const Status s = loader.add_matrices(infos, dsts);
    for (const Need& need : group)
      if (need.dst->data) owned_.push_back(*need.dst);  // (also those allocated before an error)
    return s;
  };
  const int64_t d = cfg_.d_model, vocab = cfg_.vocab_size;
  layers_.resize(size_t(spec_.end - spec_.first));
  for (int l = spec_.first; l < spec_.end; ++l) {
    const std::vector<Need> needs = layer_needs(cfg_, l, layers_[size_t(l - spec_.first)]);
    for (size_t i = 0; i < needs.size(); ++i) {
      if (needs[i].group > 1) {  // q, then k and v; gate, then up (layer_needs)
        const size_t count = std::min(size_t(needs[i].group), needs.size() - i);
        SHOAL_RETURN_IF_ERROR(add_group(std::span<const Need>(needs).subspan(i, count)));
        i += count - 1;
      } else {
        SHOAL_RETURN_IF_ERROR(add(needs[i]));
      }
    }
  }
  if (spec_.end > spec_.first)
    SHOAL_RETURN_IF_ERROR(add({"rope_freqs.weight", WeightRole::kVector, &global_.rope_freqs, {cfg_.rope.rot_dims / 2}, false}));
  if (spec_.embed) SHOAL_RETURN_IF_ERROR(add({"token_embd.weight", WeightRole::kMatrix, &global_.token_embd, {vocab, d}, true}));
  if (spec_.head) {
    const bool ln = cfg_.norm == NormKind::kLayer;
    SHOAL_RETURN_IF_ERROR(add({"output_norm.weight", WeightRole::kVector, &global_.output_norm, {d}, true}));
    SHOAL_RETURN_IF_ERROR(add({"output_norm.bias", WeightRole::kVector, &global_.output_norm_b, {d}, ln}));
    if (!cfg_.tied_embeddings) {
      SHOAL_RETURN_IF_ERROR(add({"output.weight", WeightRole::kMatrix, &global_.output, {vocab, d}, true}));
    } else if (spec_.embed) {
      // global_.output = token_embd after the load (Slice::load): the upload may change its dtype.
    } else {
      SHOAL_RETURN_IF_ERROR(add({"token_embd.weight", WeightRole::kMatrix, &global_.output, {vocab, d}, true}));
    }
  }
  return Status::Ok();
}

Status Slice::settle_weights() {
  int bf16 = 0, held = 0;
  auto settle = [&](std::span<Tensor* const> group) -> Status {
    for (const Tensor* t : group) bf16 += t->data && t->dtype == DType::kBF16;
    SHOAL_ASSIGN_OR_RETURN(const int n, backend_.settle_weights(group));
    held += n;
    return Status::Ok();
  };
  for (LayerWeights& w : layers_) {
    Tensor* const m[] = {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down};
    SHOAL_RETURN_IF_ERROR(settle(m));
  }
  for (Tensor* t : {&global_.token_embd, &global_.output}) SHOAL_RETURN_IF_ERROR(settle({&t, 1}));
  if (bf16 > 0 && backend_.kind() != DeviceKind::kCpu)
    spdlog::info("{}: {} of {} BF16 matrices held as F16 (each row to 2^-20; SHOAL_CUDA_BF16_AS_F16=0 keeps BF16)",
                 backend_.name(), held, bf16);
  return Status::Ok();
}

Status Slice::alloc_buffers() {
  const int64_t B = opts_.max_tokens, d = cfg_.d_model;
  int64_t qw = 0, kw = 0, ff = 1;
  for (int l = spec_.first; l < spec_.end; ++l) {
    const LayerConfig& L = cfg_.layers[size_t(l)];
    qw = std::max<int64_t>(qw, int64_t(L.n_heads) * L.head_dim);
    kw = std::max<int64_t>(kw, int64_t(L.n_kv_heads) * L.head_dim);
    ff = std::max<int64_t>(ff, L.d_ff);
  }
  qw = std::max<int64_t>(qw, 1);
  kw = std::max<int64_t>(kw, 1);
  Activations& a = act_;
  a.max_tokens = int(B);
  SHOAL_ASSIGN_OR_RETURN(a.x, alloc({B, d}));
  SHOAL_ASSIGN_OR_RETURN(a.h, alloc({B, d}));
  SHOAL_ASSIGN_OR_RETURN(a.o, alloc({B, d}));
  SHOAL_ASSIGN_OR_RETURN(a.q, alloc({B, qw}));
  SHOAL_ASSIGN_OR_RETURN(a.att, alloc({B, qw}));
  SHOAL_ASSIGN_OR_RETURN(a.k, alloc({B, kw}));
  SHOAL_ASSIGN_OR_RETURN(a.v, alloc({B, kw}));
  SHOAL_ASSIGN_OR_RETURN(a.gate, alloc({B, ff}));
  SHOAL_ASSIGN_OR_RETURN(a.up, alloc({B, ff}));
  SHOAL_ASSIGN_OR_RETURN(a.ids, alloc({B, 1}, DType::kI32));
  SHOAL_ASSIGN_OR_RETURN(a.pos, alloc({B, 1}, DType::kI32));
  SHOAL_ASSIGN_OR_RETURN(hop_, alloc({B, d}, DType::kF16));
  if (spec_.end > spec_.first) {
    std::vector<float> factors;
    if (global_.rope_freqs.data) {
      factors.resize(size_t(cfg_.rope.rot_dims / 2));
      SHOAL_RETURN_IF_ERROR(backend_.to_host(factors.data(), global_.rope_freqs, factors.size() * 4));
    }
    const int64_t half = cfg_.rope.rot_dims / 2;
    for (bool local : {false, true}) {
      auto f = rope_inv_freq(cfg_.rope, local, factors.empty() ? nullptr : factors.data());
      SHOAL_ASSIGN_OR_RETURN(Tensor t, alloc({half}));
      SHOAL_RETURN_IF_ERROR(backend_.to_device(t, f.data(), f.size() * 4));
      (local ? a.inv_freq_local : a.inv_freq) = t;
    }
    for (int l = spec_.first; l < spec_.end; ++l) {
      const LayerConfig& L = cfg_.layers[size_t(l)];
      const int64_t w = int64_t(L.n_kv_heads) * L.head_dim;
      if (opts_.kv_dtype == DType::kQ8_0 && w % 32 != 0)
        return make_error(Code::kUnsupported, "a Q8_0 KV cache needs KV rows of whole 32-value blocks (layer {} has {})", l, w);
      LayerCache c;
      auto k = alloc({opts_.n_ctx, w}, opts_.kv_dtype);
      auto v = k.ok() ? alloc({opts_.n_ctx, w}, opts_.kv_dtype) : k;
      if (!v.ok()) {
        return v.status().with_context(fmt::format(
            "the KV cache of layer {} ({} positions; {} in all for this slice's layers): lower -c{}", l, opts_.n_ctx,
            format_bytes(slice_kv_bytes(cfg_, spec_.first, spec_.end, opts_.n_ctx, opts_.kv_dtype)),
            opts_.kv_dtype == DType::kQ8_0 ? "" : " or use --kv q8_0 (half of f16's bytes)"));
      }
      c.k = *k;
      c.v = *v;
      cache_.push_back(c);
    }
  }
  if (spec_.head) {
    logits_rows_ = int(std::min<int64_t>(B, 32));
    SHOAL_ASSIGN_OR_RETURN(logits_, alloc({logits_rows_, cfg_.vocab_size}));
    SHOAL_ASSIGN_OR_RETURN(argmax_, alloc({B, 1}, DType::kI32));
    SHOAL_ASSIGN_OR_RETURN(topk_ids_, alloc({256, 1}, DType::kI32));
    SHOAL_ASSIGN_OR_RETURN(topk_vals_, alloc({256, 1}));
    SHOAL_ASSIGN_OR_RETURN(sampled_, alloc({1}, DType::kI32));
    SHOAL_ASSIGN_OR_RETURN(sampling_, alloc({int64_t(sizeof(DeviceSampling) / 4)}, DType::kI32));
  }
  return Status::Ok();
}

Result<std::unique_ptr<Slice>> Slice::load(ModelFile& file, const ModelConfig& cfg, const WeightMap& weights,
                                           const SliceSpec& spec, const SliceOptions& opts, Backend& backend,
                                           const LoadProgress& progress) {
  if (spec.first < 0 || spec.end > cfg.n_layers || spec.first > spec.end)
    return make_error(Code::kInvalidArgument, "layer range [{}, {}) is outside the model's {} layers", spec.first,
                      spec.end, cfg.n_layers);
  if (opts.n_ctx < 1 || opts.max_tokens < 1)
    return make_error(Code::kInvalidArgument, "context {} / batch {} must be positive", opts.n_ctx, opts.max_tokens);
  if (opts.kv_dtype != DType::kF32 && opts.kv_dtype != DType::kF16 && opts.kv_dtype != DType::kQ8_0)
    return make_error(Code::kInvalidArgument, "KV cache type {} is not supported (f32, f16, q8_0)", dtype_name(opts.kv_dtype));
  // (A step holds at most the context's tokens: no buffers for more.)
  SliceOptions o = opts;
  o.max_tokens = std::min(opts.max_tokens, opts.n_ctx);
  SHOAL_RETURN_IF_ERROR(check_device_fits(cfg, weights, spec, o, backend));
  std::unique_ptr<Slice> s(new Slice(cfg, spec, o, backend));
  WeightLoader loader(file, backend);
  SHOAL_RETURN_IF_ERROR(s->plan_weights(loader, weights));
  SHOAL_RETURN_IF_ERROR(loader.run(progress));
  SHOAL_RETURN_IF_ERROR(s->settle_weights());
  if (spec.head && spec.embed && cfg.tied_embeddings) s->global_.output = s->global_.token_embd;
  s->weight_bytes_ = loader.backend_bytes();
  s->file_bytes_ = loader.file_bytes();
  SHOAL_RETURN_IF_ERROR(s->alloc_buffers());
  if (spec.end > spec.first) {
    const uint64_t kv = slice_kv_bytes(cfg, spec.first, spec.end, o.n_ctx, o.kv_dtype);
    std::string kv_type(dtype_name(o.kv_dtype));  // as --kv names it
    for (char& c : kv_type) c = char(std::tolower(static_cast<unsigned char>(c)));
    spdlog::info("KV cache: {}, {} positions x {} layer{}, {}", kv_type, o.n_ctx, spec.end - spec.first,
                 spec.end - spec.first == 1 ? "" : "s", format_bytes(kv));
  }
  if (opts.warm_up && backend.kind() != DeviceKind::kCpu) SHOAL_RETURN_IF_ERROR(s->warm_up());
  return s;
}

Status Slice::warm_up() {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = opts_.max_tokens;  // (at most n_ctx: Slice::load)
  const int64_t last = opts_.n_ctx - 1;
  std::vector<int32_t> ids(size_t(n), 0);
  std::vector<uint16_t> hidden(size_t(n) * size_t(cfg_.d_model), 0);  // f16 zeros
  auto step = [&](int tokens, int64_t pos0, HeadMode mode) -> Status {
    StepInput in{tokens, pos0, ids.data(), hidden.data(), spec_.embed ? DType::kF32 : DType::kF16};
    StepOutput out;
    out.mode = mode;
    out.top_k = mode == HeadMode::kTopKLast ? std::min(256, cfg_.vocab_size) : 0;
    out.hidden = hidden.data();
    out.hidden_dtype = DType::kF16;
    n_past_ = pos0;  // the rows before pos0 are taken as cached (zeros or earlier warm-up rows)
    return forward(in, out).with_context(
        fmt::format("warm-up at load ({} tokens at positions {}..{})", tokens, pos0, pos0 + tokens - 1));
  };
  Status s = step(n, last + 1 - n, HeadMode::kArgmaxAll);
  if (s.ok()) s = step(1, last, HeadMode::kTopKLast);
  n_past_ = 0;
  backend_.drop_graphs(graph_owner_);  // steps of these outputs are rarely asked for
  SHOAL_RETURN_IF_ERROR(s);
  spdlog::debug("{}: warm-up of layers {}-{} took {:.1f} ms", backend_.name(), spec_.first, spec_.end - 1,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return Status::Ok();
}

int head_rows(HeadMode mode, int n) {
  switch (mode) {
    case HeadMode::kNone:
      return 0;
    case HeadMode::kLogitsLast:
    case HeadMode::kArgmaxLast:
    case HeadMode::kTopKLast:
      return std::min(n, 1);
    case HeadMode::kLogitsAll:
    case HeadMode::kArgmaxAll:
      break;
  }
  return n;
}

Status Slice::check_output(const StepOutput& out, int n) const {
  if (spec_.head && out.mode == HeadMode::kTopKLast && (out.top_k < 1 || out.top_k > 256 || out.top_k > cfg_.vocab_size))
    return make_error(Code::kInvalidArgument, "top-k of {} (1..256 on the device path)", out.top_k);
  if (!spec_.head && !out.hidden) return make_error(Code::kInvalidArgument, "no buffer for the hidden state");
  if (!spec_.head && out.hidden_dtype != DType::kF32 && out.hidden_dtype != DType::kF16)
    return make_error(Code::kInvalidArgument, "hidden state of type {} (f32 or f16)", dtype_name(out.hidden_dtype));
  if (out.keep_rows == -1) return Status::Ok();
  if (spec_.head || spec_.end != cfg_.n_layers)
    return make_error(Code::kInvalidArgument,
                      "only a slice without the head that ends the model keeps rows (layers {}-{} of {}{})",
                      spec_.first, spec_.end - 1, cfg_.n_layers, spec_.head ? ", with the head" : "");
  if (out.keep_rows < 0 || out.keep_rows > n)
    return make_error(Code::kInvalidArgument, "{} rows kept of a {}-token step", out.keep_rows, n);
  return Status::Ok();
}

int Slice::kept_rows(int n, const StepOutput& out) const {
  if (spec_.head) return head_rows(out.mode, n);
  return out.keep_rows < 0 ? n : out.keep_rows;
}

void Slice::run_head(int n, const StepOutput& out, Tensor* drawn) {
  SHOAL_CHECK(!drawn || out.mode == HeadMode::kTopKLast, "a draw from a head without top-k candidates");
  Backend& be = backend_;
  ForwardContext ctx{&be, &cfg_, &act_};
  switch (out.mode) {
    case HeadMode::kLogitsLast: {
      Tensor l = logits_.rows_view(0, 1);
      forward_head(ctx, global_, n - 1, 1, l);
      break;
    }
    case HeadMode::kTopKLast: {
      Tensor l = logits_.rows_view(0, 1);
      forward_head(ctx, global_, n - 1, 1, l);
      Tensor ids = topk_ids_.rows_view(0, out.top_k).reshaped({out.top_k});
      Tensor vals = topk_vals_.rows_view(0, out.top_k).reshaped({out.top_k});
      if (drawn)
        be.top_k_sample(l, out.top_k, ids, vals, sampling_, *drawn);
      else
        be.top_k(l, out.top_k, ids, vals);
      break;
    }
    case HeadMode::kArgmaxLast: {
      Tensor l = logits_.rows_view(0, 1);
      forward_head(ctx, global_, n - 1, 1, l);
      Tensor am = argmax_.rows_view(0, 1).reshaped({1});
      be.argmax(l, am);
      break;
    }
    case HeadMode::kArgmaxAll:
      for (int r = 0; r < n; r += logits_rows_) {
        const int m = std::min(logits_rows_, n - r);
        Tensor l = logits_.rows_view(0, m);
        forward_head(ctx, global_, r, m, l);
        Tensor am = argmax_.rows_view(r, m).reshaped({m});
        be.argmax(l, am);
      }
      break;
    case HeadMode::kNone:
    case HeadMode::kLogitsAll:  // chunked with copies in forward()
      break;
  }
}

Status Slice::upload_step(const StepInput& in) {
  const int n = in.n;
  const int64_t d = cfg_.d_model;
  if (n < 1 || n > opts_.max_tokens)
    return make_error(Code::kOutOfRange, "{} tokens in one step (1..{})", n, opts_.max_tokens);
  // A slice without layers (the pool host's head) caches nothing, so any position continues it.
  if (in.pos0 < 0 || (spec_.first < spec_.end && in.pos0 > n_past_))
    return make_error(Code::kOutOfRange, "step at position {} does not continue the cache (at {})", in.pos0, n_past_);
  if (in.pos0 + n > opts_.n_ctx)
    return make_error(Code::kOutOfRange, "positions {}..{} exceed the context of {} tokens", in.pos0, in.pos0 + n - 1,
                      opts_.n_ctx);
  Backend& be = backend_;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), int32_t(in.pos0));
  SHOAL_RETURN_IF_ERROR(be.to_device(act_.pos, pos.data(), uint64_t(n) * 4));
  if (spec_.embed) {
    if (!in.ids) return make_error(Code::kInvalidArgument, "this slice embeds: token ids expected");
    for (int i = 0; i < n; ++i)
      if (in.ids[i] < 0 || in.ids[i] >= cfg_.vocab_size)
        return make_error(Code::kInvalidArgument, "token id {} outside the vocabulary of {}", in.ids[i], cfg_.vocab_size);
    return be.to_device(act_.ids, in.ids, uint64_t(n) * 4);
  }
  if (!in.hidden) return make_error(Code::kInvalidArgument, "hidden state expected");
  if (in.hidden_dtype == DType::kF32) return be.to_device(act_.x, in.hidden, uint64_t(n) * uint64_t(d) * 4);
  if (in.hidden_dtype == DType::kF16) return be.to_device(hop_, in.hidden, uint64_t(n) * uint64_t(d) * 2);
  return make_error(Code::kInvalidArgument, "hidden state of type {} (f32 or f16)", dtype_name(in.hidden_dtype));
}

uint64_t Slice::step_key(const StepInput& in, const StepOutput& out, bool chained) const {
  const bool hop_f16 = !spec_.head && out.hidden_dtype == DType::kF16;
  // Bits 16..32: the head's mode and top-k (1..256, checked; only kTopKLast reads it), or for a
  // slice without one the rows it drops (< 2^16).
  const uint64_t top_k = out.mode == HeadMode::kTopKLast ? uint64_t(out.top_k) : 0;
  const uint64_t output = spec_.head ? uint64_t(int(out.mode) + 1) | (top_k << 8) : uint64_t(in.n - kept_rows(in.n, out));
  return uint64_t(in.n) | (output << 16) | (uint64_t(in.hidden_dtype == DType::kF16) << 40) |
         (uint64_t(hop_f16) << 41) | (uint64_t(chained) << 42);
}

Status Slice::run_step(uint64_t key, int64_t keys, int n, const std::function<void()>& record) {
  const int plan = backend_.plan_attention_keys(keys, n);
  const Status ran = backend_.run_graph(key | (uint64_t(plan & 0xff) << 48), record, graph_owner_);
  backend_.plan_attention_keys(0, 0);  // ops outside a step plan for the whole cache
  return ran;
}

void Slice::record_step(const StepInput& in, const StepOutput& out, Tensor* drawn) {
  Backend& be = backend_;
  const int n = in.n;
  Tensor x = act_.x.rows_view(0, n);
  ForwardContext ctx{&be, &cfg_, &act_};
  if (spec_.embed) {
    Tensor ids = act_.ids.rows_view(0, n).reshaped({n});
    be.embed(global_.token_embd, ids, x);
    if (cfg_.embed_scale != 1.0f) be.scale(x, cfg_.embed_scale);
  } else if (in.hidden_dtype == DType::kF16) {
    Tensor hop = hop_.rows_view(0, n);
    be.convert(hop, x);
  }
  const int keep = kept_rows(n, out);
  forward_layers(ctx, layers_, cache_, spec_.first, spec_.end, n, keep);
  if (spec_.head && out.mode != HeadMode::kLogitsAll) run_head(n, out, drawn);
  if (!spec_.head && out.hidden_dtype == DType::kF16 && keep > 0) {
    Tensor hop = hop_.rows_view(0, keep);
    be.convert(x.rows_view(n - keep, keep), hop);
  }
}

Status Slice::forward(const StepInput& in, StepOutput& out) {
  const int n = in.n;
  const int64_t d = cfg_.d_model;
  SHOAL_RETURN_IF_ERROR(check_output(out, n));
  SHOAL_RETURN_IF_ERROR(upload_step(in));
  Backend& be = backend_;
  const bool hop_f16 = !spec_.head && out.hidden_dtype == DType::kF16;
  SHOAL_RETURN_IF_ERROR(run_step(step_key(in, out, false), in.pos0 + n, n, [&] { record_step(in, out); }));
  n_past_ = in.pos0 + n;
  if (!spec_.head) {
    const int keep = kept_rows(n, out);
    if (keep == 0) return be.synchronize();
    if (hop_f16) return be.to_host(out.hidden, hop_, uint64_t(keep) * uint64_t(d) * 2);
    return be.to_host(out.hidden, act_.x, uint64_t(keep) * uint64_t(d) * 4, uint64_t(n - keep) * uint64_t(d) * 4);
  }
  const uint64_t V = uint64_t(cfg_.vocab_size);
  switch (out.mode) {
    case HeadMode::kNone:
      return Status::Ok();
    case HeadMode::kArgmaxLast:
      out.ids.resize(1);
      return be.to_host(out.ids.data(), argmax_, 4);
    case HeadMode::kLogitsLast:
      out.logits.resize(V);
      return be.to_host(out.logits.data(), logits_, V * 4);
    case HeadMode::kTopKLast:
      out.ids.resize(size_t(out.top_k));
      out.logits.resize(size_t(out.top_k));
      SHOAL_RETURN_IF_ERROR(be.to_host(out.ids.data(), topk_ids_, uint64_t(out.top_k) * 4));
      return be.to_host(out.logits.data(), topk_vals_, uint64_t(out.top_k) * 4);
    case HeadMode::kArgmaxAll:
      out.ids.resize(size_t(n));
      return be.to_host(out.ids.data(), argmax_, uint64_t(n) * 4);
    case HeadMode::kLogitsAll: {
      out.logits.resize(size_t(n) * V);
      ForwardContext ctx{&be, &cfg_, &act_};
      for (int r = 0; r < n; r += logits_rows_) {
        const int m = std::min(logits_rows_, n - r);
        Tensor l = logits_.rows_view(0, m);
        forward_head(ctx, global_, r, m, l);
        SHOAL_RETURN_IF_ERROR(be.to_host(out.logits.data() + uint64_t(r) * V, logits_, uint64_t(m) * V * 4));
      }
      return Status::Ok();
    }
  }
  return Status::Ok();
}

Status check_decode_sampling(const DecodeSampling& how) {
  if (how.greedy) return Status::Ok();
  if (!(how.draw.temperature > 0.0f))
    return make_error(Code::kInvalidArgument, "a sampled decode needs a temperature > 0, got {}", how.draw.temperature);
  if (how.top_k < 1 || how.top_k > 256)
    return make_error(Code::kInvalidArgument, "a sampled decode draws from a top-k of 1..256, got {}", how.top_k);
  return Status::Ok();
}

Status check_decode_steps(int64_t pos0, int max_steps, int64_t n_ctx) {
  if (max_steps < 1) return make_error(Code::kInvalidArgument, "{} decode steps (at least 1)", max_steps);
  if (pos0 + max_steps > n_ctx)
    return make_error(Code::kOutOfRange, "positions {}..{} exceed the context of {} tokens", pos0, pos0 + max_steps - 1,
                      n_ctx);
  return Status::Ok();
}

Result<int> Slice::decode(int32_t id, int64_t pos0, int max_steps, const DecodeSampling& how,
                          const std::function<bool(int32_t)>& on_token) {
  if (!spec_.embed || !spec_.head)
    return make_error(Code::kFailedPrecondition, "chained decoding needs the embedding and the head in one slice");
  SHOAL_RETURN_IF_ERROR(check_decode_steps(pos0, max_steps, opts_.n_ctx));
  SHOAL_RETURN_IF_ERROR(check_decode_sampling(how));
  StepOutput head;
  head.mode = how.greedy ? HeadMode::kArgmaxLast : HeadMode::kTopKLast;
  head.top_k = how.greedy ? 0 : how.top_k;
  SHOAL_RETURN_IF_ERROR(check_output(head, 1));
  const StepInput in{1, pos0, &id};
  Backend& be = backend_;
  SHOAL_RETURN_IF_ERROR(be.clear_decoded());  // positions repeat after a rewind
  SHOAL_RETURN_IF_ERROR(upload_step(in));
  if (!how.greedy) SHOAL_RETURN_IF_ERROR(be.to_device(sampling_, &how.draw, sizeof(DeviceSampling)));
  Tensor next = how.greedy ? argmax_.rows_view(0, 1).reshaped({1}) : sampled_;
  Tensor ids = act_.ids.rows_view(0, 1).reshaped({1});
  Tensor pos = act_.pos.rows_view(0, 1).reshaped({1});
  int launched = 0;
  auto launch = [&] {  // step `launched`: position pos0 + launched, attending one key more
    return run_step(step_key(in, head, true), pos0 + launched + 1, 1, [&] {
      record_step(in, head, how.greedy ? nullptr : &next);  // (sampled: the head also draws)
      be.advance_decode(next, ids, pos);  // also publishes the step's id (wait_decoded)
    });
  };
  // An asynchronous backend runs step k + 1 while the host reads step k's id; an eager one
  // would compute it before the caller could stop, so it runs one step at a time.
  const int ahead = be.asynchronous() ? 1 : 0;
  for (int k = 0; k < max_steps; ++k) {
    for (; launched < std::min(max_steps, k + 1 + ahead); ++launched) SHOAL_RETURN_IF_ERROR(launch());
    int32_t out_id = 0;
    SHOAL_RETURN_IF_ERROR(be.wait_decoded(pos0 + k, &out_id, 1));
    n_past_ = pos0 + k + 1;
    if (!on_token(out_id)) return k + 1;
  }
  return max_steps;
}

Result<std::vector<uint64_t>> layer_bytes(const ModelConfig& cfg, const WeightMap& weights, int n_ctx, DType kv_dtype) {
  std::vector<uint64_t> out(size_t(cfg.n_layers), 0);
  for (int l = 0; l < cfg.n_layers; ++l) {
    LayerWeights scratch;
    for (const Need& need : layer_needs(cfg, l, scratch)) {
      const TensorInfo* t = weights.find(need.name);
      if (!t) {
        if (need.required) return weights.missing(need.name);
        continue;
      }
      SHOAL_ASSIGN_OR_RETURN(DType dt, WeightLoader::backend_dtype(t->dtype, need.role, t->name));
      out[size_t(l)] += dtype_bytes(dt, t->n_elements()).value_or(0);
    }
    out[size_t(l)] += layer_kv_bytes(cfg.layers[size_t(l)], n_ctx, kv_dtype);
  }
  return out;
}

std::vector<std::string> unused_tensors(const ModelConfig& cfg, const WeightMap& weights) {
  std::unordered_set<std::string> read = {"rope_freqs.weight", "token_embd.weight", "output_norm.weight",
                                          "output.weight"};
  if (cfg.norm == NormKind::kLayer) read.insert("output_norm.bias");
  for (int l = 0; l < cfg.n_layers; ++l) {
    LayerWeights scratch;
    for (const Need& need : layer_needs(cfg, l, scratch)) read.insert(need.name);
  }
  std::vector<std::string> out;
  for (std::string& name : weights.names())
    if (!read.contains(name)) out.push_back(std::move(name));
  std::sort(out.begin(), out.end());
  return out;
}

Result<uint64_t> global_bytes(const ModelConfig& cfg, const WeightMap& weights, bool embed, bool head) {
  uint64_t total = 0;
  auto add = [&](const char* name, WeightRole role) -> Status {
    const TensorInfo* t = weights.find(name);
    if (!t) return Status::Ok();
    SHOAL_ASSIGN_OR_RETURN(const DType dt, WeightLoader::backend_dtype(t->dtype, role, t->name));
    total += dtype_bytes(dt, t->n_elements()).value_or(0);
    return Status::Ok();
  };
  if (embed) SHOAL_RETURN_IF_ERROR(add("token_embd.weight", WeightRole::kMatrix));
  if (head) {
    SHOAL_RETURN_IF_ERROR(add("output_norm.weight", WeightRole::kVector));
    SHOAL_RETURN_IF_ERROR(add("output_norm.bias", WeightRole::kVector));
    if (!cfg.tied_embeddings) SHOAL_RETURN_IF_ERROR(add("output.weight", WeightRole::kMatrix));
    else if (!embed) SHOAL_RETURN_IF_ERROR(add("token_embd.weight", WeightRole::kMatrix));  // the head's own copy
  }
  return total;
}

}  // namespace shoal

namespace shoal {

Result<TokenCost> token_cost(const ModelConfig& cfg, const WeightMap& weights) {
  TokenCost c;
  auto count = [&](const TensorInfo& t) -> Status {
    if (t.shape.size() != 2) return Status::Ok();
    SHOAL_ASSIGN_OR_RETURN(DType dt, WeightLoader::backend_dtype(t.dtype, WeightRole::kMatrix, t.name));
    c.weight_bytes += dtype_bytes(dt, t.n_elements()).value_or(0);
    c.flops += 2.0 * double(t.n_elements());
    return Status::Ok();
  };
  for (int l = 0; l < cfg.n_layers; ++l) {
    LayerWeights scratch;
    for (const Need& need : layer_needs(cfg, l, scratch))
      if (const TensorInfo* t = weights.find(need.name)) SHOAL_RETURN_IF_ERROR(count(*t));
  }
  const TensorInfo* head = weights.find(cfg.tied_embeddings ? "token_embd.weight" : "output.weight");
  if (!head) return make_error(Code::kNotFound, "the model has no LM head tensor");
  SHOAL_RETURN_IF_ERROR(count(*head));
  return c;
}

}  // namespace shoal
