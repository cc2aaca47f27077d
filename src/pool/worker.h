// A worker of the pool (`shoal join HOST:PORT`): lends one device, holds one contiguous layer range
// and serves frames along the chain (docs/protocol.md, "Host and worker").
//
//   join:    open its own -m copy of the model (a missing or malformed file fails here), create
//            the backend, measure it (pool/worker_probe.h), open the hop listener, dial the host,
//            prove the room secret (role worker), say HELLO;
//   assign:  open the model (the -m copy opened at join, else the path the host sent), refuse with
//            ERROR kFailedPrecondition when its identity (file size + model_identity(): tensor index and sampled weights) differs
//            from the host's, load only its own tensors (a Slice without embedding or head; a
//            progress bar on stderr; the load stops when the worker is stopped or the host left),
//            dial the next hop, say READY {bytes read from the file, seconds};
//   serve:   a data thread takes the hop of this plan from the previous stage, runs each FRAME
//            through the slice and forwards the result (only the hidden-state bytes are copied);
//            REWIND drops cached positions and travels on. A later ASSIGN replaces all of that
//            (the slice is kept when the layer range, model and cache settings are unchanged).
// When the host goes away (bye, closed connection, silence), run() returns Ok and the process
// exits: a worker does not rejoin by itself (start `shoal join` again, or let a supervisor).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "backend/backend.h"
#include "pool/chain.h"
#include "pool/room.h"
#include "runtime/local_model.h"
#include "runtime/slice.h"

namespace shoal::pool {

struct WorkerOptions {
  std::string host;         // "HOST:PORT" of the host's room
  std::string secret;       // the room secret
  std::string model;        // this worker's copy of the model; empty: the path the host sends
  std::string device = "cpu";
  int threads = 0;          // CPU threads (0: all)
  bool half_prefill = false;  // BackendOptions::half_prefill
  bool warm_up = true;        // SliceOptions::warm_up
  uint64_t mem = 0;         // bytes lent to the pool; 0: what the backend reports free
  int mem_share = 1;        // with mem 0: lend free / mem_share (processes sharing one device)
  std::string name;         // label in plans and errors; empty: HOSTNAME-PID
  std::string data_listen;  // hop listener; empty: the local address that reaches the host, port 0
  HopOptions hops;          // heartbeats and timeouts of every connection
  Millis probe_budget{200};
  Millis host_wait{0};      // a host not up yet (name not resolved, refused, no answer) is tried again this long
  bool progress = true;     // a load progress bar on stderr (off for local workers: the host shows its own)
  bool keep_rows = true;    // announce kCapKeepRows (false: the hello of a worker from before it;
                            // frames that carry the flags are still served as run_frame says)
};

/// Where a worker is; for tests and logs.
struct WorkerState {
  uint64_t epoch = 0;          // plan of the current assignment (0: none yet)
  int first = 0, end = 0;      // layers [first, end) loaded
  uint64_t bytes_loaded = 0;   // file bytes read for the current slice (0: a plan kept it as it was)
  uint64_t frames = 0;         // frames run through the slice (counted before they are sent on)
  uint64_t rows_sent = 0;      // hidden-state rows sent on in them (fewer than their tokens when rows are kept)
};

class Worker {
 public:
  explicit Worker(WorkerOptions opts, Network& net);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  /// Joins and serves until the host says bye (Ok) or stop() is called (Ok). Errors:
  /// kUnavailable (the host is unreachable, or lost without a bye: "lost the host: ..."), kPermissionDenied (wrong room secret),
  /// kUnsupported (the host speaks another protocol version), kFailedPrecondition (this worker's
  /// model file differs from the host's: named with both identities), load and backend errors.
  /// Every error is also sent to the host when the control connection is up.
  Status run();
  /// Makes run() return soon (any thread).
  void stop() { stop_ = true; }
  /// Whether the worker got into the pool (its hello sent to the host) before run() returned.
  bool joined() const { return control_ != nullptr; }
  WorkerState state() const;

 private:
  Status join();
  Status handle_assign(const Assign& a);
  Status open_own_model(const std::string& path);  // model_ and model_identity_
  Status load(const Assign& a);
  void serve(uint64_t epoch);
  Status serve_frame(const Message& m, Link& down);
  /// Stops serving the current plan and closes the hop downstream with `why` (its Bye reason).
  void stop_data(std::string_view why);
  void accept_loop();
  Status refuse(const Status& why);  // tells the host, returns why

  WorkerOptions opts_;
  Network& net_;
  std::atomic<bool> stop_{false};
  std::unique_ptr<Backend> backend_;
  std::string joined_host_;  // host part of opts_.host, for an unspecified next-hop host
  std::unique_ptr<Room> room_;  // the hop listener
  HopInbox inbox_;
  std::thread accept_thread_;
  std::unique_ptr<Link> control_;

  // The current assignment and what serves it.
  std::unique_ptr<LocalModel> model_;
  uint64_t model_identity_ = 0;  // model_identity() of model_, read once when it is opened
  std::unique_ptr<Slice> slice_;
  Assign assign_;
  std::string label_;  // "worker 'w1' (layers 2-3)"
  std::unique_ptr<Link> down_;
  std::thread data_thread_;
  std::atomic<bool> data_stop_{false};
  mutable std::mutex state_mu_;
  WorkerState state_;
};

/// Runs one frame through a worker's slice (layers a.first_layer..a.last_layer): the frame's rows
/// in, its hidden state out in a.hop_dtype, same header otherwise. The stage whose layers end the
/// model keeps only the rows the host's head reads (kFrameHeadReadsLast / kFrameHeadReadsNone: 1
/// or 0 rows, kFrameRowsKept set); `rows_sent` gets the rows the result carries. Errors:
/// decode_frame's (against a.d_model and a.context_length), kOutOfRange (more than kFrameTokens
/// tokens), kCorrupt (a frame that already has its rows kept), the slice's.
Result<Message> run_frame(Slice& slice, const Assign& a, const Message& m, int& rows_sent);

/// The local IP address this machine uses to reach `host` (no packet is sent), e.g. "10.0.0.5";
/// "127.0.0.1" for a loopback host. Errors: kUnavailable (cannot resolve or no route).
Result<std::string> local_address_toward(const std::string& host);

}  // namespace shoal::pool
