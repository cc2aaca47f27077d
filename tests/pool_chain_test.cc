// The hop inbox (pool/chain.h) over in-process connections: a stage takes the one hop of its plan;
// a second hop for a plan that has its own, hops of plans that are over, hops from the wrong stage,
// first messages that are not a HOP_OPEN, silent hops and hops beyond kMaxHeldHops are refused at
// once, whether or not a plan is waiting (the sweeper), each sender told why; a newer plan's hop
// waits for its stage.
#include <gtest/gtest.h>

#include <thread>

#include "pool/chain.h"
#include "pool/transport_inproc.h"
#include "test_util.h"

namespace shoal::pool {
namespace {

using test::expect_error;
using test::expect_status;
using namespace std::chrono_literals;

HopOptions quick_hops() {
  HopOptions o;
  o.ping_interval = 50ms;
  o.dead_after = 2000ms;
  o.connect_timeout = 300ms;
  return o;
}

/// A stage dialing `in`: its end of the connection (a Link, so heartbeats are answered), having
/// sent `first` (a HOP_OPEN, or anything else).
std::unique_ptr<Link> dial(HopInbox& in, const Message& first) {
  auto [mine, theirs] = make_connection_pair();
  EXPECT_TRUE(mine->send(first).ok());  // before add(): the inbox may close a connection at once
  in.add(std::move(theirs));
  LinkOptions lo;
  lo.name = "the inbox";
  lo.ping_interval = 50ms;
  return std::make_unique<Link>(std::move(mine), lo);
}

std::unique_ptr<Link> dial(HopInbox& in, uint64_t epoch, uint16_t from_stage) {
  return dial(in, encode(HopOpen{epoch, from_stage}));
}

/// The ERROR a refused sender is told (then its link goes down), within 2 s; "" if none.
std::string told(Link& l) {
  auto m = l.recv(2s);
  if (!m.ok() || m->type != MsgType::kError) return "";
  auto e = decode<ErrorMsg>(*m);
  return e.ok() ? e->message : "";
}

bool held_becomes(const HopInbox& in, size_t n) {
  for (int i = 0; i < 200 && in.held() != n; ++i) std::this_thread::sleep_for(10ms);
  return in.held() == n;
}

TEST(HopInbox, TakesTheHopOfItsPlanAndRefusesASecondOne) {
  HopInbox in(quick_hops());
  auto first = dial(in, 1, 0);
  auto got = in.take(1, 0, 2s);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  auto second = dial(in, 1, 0);  // no take() is waiting: the sweeper refuses it
  EXPECT_NE(told(*second).find("plan 1 already has its hop"), std::string::npos);
  expect_status(second->recv(2s).status(), Code::kUnavailable, "said bye");
  EXPECT_TRUE(held_becomes(in, 0));
  EXPECT_TRUE(first->is_up());
  EXPECT_TRUE((*got)->is_up());
}

TEST(HopInbox, HopsOfPlansThatAreOverAreToldSo) {
  HopInbox in(quick_hops());
  auto now = dial(in, 2, 0);
  ASSERT_TRUE(in.take(2, 0, 2s).ok());
  auto old = dial(in, 1, 0);
  EXPECT_NE(told(*old).find("plan 1 is over: this stage serves plan 2"), std::string::npos);
  EXPECT_TRUE(held_becomes(in, 0));
}

TEST(HopInbox, AHopOfANewerPlanWaitsForItsStage) {
  HopInbox in(quick_hops());
  auto early = dial(in, 5, 1);
  std::this_thread::sleep_for(600ms);  // twice connect_timeout: it sent its HOP_OPEN, so it is not silent
  EXPECT_EQ(in.held(), 1u);
  EXPECT_TRUE(early->is_up());
  auto got = in.take(5, 1, 2s);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE((*got)->is_up());
}

TEST(HopInbox, AHopFromAnotherStageOfThePlanIsRefused) {
  HopInbox in(quick_hops());
  auto wrong = dial(in, 3, 2);
  expect_error(in.take(3, 1, 300ms), Code::kDeadlineExceeded, "no hop from stage 1 of plan 3");
  EXPECT_NE(told(*wrong).find("plan 3 expects its hop from stage 1, not 2"), std::string::npos);
  EXPECT_TRUE(held_becomes(in, 0));
}

TEST(HopInbox, SilentAndMalformedHopsAreClosed) {
  HopInbox in(quick_hops());
  auto [mine, theirs] = make_connection_pair();  // authenticated, then never a HOP_OPEN
  in.add(std::move(theirs));
  LinkOptions lo;
  lo.ping_interval = 50ms;
  Link silent(std::move(mine), lo);
  auto rewind = dial(in, encode(Rewind{1, 0}));  // a first message that is not a HOP_OPEN
  EXPECT_NE(told(*rewind).find("expected a hop_open message, got rewind"), std::string::npos);
  expect_status(silent.recv(2s).status(), Code::kUnavailable, "no HOP_OPEN within 300 ms");
  EXPECT_TRUE(held_becomes(in, 0));
}

TEST(HopInbox, HoldsAtMostItsLimit) {
  HopInbox in(quick_hops());
  std::vector<std::unique_ptr<Link>> waiting;
  for (size_t i = 0; i < kMaxHeldHops; ++i) waiting.push_back(dial(in, 10 + i, 0));
  EXPECT_EQ(in.held(), kMaxHeldHops);
  auto extra = dial(in, 99, 0);
  EXPECT_NE(told(*extra).find("already holds 16 hops"), std::string::npos);
  EXPECT_EQ(in.held(), kMaxHeldHops);
  ASSERT_TRUE(in.take(10, 0, 2s).ok());  // the oldest plan's hop; the ones before it are not over
  EXPECT_TRUE(held_becomes(in, kMaxHeldHops - 1));
}

}  // namespace
}  // namespace shoal::pool
