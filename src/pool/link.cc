#include "pool/link.h"

#include "core/log.h"
#include "pool/messages.h"

namespace shoal::pool {
namespace {

uint64_t now_us() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count());
}

}  // namespace

Link::Link(std::unique_ptr<Connection> conn, LinkOptions opts) : conn_(std::move(conn)), opts_(std::move(opts)) {
  if (opts_.name.empty()) opts_.name = conn_->peer();
  thread_ = std::thread([this] { run(); });
}

Link::~Link() {
  close("link closed");
  thread_.join();
}

Status Link::status() const {
  std::lock_guard lock(mu_);
  return down_;
}

void Link::go_down(const Status& why, bool notify, bool orderly) {
  {
    std::lock_guard lock(mu_);
    if (!down_.ok()) return;
    down_ = why;
    said_bye_ = orderly;
  }
  cv_.notify_all();
  conn_->close();
  if (notify) {
    if (orderly) {
      spdlog::log(opts_.bye_at_info ? spdlog::level::info : spdlog::level::debug, "{}", why.message());
    } else {
      spdlog::warn("{}", why.to_string());
    }
    if (opts_.on_down) opts_.on_down(why);
  }
}

bool Link::said_bye() const {
  std::lock_guard lock(mu_);
  return said_bye_;
}

void Link::close(std::string_view reason) {
  stop_ = true;  // first: the peer may close as soon as it has our bye
  if (is_up()) (void)conn_->send(encode(Bye::from(reason)));
  go_down(make_error(Code::kUnavailable, "link to {} closed here: {}", opts_.name, reason), /*notify=*/false);
}

Status Link::send(const Message& m) {
  if (Status st = status(); !st.ok()) return st;
  Status st = conn_->send(m);
  if (!st.ok()) {
    Status why = st.with_context(opts_.name);
    go_down(why, /*notify=*/true);
    return why;
  }
  return st;
}

Result<Message> Link::recv(Millis timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !inbox_.empty() || !down_.ok(); })) {
    return make_error(Code::kDeadlineExceeded, "no message from {} within {} ms", opts_.name, timeout.count());
  }
  if (inbox_.empty()) return down_;
  Message m = std::move(inbox_.front());
  inbox_.pop_front();
  return m;
}

bool Link::send_heartbeat(const Message& m) {
  Status st = conn_->send(m);
  if (st.ok()) return true;
  // A peer that left may have said why (bye, error) before going: the next recv reports that.
  // A stalled peer closed the connection: report the stall.
  if (!conn_->is_closed()) return true;
  go_down(st.with_context(opts_.name), true);
  return false;
}

void Link::run() {
  uint64_t nonce = 0;
  auto last_heard = Clock::now();
  auto next_ping = Clock::now();  // ping at once: the first round trip is known early
  while (!stop_.load() && is_up()) {
    auto now = Clock::now();
    if (now >= next_ping) {
      next_ping = now + opts_.ping_interval;
      if (!send_heartbeat(encode(Ping{++nonce, now_us()}))) return;
    }
    const auto dead_at = last_heard + opts_.dead_after;
    const auto wake = std::min(next_ping, dead_at);
    auto r = conn_->recv(std::chrono::ceil<Millis>(std::max(wake - Clock::now(), Clock::duration::zero())));
    if (stop_.load()) return;
    now = Clock::now();
    if (!r.ok()) {
      if (r.status().code() != Code::kDeadlineExceeded) return go_down(r.status().with_context(opts_.name), true);
      if (now >= dead_at) {
        const double silent = std::chrono::duration<double>(now - last_heard).count();
        const double limit = opts_.dead_after.count() / 1000.0;
        if (opts_.bye_to_silent_peer) {
          (void)conn_->send(encode(Bye::from(
              fmt::format("nothing heard from this peer for {:.1f} s (limit {:.1f} s): it is dropped", silent, limit))));
        }
        return go_down(make_error(Code::kUnavailable, "{} is not answering (silent for {:.1f} s, limit {:.1f} s)",
                                  opts_.name, silent, limit),
                       true);
      }
      continue;
    }
    last_heard = now;
    Message& m = *r;
    switch (m.type) {
      case MsgType::kPing: {
        auto ping = decode<Ping>(m);
        if (!ping.ok()) return go_down(ping.status().with_context(opts_.name), true);
        if (!send_heartbeat(encode(Pong{ping->nonce, ping->time_us}))) return;
        break;
      }
      case MsgType::kPong: {
        auto pong = decode<Pong>(m);
        if (!pong.ok()) return go_down(pong.status().with_context(opts_.name), true);
        const uint64_t t = now_us();
        if (pong->time_us <= t) rtt_us_ = static_cast<int64_t>(t - pong->time_us);
        break;
      }
      case MsgType::kBye: {
        auto bye = decode<Bye>(m);
        const std::string reason = bye.ok() ? bye->reason : bye.status().message();
        return go_down(make_error(Code::kUnavailable, "{} said bye: {}", opts_.name, reason), true, /*orderly=*/true);
      }
      default: {
        std::lock_guard lock(mu_);
        inbox_.push_back(std::move(m));
        cv_.notify_all();
      }
    }
  }
}

}  // namespace shoal::pool
