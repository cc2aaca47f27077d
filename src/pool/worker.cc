#include "pool/worker.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "pool/address.h"
#include "pool/auth.h"
#include "pool/planner.h"
#include "pool/worker_probe.h"

namespace shoal::pool {
namespace {

constexpr Millis kControlSlice{200};  // control-loop wake-up, to notice stop()
constexpr Millis kRetryPause{1000};   // between tries to reach a host that is not up (host_wait)
constexpr Millis kRetryConnect{2000}; // a connect while waiting for the host (a live one answers in ms)
constexpr Millis kDataSlice{100};     // data-loop wake-up, to notice a new assignment
constexpr Millis kWaitUpstream{24 * 3600 * 1000};  // the upstream hop comes when its stage is ready

std::string default_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == 0) std::snprintf(host, sizeof host, "worker");
  return fmt::format("{}-{}", host, getpid());
}

bool unspecified_host(const std::string& h) { return h == "0.0.0.0" || h == "::" || h.empty(); }

}  // namespace

Result<std::string> local_address_toward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &res); rc != 0 || !res) {
    return make_error(Code::kUnavailable, "cannot resolve '{}': {}", host, gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
  const int fd = socket(res->ai_family, SOCK_DGRAM, 0);
  if (fd < 0) return make_error(Code::kUnavailable, "socket: {}", std::strerror(errno));
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  // Connecting a UDP socket only picks the route and the local address; nothing is sent.
  const bool ok = connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  const int err = errno;
  close(fd);
  if (!ok) return make_error(Code::kUnavailable, "no route to '{}': {}", host, std::strerror(err));
  char text[INET6_ADDRSTRLEN] = {};
  const void* a = local.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                                              : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
  if (!inet_ntop(local.ss_family, a, text, sizeof text)) return make_error(Code::kInternal, "inet_ntop failed");
  return std::string(text);
}

Worker::Worker(WorkerOptions opts, Network& net) : opts_(std::move(opts)), net_(net), inbox_(opts_.hops) {
  if (opts_.name.empty()) opts_.name = default_name();
}

Worker::~Worker() {
  stop_ = true;
  stop_data("the worker stops");
  if (accept_thread_.joinable()) accept_thread_.join();
  inbox_.clear();
  if (control_) control_->close("the worker stops");
}

WorkerState Worker::state() const {
  std::lock_guard lock(state_mu_);
  return state_;
}

Status Worker::refuse(const Status& why) {
  if (control_ && control_->is_up()) (void)control_->send(encode(ErrorMsg::from(why)));
  return why;
}

void Worker::accept_loop() {
  while (!stop_) {
    auto a = room_->next(kControlSlice);
    if (!a.ok()) continue;
    if (a->role == PeerRole::kHop) {
      inbox_.add(std::move(a->conn));
      continue;
    }
    const Status why = make_error(Code::kInvalidArgument, "this is the hop listener of worker '{}'; join the host instead",
                                  opts_.name);
    spdlog::warn("refused {}: {}", a->conn->peer(), why.message());
    (void)a->conn->send(encode(ErrorMsg::from(why)));
  }
}

Status Worker::join() {
  // Its own copy (-m) is opened first: a missing or malformed file fails before joining, not at the
  // first plan that gives this worker layers. (The host's path is only known from an assignment.)
  if (!opts_.model.empty()) SHOAL_RETURN_IF_ERROR(open_own_model(opts_.model));
  BackendOptions bo;
  bo.threads = opts_.threads;
  bo.half_prefill = opts_.half_prefill;
  SHOAL_ASSIGN_OR_RETURN(backend_, create_backend(opts_.device, bo));
  SHOAL_ASSIGN_OR_RETURN(SpeedProbe probe, probe_speed(*backend_, opts_.probe_budget));
  SHOAL_ASSIGN_OR_RETURN(Address host, parse_address(opts_.host));
  joined_host_ = host.host;

  // A worker may start before its host (or before the host's name resolves): a host that cannot be
  // resolved, refuses the connection, or does not answer it or the handshake, is tried again
  // kRetryPause later for opts_.host_wait, each connect then bounded by kRetryConnect. A stop()
  // waits for the try in progress: at most kRetryConnect, or a name lookup's own timeout (the
  // resolver's, ~5 s a server that does not answer).
  const auto give_up = Clock::now() + opts_.host_wait;
  const bool waiting = opts_.host_wait.count() > 0;
  bool told = false;
  const auto try_again = [&](const Status& st) {  // false: give up with st
    const bool not_up = st.code() == Code::kUnavailable || st.code() == Code::kDeadlineExceeded;
    if (!not_up || Clock::now() >= give_up || stop_) return false;
    if (!told) {
      spdlog::info("the host is not up ({}); trying again for up to {} s", st.message(),
                   std::chrono::duration_cast<std::chrono::seconds>(opts_.host_wait).count());
      told = true;
    }
    // The next try a pause later, the last one at the end of the wait.
    const auto next = std::min(Clock::now() + kRetryPause, give_up);
    while (Clock::now() < next && !stop_) std::this_thread::sleep_for(kControlSlice);
    return true;  // (the caller's loop sees a stop first)
  };
  const Status stopped = make_error(Code::kUnavailable, "the worker was stopped before it joined");

  std::string listen = opts_.data_listen;
  while (listen.empty()) {
    if (stop_) return stopped;
    Result<std::string> local = local_address_toward(host.host);
    if (local.ok()) {
      listen = Address{*local, 0}.to_string();
    } else if (!try_again(local.status().with_context("joining the host"))) {
      return local.status().with_context("joining the host");
    }
  }
  auto listening = net_.listen(listen);
  if (!listening.ok())
    return listening.status().with_context(opts_.data_listen.empty() ? "the hop listener" : "--data-listen");
  std::unique_ptr<Listener> listener = std::move(*listening);
  SHOAL_ASSIGN_OR_RETURN(Address data, parse_address(listener->address(), true));
  // The host dials the hop port at the address this worker's control connection comes from: a
  // listener on one other interface is not reached there.
  if (!opts_.data_listen.empty() && data.host != "0.0.0.0" && data.host != "::") {
    if (Result<std::string> local = local_address_toward(host.host); local.ok() && *local != data.host) {
      spdlog::warn("--data-listen {} listens on {} only, but the host will connect to the address this worker "
                   "reaches it from, {} (listen on {} or 0.0.0.0)", opts_.data_listen, data.host, *local, *local);
    }
  }
  RoomOptions ro;
  ro.secret = opts_.secret;
  ro.handshake_timeout = opts_.hops.connect_timeout;
  SHOAL_ASSIGN_OR_RETURN(room_, Room::open(std::move(listener), std::move(ro)));
  accept_thread_ = std::thread([this] { accept_loop(); });

  Result<std::unique_ptr<Connection>> conn = make_error(Code::kUnavailable, "not connected");
  for (;;) {
    if (stop_) return stopped;
    conn = net_.connect(opts_.host, waiting ? std::min(opts_.hops.connect_timeout, kRetryConnect)
                                            : opts_.hops.connect_timeout);
    Status st = conn.ok() ? auth_client(**conn, opts_.secret, PeerRole::kWorker, opts_.hops.connect_timeout)
                                .with_context("joining the host at " + opts_.host)
                          : conn.status().with_context("joining the host");
    if (st.ok()) break;
    if (!try_again(st)) return st;
  }
  Hello h;
  h.role = PeerRole::kWorker;
  h.device_kind = backend_->kind() == shoal::DeviceKind::kCuda ? DeviceKind::kCuda : DeviceKind::kCpu;
  h.threads = uint16_t(std::min<unsigned>(opts_.threads > 0 ? unsigned(opts_.threads) : std::thread::hardware_concurrency(),
                                          UINT16_MAX));
  h.data_port = data.port;
  h.mem_lent = opts_.mem > 0 ? opts_.mem : backend_->free_memory() / uint64_t(std::max(1, opts_.mem_share));
  warn_if_more_than_free(opts_.mem, *backend_);
  h.matmul_gflops = float(std::min(probe.matmul_gflops, double(kMaxSpeed)));
  h.mem_gbps = float(std::min(probe.mem_gbps, double(kMaxSpeed)));
  h.capabilities = kCapHopF32 | kCapHopF16 | (opts_.keep_rows ? kCapKeepRows : 0);
  if (model_) {  // (-m: opened before joining; without it the host's path is opened at the first plan)
    h.model_size = model_->file->file_size;
    h.model_hash = model_identity_;
  }
  h.name = printable_text(opts_.name, kMaxNameLen);
  h.device_name = printable_text(backend_->name(), kMaxNameLen);
  if (stop_) return stopped;
  SHOAL_RETURN_IF_ERROR((*conn)->send(encode(h)));
  LinkOptions lo;
  lo.name = "the host at " + opts_.host;
  lo.ping_interval = opts_.hops.ping_interval;
  lo.dead_after = opts_.hops.dead_after;
  lo.bye_at_info = false;  // (run() logs it: "leaving the pool: ...")
  control_ = std::make_unique<Link>(std::move(*conn), std::move(lo));
  // ("hello", not "joined": the host may still refuse it, e.g. for a name a live worker has.)
  spdlog::info("said hello to {} as '{}': {}, lends {}, {:.1f} GB/s, {:.1f} GFLOP/s; hops on {}", opts_.host, h.name,
               h.device_name, format_bytes(h.mem_lent), h.mem_gbps, h.matmul_gflops, data.to_string());
  return Status::Ok();
}

Status Worker::run() {
  if (stop_) return Status::Ok();  // stopped before it joined (a signal during start-up)
  Status st = join();
  if (!st.ok()) {
    if (stop_) return Status::Ok();  // stopped while joining: leaving was asked for
    stop_ = true;
    return refuse(st);
  }
  for (;;) {
    if (stop_) {
      stop_data("the worker stops");
      control_->close("the worker stops");
      return Status::Ok();
    }
    auto m = control_->recv(kControlSlice);
    if (!m.ok()) {
      if (m.status().code() == Code::kDeadlineExceeded) continue;
      const bool asked_to_stop = stop_;
      stop_data("the worker stops");
      stop_ = true;
      // A host that said bye ended the pool in order; one lost without a word (killed, its machine
      // gone) fails the worker, so that a supervisor restarting on failure starts it again.
      if (!asked_to_stop && !control_->said_bye())
        return make_error(Code::kUnavailable, "lost the host: {}", m.status().message());
      spdlog::info("leaving the pool: {}", m.status().message());
      return Status::Ok();
    }
    if (m->type == MsgType::kAssign) {
      auto a = decode<Assign>(*m);
      st = a.ok() ? handle_assign(*a) : a.status();
      if (!st.ok() && st.code() == Code::kUnavailable) spdlog::warn("{}", st.to_string());
      if (!st.ok() && st.code() != Code::kUnavailable) {
        stop_data("the worker stops");
        stop_ = true;
        control_->close("the worker cannot serve: " + st.message());
        return st;
      }
    } else if (m->type == MsgType::kError) {
      auto e = decode<ErrorMsg>(*m);
      stop_data("the worker stops");
      stop_ = true;
      return e.ok() ? e->to_status("the host") : e.status();
    } else {
      spdlog::warn("ignoring a {} message from the host", msg_type_name(m->type));
    }
  }
}

Status Worker::open_own_model(const std::string& path) {
  auto m = open_model(path, /*with_tokenizer=*/false);
  if (!m.ok()) return m.status().with_context("worker '" + opts_.name + "' opening " + path);
  SHOAL_ASSIGN_OR_RETURN(model_identity_, model_identity(*m->file));
  model_ = std::make_unique<LocalModel>(std::move(*m));
  return Status::Ok();
}

Status Worker::load(const Assign& a) {
  if (!model_) {
    const std::string path = opts_.model.empty() ? a.model_name : opts_.model;
    if (path.empty()) {
      return make_error(Code::kInvalidArgument, "the host sent no model path and this worker was started without -m");
    }
    if (Status st = open_own_model(path); !st.ok()) {
      if (!opts_.model.empty()) return st;
      return Status(st.code(), st.message() + " (the path the host sent: give this worker its copy with -m MODEL)");
    }
  }
  const ModelFile& f = *model_->file;
  const uint64_t hash = model_identity_;
  if (f.file_size != a.model_size || hash != a.model_hash) {
    return make_error(Code::kFailedPrecondition,
                      "wrong model file: the host has '{}' ({} bytes, identity {:016x}); worker '{}' has '{}' ({} "
                      "bytes, identity {:016x})",
                      a.model_name, a.model_size, a.model_hash, opts_.name, f.path, f.file_size, hash);
  }
  const ModelConfig& cfg = model_->config;
  if (uint32_t(cfg.n_layers) != a.n_layers || uint32_t(cfg.d_model) != a.d_model) {
    return make_error(Code::kFailedPrecondition, "the host says the model has {} layers of width {}; worker '{}' reads {} of {}",
                      a.n_layers, a.d_model, opts_.name, cfg.n_layers, cfg.d_model);
  }
  const SliceSpec spec{int(a.first_layer), int(a.last_layer) + 1, false, false};
  const bool same = slice_ && slice_->spec().first == spec.first && slice_->spec().end == spec.end &&
                    slice_->options().n_ctx == int(a.context_length) && slice_->options().kv_dtype == a.kv_dtype;
  if (same) {  // kept: nothing read this time
    slice_->rewind(0);
    std::lock_guard lock(state_mu_);
    state_.bytes_loaded = 0;
    return Status::Ok();
  }
  slice_.reset();
  SliceOptions so;
  so.n_ctx = int(a.context_length);
  so.kv_dtype = a.kv_dtype;
  so.max_tokens = kFrameTokens;
  so.warm_up = opts_.warm_up;
  const uint64_t before = model_->file->bytes_read();
  // A bar on stderr for a long load; the load stops when the worker is stopped or the host left.
  LoadProgress bar = opts_.progress ? stderr_progress(fmt::format("worker '{}' loading", opts_.name)) : LoadProgress{};
  auto progress = [&](uint64_t done, uint64_t total) {
    const bool go = !stop_ && control_->is_up();
    if (bar) bar(done, total);
    if (!go && bar && isatty(2)) std::fputc('\n', stderr);  // end the bar's line before the logs
    return go;
  };
  auto s = Slice::load(*model_->file, cfg, model_->weights, spec, so, *backend_, progress);
  if (!s.ok()) return s.status().with_context(fmt::format("worker '{}' loading layers {}-{}", opts_.name, a.first_layer, a.last_layer));
  slice_ = std::move(*s);
  std::lock_guard lock(state_mu_);
  state_.bytes_loaded = model_->file->bytes_read() - before;
  state_.first = spec.first;
  state_.end = spec.end;
  return Status::Ok();
}

Status Worker::handle_assign(const Assign& a) {
  stop_data("the stage takes a new plan");
  spdlog::info("plan {}: layers {}-{} (stage {} of 0-{}), next hop {}", a.plan_epoch, a.first_layer, a.last_layer,
               a.stage, a.n_stages - 1, a.next_hop);
  const auto t0 = std::chrono::steady_clock::now();
  Status loaded = load(a);
  if (stop_ || !control_->is_up()) return Status::Ok();  // asked to leave while loading: run() says why
  if (!loaded.ok()) return refuse(loaded);
  const float seconds = std::chrono::duration<float>(std::chrono::steady_clock::now() - t0).count();
  assign_ = a;
  label_ = fmt::format("worker '{}' (layers {}-{})", opts_.name, a.first_layer, a.last_layer);
  SHOAL_ASSIGN_OR_RETURN(Address next, parse_address(a.next_hop));
  if (unspecified_host(next.host)) next.host = joined_host_;
  const bool last = a.stage + 1 == a.n_stages;
  const std::string name = last ? "hop to the host" : fmt::format("hop to stage {}", a.stage + 1);
  auto down = open_hop(net_, next.to_string(), opts_.secret, a.plan_epoch, a.stage, name, opts_.hops);
  if (!down.ok()) {
    // A next stage that does not answer in time (frozen, gone) is that stage's fault, not this
    // worker's: unavailable, so that this worker stays in the pool and the host plans again
    // (docs/protocol.md).
    Status why = down.status().with_context(label_);
    if (why.code() == Code::kDeadlineExceeded) why = make_error(Code::kUnavailable, "{}", why.message());
    return refuse(why);
  }
  down_ = std::move(*down);
  uint64_t bytes = 0;
  {
    std::lock_guard lock(state_mu_);
    state_.epoch = a.plan_epoch;
    state_.frames = 0;
    state_.rows_sent = 0;
    bytes = state_.bytes_loaded;
  }
  if (bytes == 0) {
    spdlog::info("{} ready: its layers kept from the last plan", label_);
  } else {
    spdlog::info("{} ready: {} read from the file in {:.2f} s", label_, format_bytes(bytes), seconds);
  }
  SHOAL_RETURN_IF_ERROR(control_->send(encode(Ready{bytes, seconds})));
  data_thread_ = std::thread([this, epoch = a.plan_epoch] { serve(epoch); });
  return Status::Ok();
}

void Worker::stop_data(std::string_view why) {
  data_stop_ = true;
  if (data_thread_.joinable()) data_thread_.join();
  data_stop_ = false;
  if (down_) {
    down_->close(why);
    down_.reset();
  }
}

void Worker::serve(uint64_t epoch) {
  auto abort = [&]() -> Status {
    return data_stop_ ? make_error(Code::kUnavailable, "plan {} was replaced", epoch) : Status::Ok();
  };
  auto up = inbox_.take(epoch, uint16_t(assign_.stage - 1), kWaitUpstream, abort);
  if (!up.ok()) {
    if (!data_stop_) spdlog::warn("{}: {}", label_, up.status().to_string());
    return;
  }
  Status st;
  while (!data_stop_ && st.ok()) {
    auto m = (*up)->recv(kDataSlice);
    if (!m.ok()) {
      if (m.status().code() == Code::kDeadlineExceeded) continue;
      if (!data_stop_) spdlog::debug("{}: the upstream hop closed: {}", label_, m.status().message());
      break;
    }
    if (m->type == MsgType::kFrame) {
      st = serve_frame(*m, *down_);
    } else if (m->type == MsgType::kRewind) {
      auto r = decode<Rewind>(*m);
      if (r.ok()) slice_->rewind(int64_t(r->pos));
      st = r.ok() ? down_->send(*m) : r.status();
    } else {
      st = make_error(Code::kCorrupt, "a {} message on the hop from the previous stage", msg_type_name(m->type));
    }
  }
  if (!st.ok()) {
    const Status why = st.with_context(label_);
    spdlog::error("{}", why.to_string());
    if (control_->is_up()) (void)control_->send(encode(ErrorMsg::from(why)));
    down_->close("the stage failed: " + st.message());
  }
  (*up)->close("the stage stops serving plan " + std::to_string(epoch));
}

Result<Message> run_frame(Slice& slice, const Assign& a, const Message& m, int& rows_sent) {
  SHOAL_ASSIGN_OR_RETURN(FrameView f, decode_frame(m, FrameLimits{a.d_model, a.context_length}));
  const int n = f.header.n_tokens;
  if (n > kFrameTokens) return make_error(Code::kOutOfRange, "frame of {} tokens (at most {})", n, kFrameTokens);
  if (f.header.flags & kFrameRowsKept)
    return make_error(Code::kCorrupt,
                      "frame with flags 0x{:02x}: its rows were already kept by the stage ending the model",
                      f.header.flags);
  StepInput in;
  in.n = n;
  in.pos0 = f.header.pos;
  in.hidden = f.data.data();
  in.hidden_dtype = f.header.dtype == HopDType::kF16 ? DType::kF16 : DType::kF32;
  FrameHeader h = f.header;
  h.dtype = a.hop_dtype;
  const bool ends_model = a.last_layer + 1 == a.n_layers;
  if (ends_model && (h.flags & (kFrameHeadReadsLast | kFrameHeadReadsNone))) h.flags |= kFrameRowsKept;
  const int rows = frame_rows(h);
  Message out = encode_frame(h, {});
  out.payload.resize(kFrameHeaderSize + size_t(rows) * a.d_model * hop_dtype_size(h.dtype));
  StepOutput so;
  so.hidden = out.payload.data() + kFrameHeaderSize;
  so.hidden_dtype = h.dtype == HopDType::kF16 ? DType::kF16 : DType::kF32;
  if (rows != n) so.keep_rows = rows;
  SHOAL_RETURN_IF_ERROR(slice.forward(in, so));
  rows_sent = rows;
  return out;
}

Status Worker::serve_frame(const Message& m, Link& down) {
  int rows = 0;
  SHOAL_ASSIGN_OR_RETURN(Message out, run_frame(*slice_, assign_, m, rows));
  {
    std::lock_guard lock(state_mu_);  // before the send: once the host has the frame, the state counts it
    ++state_.frames;
    state_.rows_sent += uint64_t(rows);
  }
  return down.send(out);
}

}  // namespace shoal::pool
