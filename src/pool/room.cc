#include "pool/room.h"

#include "core/log.h"

namespace shoal::pool {
namespace {
constexpr Millis kAcceptSlice{1000};  // accept() wait per turn; close() wakes it sooner
constexpr Millis kAcceptErrorPause{100};
}  // namespace

Result<std::unique_ptr<Room>> Room::open(std::unique_ptr<Listener> listener, RoomOptions opts) {
  if (opts.secret.empty()) return make_error(Code::kInvalidArgument, "the room secret is empty");
  return std::unique_ptr<Room>(new Room(std::move(listener), std::move(opts)));
}

Room::Room(std::unique_ptr<Listener> listener, RoomOptions opts)
    : listener_(std::move(listener)), opts_(std::move(opts)), address_(listener_->address()) {
  accept_thread_ = std::thread([this] { accept_loop(); });
}

Room::~Room() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (auto& p : pending_) {
      if (p.conn) p.conn->close();
    }
  }
  listener_->close();
  accept_thread_.join();
  for (auto& p : pending_) p.thread.join();  // no new ones: the accept thread is gone
}

size_t Room::refused() const {
  std::lock_guard lock(mu_);
  return refused_;
}

Result<Arrival> Room::next(Millis timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !arrivals_.empty(); })) {
    return make_error(Code::kDeadlineExceeded, "nobody joined {} within {} ms", address_, timeout.count());
  }
  Arrival a = std::move(arrivals_.front());
  arrivals_.pop_front();
  return a;
}

void Room::reap_finished() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->done) {
      it->thread.join();
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void Room::accept_loop() {
  for (;;) {
    auto r = listener_->accept(kAcceptSlice);
    if (!r.ok()) {
      if (r.status().code() == Code::kDeadlineExceeded) continue;
      if (r.status().code() == Code::kUnavailable) return;  // closed
      spdlog::warn("room {}: {}", address_, r.status().to_string());
      std::this_thread::sleep_for(kAcceptErrorPause);
      continue;
    }
    std::unique_ptr<Connection> conn = std::move(*r);
    std::lock_guard lock(mu_);
    if (stopping_) return;
    reap_finished();
    if (pending_.size() >= opts_.max_pending) {
      ++refused_;
      Status why = make_error(Code::kUnavailable, "{} handshakes already in progress", pending_.size());
      spdlog::warn("room {}: refused {}: {}", address_, conn->peer(), why.to_string());
      if (opts_.on_refused) opts_.on_refused(conn->peer(), why);
      continue;  // conn is closed as it goes out of scope
    }
    Pending& p = pending_.emplace_back();
    p.conn = conn.get();
    p.thread = std::thread([this, c = std::move(conn), &p]() mutable {
      auto role = auth_server(*c, opts_.secret, opts_.handshake_timeout);
      const std::string peer = c->peer();
      if (!role.ok())
        spdlog::warn("room {}: refused {}: {}", address_, peer, role.status().to_string());
      else
        spdlog::info("room {}: {} joined as {}", address_, peer, peer_role_name(*role));
      std::unique_ptr<Connection> dropped;
      {
        std::lock_guard lock(mu_);
        p.conn = nullptr;
        if (!role.ok()) ++refused_;
        if (role.ok() && !stopping_) {
          arrivals_.push_back(Arrival{*role, std::move(c)});
        } else {
          dropped = std::move(c);
        }
        cv_.notify_all();
      }
      // Reported once counted, so refused() already includes it when on_refused runs (as for
      // the refusals of accept_loop); done only after it, so the accept loop, which joins done
      // threads under mu_, never waits on a callback that may call refused().
      if (!role.ok() && opts_.on_refused) opts_.on_refused(peer, role.status());
      std::lock_guard lock(mu_);
      p.done = true;
    });
  }
}

}  // namespace shoal::pool
