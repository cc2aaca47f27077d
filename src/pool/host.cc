#include "pool/host.h"

#include <algorithm>

#include "core/log.h"
#include "pool/address.h"
#include "pool/worker_probe.h"
#include "runtime/weight_loader.h"

namespace shoal::pool {

// The wire's limit on an assignment's context and the one -c takes are one figure.
static_assert(kMaxContext == uint32_t(shoal::kMaxContext));

namespace {

constexpr Millis kArrivalSlice{200};
constexpr Millis kReadySlice{100};
constexpr int kPlanAttempts = 4;  // plans tried in one ensure_plan() while workers keep failing
constexpr int kRequestAttempts = 4;  // runs of a request whose chain keeps breaking before its first token

}  // namespace

struct Host::Member {
  Hello hello;
  std::string name;     // unique among the live members (a dead one's may be reused)
  std::string peer;     // its control connection's address, "IP:PORT"
  std::string address;  // its hop listener, "IP:PORT"
  std::unique_ptr<Link> link;
  // ASSIGNs sent and not yet answered (READY or ERROR; the planning thread's). READY carries no
  // plan epoch: while more than one is out, the first replies belong to plans given up on.
  int unanswered = 0;
  bool holds_layers = false;  // its READY came for layers of the last plan (the planner's bonus)
};

std::vector<LayerRange> even_split(uint32_t n_layers, size_t n_devices) {
  std::vector<LayerRange> out;
  const uint32_t k = uint32_t(std::min<size_t>(n_devices, n_layers));
  if (k == 0) return out;
  uint32_t next = 0;
  for (uint32_t i = 0; i < k; ++i) {
    const uint32_t n = n_layers / k + (i < n_layers % k ? 1 : 0);
    out.push_back({next, next + n - 1});
    next += n;
  }
  return out;
}

Result<std::unique_ptr<Host>> Host::open(HostOptions opts, Network& net) {
  if (opts.secret.empty()) return make_error(Code::kInvalidArgument, "the room secret is empty");
  SHOAL_ASSIGN_OR_RETURN(LocalModel model, open_model(opts.model, opts.tokenizer));
  {  // the plan's flags, before any worker joins
    PlanOptions po;
    po.layers_local = opts.layers_local;
    po.split = opts.split;
    SHOAL_RETURN_IF_ERROR(check_plan_flags(po, uint32_t(model.config.n_layers),
                                           opts.workers > 0 ? std::optional<size_t>(opts.workers) : std::nullopt));
  }
  SHOAL_ASSIGN_OR_RETURN(const uint64_t identity, model_identity(*model.file));
  BackendOptions bo;
  bo.threads = opts.threads;
  bo.half_prefill = opts.half_prefill;
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, create_backend(opts.device, bo));
  std::unique_ptr<Host> h(new Host(std::move(opts), net, std::move(model), std::move(backend)));
  h->model_identity_ = identity;
  const HostOptions& o = h->opts_;
  const ModelConfig& cfg = h->model_.config;
  SHOAL_ASSIGN_OR_RETURN(SpeedProbe probe, probe_speed(*h->backend_, o.probe_budget));
  h->self_.name = "host";
  h->self_.mem_bytes = o.mem > 0 ? o.mem : h->backend_->free_memory() / uint64_t(std::max(1, o.mem_share));
  warn_if_more_than_free(o.mem, *h->backend_);
  h->self_.mem_gbps = probe.mem_gbps;
  h->self_.matmul_gflops = probe.matmul_gflops;
  h->self_.hop_latency_s = 0;
  h->self_.is_host = true;
  SliceOptions so;
  so.n_ctx = context_length(o.n_ctx, cfg.n_ctx_train);
  so.kv_dtype = o.kv_dtype;
  so.max_tokens = o.max_tokens;
  so.warm_up = o.warm_up;
  SHOAL_ASSIGN_OR_RETURN(h->layer_bytes_, layer_bytes(cfg, h->model_.weights, so.n_ctx, o.kv_dtype));
  // The embedding, and the head in a slice of its own (the chain's end; a tied head keeps a copy).
  SHOAL_ASSIGN_OR_RETURN(const uint64_t embed_bytes, global_bytes(cfg, h->model_.weights, true, false));
  SHOAL_ASSIGN_OR_RETURN(const uint64_t head_bytes, global_bytes(cfg, h->model_.weights, false, true));
  h->host_bytes_ = embed_bytes + head_bytes;
  h->pipeline_ = std::make_unique<PoolPipeline>(*h->model_.file, cfg, h->model_.weights, *h->backend_, so, o.hop_dtype,
                                                o.progress ? stderr_progress("loading") : LoadProgress{});
  const Tokenizer* tok = h->model_.tokenizer.get();
  h->session_ = std::make_unique<Session>(*h->pipeline_, [tok](int32_t id) { return tok && tok->is_eog(id); });
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Listener> listener, net.listen(o.listen));
  RoomOptions ro;
  ro.secret = o.secret;
  ro.handshake_timeout = o.hops.connect_timeout;
  ro.max_pending = o.max_pending;
  Host* self = h.get();
  ro.on_refused = [self](const std::string& peer, const Status& why) { self->refuse(peer, why, /*log=*/false); };
  SHOAL_ASSIGN_OR_RETURN(h->room_, Room::open(std::move(listener), std::move(ro)));
  spdlog::info("model {} ({}): {} layers, d_model {}, context {}; host {}, {:.1f} GB/s, {:.1f} GFLOP/s", cfg.name,
               cfg.arch, cfg.n_layers, cfg.d_model, so.n_ctx, h->backend_->name(), probe.mem_gbps, probe.matmul_gflops);
  spdlog::info("room open on {}", h->room_->address());
  h->arrival_thread_ = std::thread([self] { self->arrival_loop(); });
  return h;
}

Host::Host(HostOptions opts, Network& net, LocalModel model, std::unique_ptr<Backend> backend)
    : opts_(std::move(opts)), net_(net), model_(std::move(model)), backend_(std::move(backend)), hops_(opts_.hops) {}

Host::~Host() {
  stopping_ = true;
  if (arrival_thread_.joinable()) arrival_thread_.join();
  room_.reset();
  session_.reset();
  pipeline_.reset();
  hops_.clear();
  say_bye("the host is shutting down");
}

void Host::say_bye(std::string_view reason) {
  std::lock_guard lock(mu_);
  for (auto& m : members_) m->link->close(reason);
  for (auto& g : guests_) g->close(reason);
}

std::string Host::address() const { return room_->address(); }

size_t Host::refused() const {
  std::lock_guard lock(mu_);
  return refused_;
}

std::string Host::last_refusal() const {
  std::lock_guard lock(mu_);
  return last_refusal_;
}

size_t Host::n_workers() const {
  std::lock_guard lock(mu_);
  return live_members_locked();
}

size_t Host::live_members_locked() const {
  return size_t(std::count_if(members_.begin(), members_.end(), [](const auto& m) { return m->link->is_up(); }));
}

std::vector<StageInfo> Host::stages() const {
  std::lock_guard lock(mu_);
  return stages_;
}

void Host::refuse(const std::string& who, const Status& why, bool log) {
  if (log) spdlog::warn("refused {}: {}", who, why.to_string());
  std::lock_guard lock(mu_);
  ++refused_;
  last_refusal_ = fmt::format("{}: {}", who, why.to_string());
}

void Host::arrival_loop() {
  while (!stopping_) {
    auto a = room_->next(kArrivalSlice);
    if (a.ok()) admit(std::move(*a));
  }
}

void Host::admit(Arrival a) {
  if (a.role == PeerRole::kHop) {
    hops_.add(std::move(a.conn));
    return;
  }
  const std::string peer = a.conn->peer();
  // The peer's heartbeats may come before its hello; they are answered once it is a member.
  const auto deadline = Clock::now() + opts_.hops.connect_timeout;
  Result<Message> m = make_error(Code::kDeadlineExceeded, "no hello from {}", peer);
  do {
    m = a.conn->recv(std::chrono::ceil<Millis>(std::max(deadline - Clock::now(), Clock::duration::zero())));
  } while (m.ok() && (m->type == MsgType::kPing || m->type == MsgType::kPong));
  Result<Hello> hello = m.ok() ? decode<Hello>(*m) : Result<Hello>(m.status());
  auto addr = parse_address(peer);
  std::string who = peer;  // as the refusal names it
  if (hello.ok() && a.role != hello->role) {
    hello = make_error(Code::kInvalidArgument, "authenticated as a {} but says hello as a {}", peer_role_name(a.role),
                       peer_role_name(hello->role));
  } else if (hello.ok() && a.role == PeerRole::kWorker && hello->data_port == 0) {
    hello = make_error(Code::kInvalidArgument, "a worker's hello must name its hop port");
  } else if (hello.ok() && !addr.ok()) {
    hello = addr.status();
  } else if (hello.ok() && hello->model_size != 0 &&
             (hello->model_size != model_.file->file_size || hello->model_hash != model_identity_)) {
    who = fmt::format("worker '{}' (from {})", hello->name, peer);
    hello = make_error(Code::kFailedPrecondition,
                       "wrong model file: the host has '{}' ({} bytes, identity {:016x}); worker '{}' has one of {} "
                       "bytes, identity {:016x}", model_.file->path, model_.file->file_size, model_identity_,
                       hello->name, hello->model_size, hello->model_hash);
  }
  if (!hello.ok()) {
    refuse(who, hello.status());
    (void)a.conn->send(encode(ErrorMsg::from(hello.status())));
    a.conn->close();
    return;
  }
  LinkOptions lo;
  lo.ping_interval = opts_.hops.ping_interval;
  lo.dead_after = opts_.hops.dead_after;
  lo.bye_to_silent_peer = true;  // control links: a worker frozen past dead_after learns why it is dropped
  lo.on_down = [this](const Status&) {
    changed_ = true;
    cv_.notify_all();
  };
  std::unique_lock lock(mu_);
  if (a.role == PeerRole::kWorker) {
    // A name is a worker's identity in plans and errors (its own logs use it too): a live member
    // keeps it; one whose link is down is replaced (a worker restarted under its name), and
    // drop_dead_members() logs it out of the pool at the next plan.
    for (const auto& other : members_) {
      if (other->name != hello->name || !other->link->is_up()) continue;
      const Status taken = make_error(Code::kInvalidArgument,
                                      "the name '{}' is taken by a live worker of the pool (from {}); start this "
                                      "one with another --name, or, if that worker is gone, again after "
                                      "{} ms (the host's --dead-after)",
                                      hello->name, other->peer, opts_.hops.dead_after.count());
      lock.unlock();
      refuse(peer, taken);
      (void)a.conn->send(encode(ErrorMsg::from(taken)));
      a.conn->close();
      return;
    }
  }
  if (a.role == PeerRole::kGuest) {
    lo.name = fmt::format("guest '{}'", hello->name);
    spdlog::info("guest '{}' joined from {}", hello->name, peer);
    guests_.push_back(std::make_unique<Link>(std::move(a.conn), std::move(lo)));
    return;
  }
  auto mem = std::make_unique<Member>();
  mem->hello = *hello;
  mem->name = hello->name;
  mem->peer = peer;
  mem->address = Address{addr->host, hello->data_port}.to_string();
  lo.name = fmt::format("worker '{}'", mem->name);
  mem->link = std::make_unique<Link>(std::move(a.conn), std::move(lo));
  spdlog::info("worker '{}' joined from {}: {}, lends {}, {:.1f} GB/s, {:.1f} GFLOP/s", mem->name, peer,
               hello->device_name, format_bytes(hello->mem_lent), hello->mem_gbps, hello->matmul_gflops);
  members_.push_back(std::move(mem));
  changed_ = true;
  cv_.notify_all();
}

Status Host::wait_for_workers(size_t n, Millis timeout, const std::function<Status()>& check) {
  const auto deadline = Clock::now() + timeout;
  std::unique_lock lock(mu_);
  for (;;) {
    const size_t alive = live_members_locked();
    if (alive >= n) return Status::Ok();
    if (check) {
      lock.unlock();
      SHOAL_RETURN_IF_ERROR(check());
      lock.lock();
    }
    if (Clock::now() >= deadline) {
      return make_error(Code::kDeadlineExceeded, "{} of {} workers joined {} within {} ms", alive, n, room_->address(),
                        timeout.count());
    }
    cv_.wait_for(lock, kArrivalSlice);
  }
}

void Host::drop_dead_members() {
  std::vector<std::unique_ptr<Member>> gone;
  {
    std::lock_guard lock(mu_);
    for (auto it = members_.begin(); it != members_.end();) {
      if ((*it)->link->is_up()) {
        ++it;
        continue;
      }
      gone.push_back(std::move(*it));  // (its link's going down marked the change)
      it = members_.erase(it);
    }
  }
  for (auto& m : gone) {  // (the peer tells it from a worker that rejoined under its name)
    spdlog::warn("worker '{}' is out of the pool (joined from {}): {}", m->name, m->peer, m->link->status().message());
  }
}

Status Host::ensure_plan() {
  Status last;
  for (int attempt = 0; attempt < kPlanAttempts; ++attempt) {
    if (!changed_ && pipeline_->ready()) return Status::Ok();
    pipeline_->clear_chain();  // it points at members' links: drop it before any member
    changed_ = false;  // (before the drop: a member that dies from here on marks a change again)
    drop_dead_members();
    bool retry = false;
    last = plan_once(retry);
    if (last.ok()) return replay();
    if (!retry) {  // the planner's or the host's own failure: the same pool would fail the same way
                   // (workers assigned before the host's load failed answer later: skipped then)
      changed_ = true;  // try again at the next request: the pool may have changed
      return last;
    }
    spdlog::warn("planning again: {}", last.to_string());
    changed_ = true;
  }
  return last;
}

Status Host::replay() {
  const std::vector<int32_t> cached = session_->cached();
  if (cached.empty()) return Status::Ok();
  StepOutput out;
  out.mode = HeadMode::kNone;
  if (Status st = pipeline_->forward(cached, 0, out); !st.ok()) {
    session_->reset();
    return st.with_context("replaying the cached prompt into the new plan");
  }
  spdlog::info("replayed {} cached tokens into the new plan", cached.size());
  return Status::Ok();
}

Status Host::wait_ready(Member& m, uint64_t epoch) {
  // A load takes as long as it takes (the link's heartbeats tell a live worker from a dead one);
  // a long one is said every kLoadNote, so that a host that waits is not a silent one.
  constexpr auto kLoadNote = std::chrono::seconds(10);
  const auto start = Clock::now();
  auto next_note = start + kLoadNote;
  for (;;) {
    auto r = m.link->recv(kReadySlice);
    if (!r.ok()) {
      if (r.status().code() != Code::kDeadlineExceeded) return r.status();
      if (Clock::now() >= next_note) {
        spdlog::info("waiting for worker '{}' to load its part of plan {} ({:.0f} s so far)", m.name, epoch,
                     std::chrono::duration<double>(Clock::now() - start).count());
        next_note += kLoadNote;
      }
      continue;
    }
    if (const bool answer = r->type == MsgType::kReady || r->type == MsgType::kError; answer) {
      if (m.unanswered > 1) {
        --m.unanswered;  // the answer to an assignment of a plan given up on
        spdlog::debug("worker '{}': a {} for an earlier plan, skipped", m.name, msg_type_name(r->type));
        continue;
      }
      m.unanswered = 0;
    }
    if (r->type == MsgType::kReady) {
      SHOAL_ASSIGN_OR_RETURN(Ready ready, decode<Ready>(*r));
      std::lock_guard lock(mu_);
      for (StageInfo& s : stages_) {
        if (s.name == m.name) s.bytes_loaded = ready.bytes_loaded;
      }
      if (ready.bytes_loaded == 0) {
        spdlog::info("worker '{}' ready for plan {}: its layers kept", m.name, epoch);
      } else {
        spdlog::info("worker '{}' ready for plan {}: {} read in {:.2f} s", m.name, epoch,
                     format_bytes(ready.bytes_loaded), ready.load_seconds);
      }
      return Status::Ok();
    }
    if (r->type == MsgType::kError) {
      auto e = decode<ErrorMsg>(*r);
      return e.ok() ? e->to_status(fmt::format("worker '{}'", m.name)) : e.status();
    }
    spdlog::debug("worker '{}': ignoring a {} message while it loads", m.name, msg_type_name(r->type));
  }
}

Status Host::plan_once(bool& retry) {
  retry = false;
  pipeline_->clear_chain();
  std::vector<Member*> workers;
  {
    std::lock_guard lock(mu_);
    for (auto& m : members_) workers.push_back(m.get());
  }
  if (opts_.spread) {  // local pools: local-1, local-2, ... in order, whoever joined first
    std::stable_sort(workers.begin(), workers.end(), [](const Member* a, const Member* b) {
      return a->name.size() != b->name.size() ? a->name.size() < b->name.size() : a->name < b->name;
    });
  }
  const ModelConfig& cfg = model_.config;
  PlanInput in;
  in.devices.push_back(self_);
  for (Member* m : workers) {
    DeviceFacts d;
    d.name = m->name;
    d.mem_bytes = m->hello.mem_lent;
    d.mem_gbps = m->hello.mem_gbps;
    d.matmul_gflops = m->hello.matmul_gflops;
    const auto rtt = m->link->rtt();
    d.hop_latency_s = rtt.count() > 0 ? rtt.count() * 0.5e-6 : -1;
    d.holds_layers = m->holds_layers;
    in.devices.push_back(d);
  }
  in.layer_bytes = layer_bytes_;
  in.host_bytes = host_bytes_;
  PlanOptions po;
  po.layers_local = opts_.layers_local;
  po.split = opts_.spread && opts_.split.empty() && !opts_.layers_local
                 ? even_split(uint32_t(cfg.n_layers), in.devices.size())
                 : opts_.split;
  SHOAL_ASSIGN_OR_RETURN(Plan plan, make_plan(in, po));
  const uint64_t epoch = ++epoch_;
  std::string table = plan.to_string(in);
  if (!table.empty() && table.back() == '\n') table.pop_back();
  spdlog::info("plan {} for {} layers:\n{}", epoch, cfg.n_layers, table);

  std::vector<Member*> chain;  // workers in chain order
  {
    std::lock_guard lock(mu_);
    stages_.clear();
    for (const Stage& s : plan.stages) {
      Member* m = s.device == 0 ? nullptr : workers[s.device - 1];
      if (m) chain.push_back(m);
      stages_.push_back({m ? m->name : "host", s.first, s.n_layers, 0});
    }
  }
  for (Member* m : workers) m->holds_layers = false;  // until its READY for this plan
  const int n_local = int(plan.stages[0].n_layers);
  if (chain.empty()) return pipeline_->set_local(n_local, /*alone=*/true);

  // From here a failure may be a worker's: worth planning again without it.
  retry = true;
  const uint16_t n_stages = uint16_t(plan.stages.size());
  for (size_t i = 0; i < chain.size(); ++i) {
    const Stage& s = plan.stages[i + 1];
    // Drop what a previous plan left (errors of a failed request, answers to given-up plans).
    for (auto r = chain[i]->link->recv(Millis(0)); r.ok(); r = chain[i]->link->recv(Millis(0))) {
      if ((r->type == MsgType::kReady || r->type == MsgType::kError) && chain[i]->unanswered > 0) --chain[i]->unanswered;
    }
    Assign a;
    a.plan_epoch = epoch;
    a.model_size = model_.file->file_size;
    a.model_hash = model_identity_;
    a.n_layers = uint32_t(cfg.n_layers);
    a.first_layer = s.first;
    a.last_layer = s.last();
    a.d_model = uint32_t(cfg.d_model);
    a.context_length = uint32_t(pipeline_->n_ctx());
    a.stage = uint16_t(i + 1);
    a.n_stages = n_stages;
    a.hop_dtype = opts_.hop_dtype;
    a.kv_dtype = opts_.kv_dtype;
    a.model_name = printable_text(model_.file->path, kMaxModelNameLen);
    a.next_hop = i + 1 < chain.size() ? chain[i + 1]->address : room_->address();
    SHOAL_RETURN_IF_ERROR(chain[i]->link->send(encode(a)));
    ++chain[i]->unanswered;
  }
  // The host loads its part while the workers load theirs (the assignments are out).
  if (Status st = pipeline_->set_local(n_local, /*alone=*/false); !st.ok()) {
    retry = false;
    return st;
  }
  for (Member* m : chain) {
    Status st = wait_ready(*m, epoch);
    m->holds_layers = st.ok();
    if (st.ok()) continue;
    if (st.code() != Code::kUnavailable) {
      refuse(fmt::format("worker '{}'", m->name), st);
      m->link->close("refused: " + st.message());
    }
    return make_error(Code::kUnavailable, "worker '{}' did not take its part of plan {}: {}", m->name, epoch,
                      st.message());
  }
  Chain c;
  c.epoch = epoch;
  c.keep_rows = std::all_of(chain.begin(), chain.end(),
                            [](const Member* m) { return (m->hello.capabilities & kCapKeepRows) != 0; });
  for (size_t i = 0; i < chain.size(); ++i) {
    const Stage& s = plan.stages[i + 1];
    c.stages.push_back({fmt::format("worker '{}' (layers {}-{})", chain[i]->name, s.first, s.last()), chain[i]->link.get()});
  }
  SHOAL_ASSIGN_OR_RETURN(c.out, open_hop(net_, chain[0]->address, opts_.secret, epoch, 0,
                                         fmt::format("hop to worker '{}'", chain[0]->name), opts_.hops));
  auto abort = [&]() -> Status {
    for (const RemoteStage& s : c.stages) SHOAL_RETURN_IF_ERROR(s.control->status().with_context(s.label));
    return Status::Ok();
  };
  auto back = hops_.take(epoch, uint16_t(n_stages - 1), opts_.hops.connect_timeout, abort);
  if (!back.ok()) return make_error(Code::kUnavailable, "the hop back from the last worker: {}", back.status().message());
  c.in = std::move(*back);
  pipeline_->set_chain(std::move(c));
  return Status::Ok();
}

Result<std::vector<int32_t>> Host::generate(std::span<const int32_t> prompt, const GenerateOptions& opts,
                                            const TokenCallback& on_token, GenerateStats* stats) {
  SHOAL_RETURN_IF_ERROR(check_prompt_fits(prompt.size(), n_ctx()));  // before a plan may load layers
  SHOAL_RETURN_IF_ERROR(ensure_plan());
  bool handed = false;  // a token went to the caller: the request cannot be made again unseen
  const TokenCallback counted = [&](int32_t id) {
    handed = true;
    return on_token ? on_token(id) : true;
  };
  for (int attempt = 1;; ++attempt) {
    auto out = session_->generate(prompt, opts, counted, stats);
    if (out.ok() || handed || pipeline_->ready() || out.status().code() != Code::kUnavailable ||
        attempt == kRequestAttempts)
      return out;
    spdlog::warn("{}; planning again and running the request again", out.status().to_string());
    if (Status st = ensure_plan(); !st.ok()) {  // (kUnavailable: the pool that served the plan is gone)
      return make_error(Code::kUnavailable, "{}; the plan made again failed: {}", out.status().message(),
                        st.to_string());
    }
  }
}

}  // namespace shoal::pool
