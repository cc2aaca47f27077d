#include "pool/chain.h"

#include <thread>

#include "core/log.h"
#include "pool/auth.h"

namespace shoal::pool {
namespace {
constexpr Millis kPollSlice{20};  // how often take() looks at held hops and `abort`
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
  return std::make_unique<Link>(std::move(*conn), std::move(lo));
}

void HopInbox::add(std::unique_ptr<Connection> conn) {
  LinkOptions lo;
  lo.name = "hop from " + conn->peer();
  lo.ping_interval = opts_.ping_interval;
  lo.dead_after = opts_.dead_after;
  auto link = std::make_unique<Link>(std::move(conn), std::move(lo));
  std::lock_guard lock(mu_);
  held_.push_back(Held{std::move(link), std::nullopt, Clock::now()});
}

void HopInbox::clear() {
  std::list<Held> gone;
  {
    std::lock_guard lock(mu_);
    gone.swap(held_);
  }
  for (Held& h : gone) h.link->close("the stage no longer waits for this hop");
}

Result<std::unique_ptr<Link>> HopInbox::take(uint64_t epoch, uint16_t from_stage, Millis timeout,
                                             const std::function<Status()>& abort) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    std::list<Held> dropped;
    {
      std::lock_guard lock(mu_);
      for (auto it = held_.begin(); it != held_.end();) {
        Held& h = *it;
        if (!h.open && h.link->is_up()) {
          auto m = h.link->recv(Millis(0));
          if (m.ok()) {
            auto open = decode<HopOpen>(*m);
            if (open.ok()) {
              h.open = *open;
            } else {
              spdlog::warn("{}: {}", h.link->name(), open.status().to_string());
              (void)h.link->send(encode(ErrorMsg::from(open.status())));
            }
          }
        }
        const bool silent = !h.open && Clock::now() - h.since > opts_.connect_timeout;
        const bool stale = h.open && h.open->plan_epoch < epoch;
        const bool wrong = h.open && h.open->plan_epoch == epoch && h.open->from_stage != from_stage;
        if (wrong) {
          const Status why = make_error(Code::kInvalidArgument, "plan {} expects its hop from stage {}, not {}", epoch,
                                        from_stage, h.open->from_stage);
          spdlog::warn("{}: {}", h.link->name(), why.to_string());
          (void)h.link->send(encode(ErrorMsg::from(why)));
        }
        if (!h.link->is_up() || silent || stale || wrong) {
          dropped.splice(dropped.end(), held_, it++);
          continue;
        }
        if (h.open && h.open->plan_epoch == epoch) {
          std::unique_ptr<Link> link = std::move(h.link);
          held_.erase(it);
          return link;
        }
        ++it;
      }
    }
    for (Held& h : dropped) h.link->close("stale or malformed hop");
    if (abort) SHOAL_RETURN_IF_ERROR(abort());
    if (Clock::now() >= deadline) {
      return make_error(Code::kDeadlineExceeded, "no hop from stage {} of plan {} arrived within {} ms", from_stage,
                        epoch, timeout.count());
    }
    std::this_thread::sleep_for(kPollSlice);
  }
}

}  // namespace shoal::pool
