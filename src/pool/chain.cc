#include "pool/chain.h"

#include <algorithm>
#include <thread>

#include "core/log.h"
#include "pool/auth.h"

namespace shoal::pool {
namespace {
constexpr Millis kPollSlice{20};   // how often take() looks at held hops and `abort`
constexpr Millis kSweepSlice{20};  // how often the sweeper looks at held hops
}  // namespace

Result<std::unique_ptr<Link>> open_hop(Network& net, std::string_view address, std::string_view secret, uint64_t epoch,
                                       uint16_t from_stage, const std::string& name, const HopOptions& opts) {
  auto conn = net.connect(address, opts.connect_timeout);
  if (!conn.ok()) return conn.status().with_context(name);
  if (Status st = auth_client(**conn, secret, PeerRole::kHop, opts.connect_timeout); !st.ok()) {
    return st.with_context(name);
  }
  if (Status st = (*conn)->send(encode(HopOpen{epoch, from_stage})); !st.ok()) return st.with_context(name);
  LinkOptions lo;
  lo.name = name;
  lo.ping_interval = opts.ping_interval;
  lo.dead_after = opts.dead_after;
  lo.bye_at_info = false;
  return std::make_unique<Link>(std::move(*conn), std::move(lo));
}

HopInbox::HopInbox(HopOptions opts) : opts_(opts) {
  sweeper_ = std::thread([this] { sweep_loop(); });
}

HopInbox::~HopInbox() {
  clear();
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  sweeper_.join();
}

void HopInbox::add(std::unique_ptr<Connection> conn) {
  size_t n = 0;
  {
    std::lock_guard lock(mu_);
    n = held_.size();
  }
  if (n >= kMaxHeldHops) {  // only the room's thread adds: the count cannot grow meanwhile
    const Status why = make_error(Code::kUnavailable, "this stage already holds {} hops waiting for their plans", n);
    spdlog::warn("refused a hop from {}: {}", conn->peer(), why.message());
    (void)conn->send(encode(ErrorMsg::from(why)));
    conn->close();
    return;
  }
  LinkOptions lo;
  lo.name = "hop from " + conn->peer();
  lo.ping_interval = opts_.ping_interval;
  lo.dead_after = opts_.dead_after;
  lo.bye_at_info = false;
  auto link = std::make_unique<Link>(std::move(conn), std::move(lo));
  {
    std::lock_guard lock(mu_);
    held_.push_back(Held{std::move(link), std::nullopt, Clock::now()});
  }
  cv_.notify_all();  // the sweeper sleeps while nothing is held
}

size_t HopInbox::held() const {
  std::lock_guard lock(mu_);
  return held_.size();
}

void HopInbox::clear() {
  std::list<Held> gone;
  {
    std::lock_guard lock(mu_);
    gone.swap(held_);
  }
  for (Held& h : gone) h.link->close("the stage no longer waits for this hop");
}

std::unique_ptr<Link> HopInbox::sweep(Dropped& drop, bool claim) {
  const auto now = Clock::now();
  std::unique_ptr<Link> found;
  for (auto it = held_.begin(); it != held_.end();) {
    Held& h = *it;
    Status why;         // the ERROR the hop's sender is told
    std::string quiet;  // or why it goes without one
    if (!h.link->is_up()) {
      quiet = h.link->status().message();
    } else if (!h.open) {
      auto m = h.link->recv(Millis(0));
      if (m.ok()) {
        auto open = decode<HopOpen>(*m);
        if (open.ok()) {
          h.open = *open;
        } else {
          why = open.status();
        }
      } else if (now - h.since > opts_.connect_timeout) {
        quiet = fmt::format("no HOP_OPEN within {} ms", opts_.connect_timeout.count());
      }
    }
    if (why.ok() && quiet.empty() && h.open) {
      const HopOpen& o = *h.open;
      const uint64_t serving = std::max(claimed_, want_ ? want_->epoch : 0);
      if (claimed_ > 0 && o.plan_epoch == claimed_ && o.plan_epoch == serving) {
        why = make_error(Code::kFailedPrecondition, "plan {} already has its hop (this one says stage {})",
                         o.plan_epoch, o.from_stage);
      } else if (o.plan_epoch < serving) {
        why = make_error(Code::kFailedPrecondition, "plan {} is over: this stage serves plan {}", o.plan_epoch, serving);
      } else if (want_ && o.plan_epoch == want_->epoch && o.from_stage != want_->from_stage) {
        why = make_error(Code::kInvalidArgument, "plan {} expects its hop from stage {}, not {}", o.plan_epoch,
                         want_->from_stage, o.from_stage);
      } else if (claim && want_ && o.plan_epoch == want_->epoch && !found) {
        found = std::move(h.link);
        claimed_ = o.plan_epoch;
        it = held_.erase(it);
        continue;
      }
    }
    if (!why.ok() || !quiet.empty()) {
      drop.push_back({std::move(h.link), why, std::move(quiet)});
      it = held_.erase(it);
      continue;
    }
    ++it;
  }
  return found;
}

void HopInbox::close_dropped(Dropped& drop) {
  for (DroppedHop& d : drop) {
    if (!d.why.ok()) {
      spdlog::warn("{}: {}", d.link->name(), d.why.to_string());
      (void)d.link->send(encode(ErrorMsg::from(d.why)));
      d.link->close(d.why.message());
    } else {
      spdlog::debug("{}: closed: {}", d.link->name(), d.quiet);
      d.link->close(d.quiet);
    }
  }
  drop.clear();
}

void HopInbox::sweep_loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    Dropped drop;
    (void)sweep(drop, /*claim=*/false);
    if (!drop.empty()) {
      lock.unlock();
      close_dropped(drop);  // sends and joins link threads: not under mu_
      lock.lock();
    }
    if (held_.empty()) {
      cv_.wait(lock, [&] { return stop_ || !held_.empty(); });
    } else {
      cv_.wait_for(lock, kSweepSlice, [&] { return stop_; });
    }
  }
}

Result<std::unique_ptr<Link>> HopInbox::take(uint64_t epoch, uint16_t from_stage, Millis timeout,
                                             const std::function<Status()>& abort) {
  const auto deadline = Clock::now() + timeout;
  {
    std::lock_guard lock(mu_);
    want_ = Want{epoch, from_stage};
  }
  struct Done {  // the plan no longer waits, however take() returns
    HopInbox& in;
    ~Done() {
      std::lock_guard lock(in.mu_);
      in.want_.reset();
    }
  } done{*this};
  for (;;) {
    Dropped drop;
    std::unique_ptr<Link> found;
    {
      std::lock_guard lock(mu_);
      found = sweep(drop, /*claim=*/true);
    }
    close_dropped(drop);
    if (found) return found;
    if (abort) SHOAL_RETURN_IF_ERROR(abort());
    if (Clock::now() >= deadline) {
      return make_error(Code::kDeadlineExceeded, "no hop from stage {} of plan {} arrived within {} ms", from_stage,
                        epoch, timeout.count());
    }
    std::this_thread::sleep_for(kPollSlice);
  }
}

}  // namespace shoal::pool
