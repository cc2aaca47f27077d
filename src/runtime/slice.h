// A slice: a contiguous range of layers of one model on one backend, with its KV cache and
// work buffers; optionally the embedding (first slice) and the head (final norm + LM head).
// A single machine runs one slice holding everything; the pool chains several.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/sampling_math.h"
#include "format/model_file.h"
#include "model/arch.h"
#include "model/forward.h"
#include "runtime/weight_loader.h"

namespace shoal {

/// Which part of the model a slice holds. Layers [first, end).
struct SliceSpec {
  int first = 0;
  int end = 0;
  bool embed = false;  // holds token_embd and takes token ids
  bool head = false;   // holds output_norm + output and produces logits; its last layer then
                       // computes wo and the FFN only for the rows the head reads (head_rows)
};

struct SliceOptions {
  int n_ctx = 4096;              // KV cache positions
  DType kv_dtype = DType::kF32;  // F32, F16 or Q8_0
  int max_tokens = 512;          // tokens per forward() call (prefill chunk); at most n_ctx are held
  bool warm_up = true;           // device backends: Slice::load runs warm_up() (llama.cpp's --no-warmup turns it off)
};

/// Input of one forward step: n tokens at positions pos0 .. pos0 + n - 1.
struct StepInput {
  int n = 0;
  int64_t pos0 = 0;
  const int32_t* ids = nullptr;      // [n] when the slice embeds
  const void* hidden = nullptr;      // [n, d_model] of hidden_dtype otherwise (host memory)
  DType hidden_dtype = DType::kF32;  // F32, F16 or BF16
};

/// What the head should produce.
enum class HeadMode {
  kNone,        // no head (a prefill chunk that is not the last)
  kLogitsLast,  // f32 logits of the last position
  kLogitsAll,   // f32 logits of every position
  kArgmaxLast,  // the argmax id of the last position (greedy: 4 bytes back)
  kArgmaxAll,   // the argmax id of every position (verifying drafts)
  kTopKLast,    // the top_k (id, logit) candidates of the last position
};

/// The rows of an n-token step whose final hidden state the head reads in `mode`: the last row
/// for the *Last modes, none for kNone, all n otherwise (forward_layers' keep).
int head_rows(HeadMode mode, int n);

/// How a chained decode (Slice::decode, Pipeline::decode) picks each step's token: the argmax
/// (greedy), or a draw from the top_k candidates with draw's settings (draw_token,
/// backend/sampling_math.h; draw.draw is the first step's draw index).
struct DecodeSampling {
  bool greedy = true;
  int top_k = 0;  // 1..256 when not greedy
  DeviceSampling draw;
};

/// Output of one forward step.
struct StepOutput {
  // Slices without a head: the hidden state [n, d_model] of hidden_dtype (host memory).
  void* hidden = nullptr;
  DType hidden_dtype = DType::kF32;
  // Slices without a head whose layers end the model: the rows a head downstream reads
  // (head_rows of its mode; 0..n), or -1 for all n. The last layer's output projection and FFN
  // then run for the last keep_rows rows only (up to 3 more where d_model % 4 != 0: forward_layers'
  // keep), and `hidden` gets just those rows: [keep_rows, d_model]. Any other slice must leave it
  // at -1 (kInvalidArgument).
  int keep_rows = -1;
  // Slices with a head:
  HeadMode mode = HeadMode::kLogitsLast;
  int top_k = 0;
  std::vector<float> logits;    // [rows, vocab] (kLogits*) or [top_k] values (kTopKLast)
  std::vector<int32_t> ids;     // [1] (kArgmaxLast), [n] (kArgmaxAll) or [top_k] (kTopKLast)
};

class Slice {
 public:
  /// Allocates every buffer, then streams this slice's tensors in (and only those); on a device
  /// backend with opts.warm_up it then runs warm_up().
  /// Errors: kNotFound (a tensor missing, named), kUnsupported, kOutOfMemory (on a device
  /// backend, before any allocation: the slice's weights and KV cache against the free memory,
  /// both named; else the allocation that failed, with its size and the free memory, the
  /// warm-up's included), kIoError, kUnavailable (`progress` stopped the load).
  static Result<std::unique_ptr<Slice>> load(ModelFile& file, const ModelConfig& cfg, const WeightMap& weights,
                                             const SliceSpec& spec, const SliceOptions& opts, Backend& backend,
                                             const LoadProgress& progress = {});
  ~Slice();
  Slice(const Slice&) = delete;
  Slice& operator=(const Slice&) = delete;

  /// Runs in.n (<= max_tokens) tokens. Positions must continue the cache: pos0 <= n_past() (a
  /// slice without layers caches nothing and takes any position).
  /// Errors: kOutOfRange (context full, batch too large), kInvalidArgument (bad ids, an output
  /// check_output refuses), backend errors.
  Status forward(const StepInput& in, StepOutput& out);
  /// Decoding chained on the device (a slice with the embedding and the head): feeds `id` at
  /// pos0, then each step's token (the argmax, or a draw on the device: Backend::sample) back as
  /// the next step's input (Backend::advance_decode), for at most max_steps steps. on_token gets
  /// each step's id in order and returns false to stop. On an asynchronous backend step k + 1
  /// runs while the host reads step k's id, so no host round trip sits between steps; after a
  /// stop that step has written the KV row after the last cached position, which the next
  /// forward overwrites. Returns the steps whose ids were delivered (positions pos0 .. pos0 +
  /// steps - 1 are then cached; a sampled step k used draw how.draw.draw + k). Errors: as
  /// forward(), check_decode_steps, check_decode_sampling, kFailedPrecondition for a slice
  /// without embedding or head.
  Result<int> decode(int32_t id, int64_t pos0, int max_steps, const DecodeSampling& how,
                     const std::function<bool(int32_t)>& on_token);
  /// Drops cached positions >= pos (the next forward starts at pos).
  void rewind(int64_t pos) { n_past_ = std::min(n_past_, pos); }
  int64_t n_past() const { return n_past_; }

  const SliceSpec& spec() const { return spec_; }
  const SliceOptions& options() const { return opts_; }
  const ModelConfig& config() const { return cfg_; }
  Backend& backend() { return backend_; }
  /// The owner its steps are recorded under (Backend::run_graph): unique in the process, so a
  /// slice never replays another's recording; the destructor drops them before freeing buffers.
  uint64_t graph_owner() const { return graph_owner_; }
  /// Bytes of weights this slice holds on its backend, and bytes it read from the file.
  uint64_t weight_bytes() const { return weight_bytes_; }
  uint64_t file_bytes() const { return file_bytes_; }

 private:
  Slice(const ModelConfig& cfg, const SliceSpec& spec, const SliceOptions& opts, Backend& backend)
      : cfg_(cfg), spec_(spec), opts_(opts), backend_(backend) {}
  Status plan_weights(WeightLoader& loader, const WeightMap& weights);
  Status alloc_buffers();
  /// The largest steps this slice will be asked for, run once on throw-away input so that what a
  /// backend allocates on first use (scratch, lazily loaded kernels) is taken at load, where
  /// running out of memory fails the load with its figures, rather than in the middle of a
  /// request: max_tokens tokens (the last at n_ctx - 1, attending the whole cache) with the widest
  /// head output, then one token at n_ctx - 1 with a top-k of 256; their step recordings are then
  /// dropped. Leaves the cache empty (n_past() 0; the rows written are overwritten before any
  /// step reads them). As llama.cpp's load-time warm-up and vLLM's profile run. Errors:
  /// forward()'s, prefixed with the step.
  Status warm_up();
  /// Backend::settle_weights for each layer's matrices (one group: fused paths see one kind)
  /// and each global matrix, after the load; logs how many BF16 matrices were held as F16.
  Status settle_weights();
  /// kInvalidArgument for a head output the device path cannot give (top-k outside 1..256 or
  /// past the vocabulary), no hidden-state buffer or one of a type other than f32 / f16 (slices
  /// without a head), or keep_rows outside -1..n or set on a slice that has a head or does not
  /// end the model; checked before an n-token step is recorded or replayed.
  Status check_output(const StepOutput& out, int n) const;
  void run_head(int n, const StepOutput& out, Tensor* drawn);
  /// Checks a step against the cache and the context; uploads its positions and ids (or hidden state).
  Status upload_step(const StepInput& in);
  /// The graph key of a step: its size, head output (or for a slice without a head, the rows it
  /// drops: n - kept_rows) and hop types; `chained`: decode()'s step.
  uint64_t step_key(const StepInput& in, const StepOutput& out, bool chained) const;
  /// The rows of an n-token step past the last layer's attention: head_rows for a head,
  /// out.keep_rows (or n) for a slice that ends the model without one.
  int kept_rows(int n, const StepOutput& out) const;
  /// run_graph of a step of n tokens that attends at most `keys` keys: announced to the backend
  /// (plan_attention_keys) while it runs, the plan class added to `key` (bits 48..55).
  Status run_step(uint64_t key, int64_t keys, int n, const std::function<void()>& record);
  /// Enqueues a step's ops: embedding (or hop conversion), the layers, the head, the hop out.
  /// drawn (kTopKLast only): the head also draws a token from its candidates into drawn (i32 [1]),
  /// with sampling_'s settings (Backend::top_k_sample).
  void record_step(const StepInput& in, const StepOutput& out, Tensor* drawn = nullptr);
  Result<Tensor> alloc(std::initializer_list<int64_t> shape, DType dtype = DType::kF32);
  static uint64_t next_graph_owner();

  ModelConfig cfg_;
  SliceSpec spec_;
  SliceOptions opts_;
  Backend& backend_;
  std::vector<Tensor> owned_;  // everything allocated, freed in the destructor
  const uint64_t graph_owner_ = next_graph_owner();
  std::vector<LayerWeights> layers_;
  GlobalWeights global_;
  std::vector<LayerCache> cache_;
  Activations act_;
  Tensor hop_;                        // [B, d_model] hidden-state staging in the hop dtype
  Tensor logits_, argmax_, topk_ids_, topk_vals_;
  Tensor sampled_, sampling_;  // decode(): the drawn id (i32 [1]) and the DeviceSampling (i32 [8])
  int logits_rows_ = 0;
  int64_t n_past_ = 0;
  uint64_t weight_bytes_ = 0, file_bytes_ = 0;
};

/// The errors of a chained decode of max_steps steps from pos0 (decode()): kInvalidArgument
/// for max_steps < 1, kOutOfRange past the context of n_ctx positions.
Status check_decode_steps(int64_t pos0, int max_steps, int64_t n_ctx);
/// kInvalidArgument for a sampled DecodeSampling without a temperature > 0 or a top-k in 1..256.
Status check_decode_sampling(const DecodeSampling& how);

/// Bytes layers [first, end) take on a backend (weights after load-time conversion + KV cache at
/// n_ctx), for the planner. Errors as Slice::load for missing/unsupported tensors.
Result<std::vector<uint64_t>> layer_bytes(const ModelConfig& cfg, const WeightMap& weights, int n_ctx, DType kv_dtype);
/// Bytes of a slice's weights outside its layers on a backend: the embedding (`embed`), the final
/// norm and LM head (`head`; a tied head without the embedding holds its own copy of it).
Result<uint64_t> global_bytes(const ModelConfig& cfg, const WeightMap& weights, bool embed, bool head);

/// The tensors of `weights` (canonical names, sorted) that no slice of `cfg` reads: a norm or a
/// bias of another variant of the family (a GGUF of another architecture relabelled), without which
/// the output is not the reference implementation's. llama.cpp refuses such a GGUF ("wrong number
/// of tensors"); Shoal's loader warns (local_model.cc).
std::vector<std::string> unused_tensors(const ModelConfig& cfg, const WeightMap& weights);

}  // namespace shoal

namespace shoal {

/// What one decode token costs: weight bytes streamed (every layer matrix and the LM head, as
/// stored on the backend after load-time conversion) and matmul FLOPs (2 per weight value),
/// attention excluded. For `shoal bench` and the planner's speed estimates.
struct TokenCost {
  uint64_t weight_bytes = 0;
  double flops = 0;
};
Result<TokenCost> token_cost(const ModelConfig& cfg, const WeightMap& weights);

}  // namespace shoal
