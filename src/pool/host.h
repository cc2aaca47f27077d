// The pool's host (`shoal host`, and `shoal run/check --pool N`): owns the model's tokenizer,
// embedding, head and sampler, usually some layers, and the room workers join
// (docs/protocol.md, "Host and worker").
//
//   open():            opens the model and the backend, measures itself, opens the room;
//   a room thread:     authenticates arrivals; a worker's HELLO makes it a member (its control
//                      link then carries heartbeats), a hop goes to the HopInbox;
//   ensure_plan():     when the pool changed (a worker joined or died) or the chain broke: plans
//                      (pool/planner.h) from the host's and the members' facts, prints the plan,
//                      sends ASSIGN to every worker of the plan, loads the host's part while they
//                      load theirs, waits for READY, dials the first worker and takes the hop back
//                      from the last; then replays the session's cached tokens into the new chain;
//   generate():        ensure_plan() + Session::generate on the PoolPipeline.
// A worker that refuses its assignment (wrong model file, cannot load) is dropped and the plan
// is made again without it; one that dies during a request fails that request (the pipeline
// names it) and is dropped before the next.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "pool/planner.h"
#include "pool/pool_pipeline.h"
#include "pool/room.h"
#include "runtime/local_model.h"
#include "runtime/session.h"

namespace shoal::pool {

struct HostOptions {
  std::string model;                     // .gguf file or HF folder; workers get this path too
  std::string device = "cpu";            // the host's backend
  int threads = 0;                       // CPU threads (0: all)
  int n_ctx = 0;                         // context; 0: the model's, at most 4096
  DType kv_dtype = DType::kF16;          // KV cache type on every stage
  int max_tokens = 512;                  // the host's prefill step when it holds every layer
  bool half_prefill = false;             // BackendOptions::half_prefill of the host's backend
  bool warm_up = true;                   // SliceOptions::warm_up of the host's slices
  bool tokenizer = true;                 // load the tokenizer (not needed by `shoal check`)
  bool progress = true;                  // progress bar while loading
  std::string listen = "127.0.0.1:0";    // the room's address
  std::string secret;                    // the room secret (non-empty)
  std::optional<uint32_t> layers_local;  // --layers-local N; nullopt: the planner chooses
  std::vector<LayerRange> split;         // --split; empty: the planner chooses
  size_t workers = 0;                    // the pool's workers when known exactly (a local pool's N - 1; 0:
                                         // not known): open() refuses a --split of more ranges than devices
  bool spread = false;                   // deal layers evenly over host and workers (--pool N)
  HopDType hop_dtype = HopDType::kF16;
  HopOptions hops;                       // heartbeats, dead-after, connect timeout
  uint64_t mem = 0;                      // bytes the host lends; 0: what its backend reports free
  int mem_share = 1;                     // with mem 0: lend free / mem_share (processes sharing one device)
  Millis probe_budget{200};
  size_t max_pending = 32;               // handshakes in flight (RoomOptions::max_pending)
};

/// One stage of the current plan, for logs and tests.
struct StageInfo {
  std::string name;           // "host" or the worker's name
  uint32_t first = 0;         // first layer
  uint32_t n_layers = 0;
  uint64_t bytes_loaded = 0;  // workers: file bytes read for the slice (READY); host: 0
};

class Host {
 public:
  /// Errors: from opening the model, the backend or the listener; kInvalidArgument (empty secret).
  static Result<std::unique_ptr<Host>> open(HostOptions opts, Network& net);
  /// Says bye to every member and closes the room.
  ~Host();
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  /// Where workers join ("127.0.0.1:7000").
  std::string address() const;
  const ModelConfig& config() const { return model_.config; }
  /// Null when opened without a tokenizer.
  const Tokenizer* tokenizer() const { return model_.tokenizer.get(); }
  /// The context in tokens (HostOptions::n_ctx, or the model's, at most 4096); valid from open().
  int64_t n_ctx() const { return pipeline_->n_ctx(); }
  /// Waits until at least n workers are members. Polls `check` (e.g. "are the local worker
  /// processes alive") and returns its error. kDeadlineExceeded after `timeout`.
  Status wait_for_workers(size_t n, Millis timeout, const std::function<Status()>& check = {});
  /// Plans, assigns and builds the chain when the pool changed or the chain broke (else nothing).
  /// Errors: kOutOfMemory / kInvalidArgument from the planner (the pool cannot hold the model, a
  /// bad --split), errors loading the host's part, kUnavailable when workers keep failing.
  Status ensure_plan();
  /// ensure_plan(), then Session::generate. A request whose chain breaks (kUnavailable: a worker
  /// that left, unnoticed when the plan was made) before its first token is handed to `on_token`
  /// runs again on a new plan, up to 4 runs in all: nothing was shown yet. A new plan's failure (a
  /// pool now too small) is kUnavailable too, naming both. The host stays usable after any error.
  Result<std::vector<int32_t>> generate(std::span<const int32_t> prompt, const GenerateOptions& opts,
                                        const TokenCallback& on_token, GenerateStats* stats = nullptr);
  /// The pipeline of the current plan (call ensure_plan() first).
  Pipeline& pipeline() { return *pipeline_; }
  Session& session() { return *session_; }
  /// The stages of the current plan, chain order.
  std::vector<StageInfo> stages() const;
  /// The current plan's number: 1 for the first, one more for each plan made after it.
  uint64_t plan_epoch() const { return epoch_; }
  /// Workers in the room now whose link is up (as wait_for_workers counts them).
  size_t n_workers() const;
  /// Says bye with `reason` to every member and guest and closes their links (thread-safe: for a
  /// signal's thread just before the process exits). Workers leave when they hear it; the host
  /// serves no more requests through them.
  void say_bye(std::string_view reason);
  /// Peers refused so far (by the room, at hello, or at assignment) and the last reason.
  size_t refused() const;
  std::string last_refusal() const;

 private:
  struct Member;
  Host(HostOptions opts, Network& net, LocalModel model, std::unique_ptr<Backend> backend);
  void arrival_loop();
  void admit(Arrival a);
  void refuse(const std::string& who, const Status& why, bool log = true);  // counts and logs
  void drop_dead_members();
  size_t live_members_locked() const;  // members whose link is up (mu_ held)
  // One plan: plans, sends the assignments, loads the host's part meanwhile, waits for READY,
  // builds the chain. `retry`: the failure involved a worker, so a new plan may succeed at once.
  Status plan_once(bool& retry);
  Status wait_ready(Member& m, uint64_t epoch);
  Status replay();

  HostOptions opts_;
  Network& net_;
  LocalModel model_;
  uint64_t model_identity_ = 0;  // model_identity() of model_, sent in every assign
  std::unique_ptr<Backend> backend_;
  DeviceFacts self_;
  std::vector<uint64_t> layer_bytes_;
  uint64_t host_bytes_ = 0;
  std::unique_ptr<Room> room_;
  HopInbox hops_;
  std::thread arrival_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> changed_{true};  // the pool changed since the last plan

  mutable std::mutex mu_;  // members_, refusals
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Member>> members_;  // join order
  std::vector<std::unique_ptr<Link>> guests_;
  size_t refused_ = 0;
  std::string last_refusal_;

  uint64_t epoch_ = 0;
  std::vector<StageInfo> stages_;
  std::unique_ptr<PoolPipeline> pipeline_;
  std::unique_ptr<Session> session_;
};

/// Layers dealt as evenly as possible over min(n_devices, n_layers) stages, earlier stages taking
/// the remainder: even_split(5, 3) = 0-1, 2-3, 4.
std::vector<LayerRange> even_split(uint32_t n_layers, size_t n_devices);

}  // namespace shoal::pool
