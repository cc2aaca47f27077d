// Transports (in-process pipes and TCP), the Connection rules they share, and Link heartbeats.
// Expected behaviour is the contract in pool/transport.h and pool/link.h: deadlines hold, closing
// wakes blocked calls, malformed input closes only that connection, silence is detected in time.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <random>
#include <thread>

#include "pool/link.h"
#include "pool/messages.h"
#include "pool/transport_inproc.h"
#include "pool/transport_tcp.h"
#include "test_util.h"

namespace shoal::pool {
namespace {

using test::expect_status;

using namespace std::chrono_literals;
using Bytes = std::vector<uint8_t>;

Status write_raw(ByteStream& s, const Bytes& b) {
  const std::span<const uint8_t> parts[1] = {b};
  return s.write_all(parts, Clock::now() + 1s);
}

Message big_message(size_t n) {
  Message m{MsgType::kFrame, Bytes(n)};
  for (size_t i = 0; i < n; ++i) m.payload[i] = uint8_t(i * 7);
  return m;
}

// ---- in-process connections ---------------------------------------------------------------------

TEST(InProcess, SendAndReceiveBothWays) {
  auto [a, b] = make_connection_pair();
  ASSERT_TRUE(a->send(encode(Ping{1, 2})).ok());
  ASSERT_TRUE(b->send(encode(Bye{"b"})).ok());
  auto at_b = b->recv(1s);
  auto at_a = a->recv(1s);
  ASSERT_TRUE(at_b.ok() && at_a.ok());
  EXPECT_EQ(decode<Ping>(*at_b)->time_us, 2u);
  EXPECT_EQ(decode<Bye>(*at_a)->reason, "b");
}

TEST(InProcess, TimeoutKeepsAPartialRecord) {
  auto [raw, peer] = make_pipe_pair("a", "b");
  Connection conn(std::move(peer));
  const Bytes rec = encode_record(encode(Ping{9, 9}));
  ASSERT_TRUE(write_raw(*raw, Bytes(rec.begin(), rec.begin() + 10)).ok());
  expect_status(conn.recv(30ms).status(), Code::kDeadlineExceeded, "no message from a within 30 ms");
  ASSERT_TRUE(write_raw(*raw, Bytes(rec.begin() + 10, rec.end())).ok());
  auto m = conn.recv(1s);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(decode<Ping>(*m)->nonce, 9u);
}

TEST(InProcess, PeerCloseIsUnavailable) {
  auto [a, b] = make_connection_pair();
  ASSERT_TRUE(a->send(encode(Ping{})).ok());
  a->close();
  EXPECT_TRUE(b->recv(1s).ok());  // what was sent before the close still arrives
  expect_status(b->recv(1s).status(), Code::kUnavailable, "closed the connection");
  expect_status(a->send(encode(Ping{})), Code::kUnavailable, "is closed");
}

TEST(InProcess, PeerLeavingInsideARecord) {
  auto [raw, peer] = make_pipe_pair("a", "b");
  Connection conn(std::move(peer));
  const Bytes rec = encode_record(encode(Ping{}));
  ASSERT_TRUE(write_raw(*raw, Bytes(rec.begin(), rec.begin() + 20)).ok());
  raw->close();
  expect_status(conn.recv(1s).status(), Code::kUnavailable, "inside a record, 20 bytes of it received");
}

TEST(InProcess, CloseWakesABlockedRecv) {
  auto [a, b] = make_connection_pair();
  const auto t0 = Clock::now();
  auto waiting = std::async(std::launch::async, [&, &conn = a] { return conn->recv(10s); });
  std::this_thread::sleep_for(30ms);
  a->close();
  EXPECT_EQ(waiting.get().status().code(), Code::kUnavailable);
  EXPECT_LT(Clock::now() - t0, 2s);
}

TEST(InProcess, GarbageClosesTheConnectionAndTellsThePeer) {
  auto [raw, peer] = make_pipe_pair("attacker", "us");
  Connection conn(std::move(peer));
  ASSERT_TRUE(write_raw(*raw, Bytes{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'}).ok());
  expect_status(conn.recv(1s).status(), Code::kCorrupt, "from attacker: bad magic");
  EXPECT_TRUE(conn.is_closed());
  expect_status(conn.recv(1s).status(), Code::kUnavailable, "was closed: from attacker: bad magic");
  // The peer got an ERROR record saying why, then the end of the stream.
  RecordDecoder d;
  Bytes buf(4096);
  for (;;) {
    auto n = raw->read_some(buf, Clock::now() + 1s);
    if (!n.ok()) break;
    d.feed(std::span(buf.data(), *n));
  }
  auto m = d.next();
  ASSERT_TRUE(m.ok() && m->has_value());
  auto err = decode<ErrorMsg>(**m);
  ASSERT_TRUE(err.ok());
  EXPECT_EQ(err->code, Code::kCorrupt);
  EXPECT_NE(err->message.find("bad magic"), std::string::npos);
}

TEST(InProcess, OversizedRecordRefusedFromItsHeader) {
  auto [raw, peer] = make_pipe_pair("a", "b");
  ConnectionOptions o;
  o.max_payload = 1024;
  Connection conn(std::move(peer), o);
  Bytes header = encode_record(big_message(4096));
  header.resize(kRecordHeaderSize);
  ASSERT_TRUE(write_raw(*raw, header).ok());
  expect_status(conn.recv(1s).status(), Code::kOutOfRange, "frame record payload of 4096 bytes is over the limit of 1024");
  expect_status(conn.send(encode(Ping{})), Code::kUnavailable, "is closed");
}

TEST(InProcess, SendOverTheLimitRefused) {
  ConnectionOptions o;
  o.max_payload = 1024;
  auto [a, b] = make_connection_pair(o);
  expect_status(a->send(big_message(1025)), Code::kInvalidArgument, "frame message of 1025 bytes");
  EXPECT_FALSE(a->is_closed());
}

TEST(InProcess, StalledPeerTimesTheSendOut) {
  auto [mine, theirs] = make_pipe_pair("a", "b", /*capacity=*/1024);
  ConnectionOptions o;
  o.send_timeout = 100ms;
  Connection conn(std::move(mine), o);
  const auto t0 = Clock::now();
  expect_status(conn.send(big_message(8192)), Code::kUnavailable, "took no bytes for 100 ms");
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_TRUE(conn.is_closed());
}

TEST(InProcess, NetworkListenConnectAccept) {
  InProcessNetwork net;
  auto l = net.listen(":0");
  ASSERT_TRUE(l.ok());
  const std::string addr = (*l)->address();
  EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u);
  expect_status(net.listen(addr).status(), Code::kUnavailable, "already in use");
  auto c = net.connect(addr, 1s);
  ASSERT_TRUE(c.ok());
  auto s = (*l)->accept(1s);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*c)->send(encode(Ping{3, 4})).ok());
  EXPECT_EQ((*s)->recv(1s)->type, MsgType::kPing);
  expect_status((*l)->accept(20ms).status(), Code::kDeadlineExceeded, "no connection");
  expect_status(net.connect("127.0.0.1:1", 1s).status(), Code::kUnavailable, "nothing listens on 127.0.0.1:1");
  (*l)->close();
  expect_status((*l)->accept(1s).status(), Code::kUnavailable, "closed");
  expect_status(net.connect(addr, 1s).status(), Code::kUnavailable, "nothing listens");
}

// ---- TCP ----------------------------------------------------------------------------------------

struct TcpPair {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> client;
  std::unique_ptr<Connection> server;
};

TcpPair tcp_pair(ConnectionOptions o = {}) {
  TcpPair p;
  auto l = tcp_network().listen(":0", o);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  p.listener = std::move(*l);
  auto c = tcp_network().connect(p.listener->address(), 2s, o);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  p.client = std::move(*c);
  auto s = p.listener->accept(2s);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  p.server = std::move(*s);
  return p;
}

TEST(Tcp, ListensOnLoopbackUnlessTold) {
  auto l = tcp_network().listen(":0");
  ASSERT_TRUE(l.ok());
  const std::string addr = (*l)->address();
  EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr;
  EXPECT_NE(addr, "127.0.0.1:0");
  auto any = tcp_network().listen("0.0.0.0:0");
  ASSERT_TRUE(any.ok());
  EXPECT_EQ((*any)->address().rfind("0.0.0.0:", 0), 0u);
}

TEST(Tcp, BothEndsKnowBothAddresses) {
  TcpPair p = tcp_pair();
  EXPECT_EQ(p.client->peer(), p.listener->address());
  EXPECT_EQ(p.server->peer(), p.client->local());
  EXPECT_EQ(p.server->local(), p.listener->address());
  EXPECT_EQ(p.client->local().rfind("127.0.0.1:", 0), 0u);
}

TEST(Tcp, LargeMessagesBothWaysAtOnce) {
  TcpPair p = tcp_pair();
  const Message big = big_message(4 << 20);
  // Both ends send and receive at the same time (neither send could finish if nobody read).
  auto server_recv = std::async(std::launch::async, [&] { return p.server->recv(20s); });
  auto client_recv = std::async(std::launch::async, [&] { return p.client->recv(20s); });
  auto sending = std::async(std::launch::async, [&] { return p.client->send(big); });
  ASSERT_TRUE(p.server->send(big).ok());
  ASSERT_TRUE(sending.get().ok());
  auto at_server = server_recv.get();
  auto at_client = client_recv.get();
  ASSERT_TRUE(at_server.ok()) << at_server.status().to_string();
  ASSERT_TRUE(at_client.ok()) << at_client.status().to_string();
  EXPECT_EQ(at_server->payload, big.payload);
  EXPECT_EQ(at_client->payload, big.payload);
}

TEST(Tcp, ConnectToNothingFailsPromptly) {
  std::string addr;
  {
    auto l = tcp_network().listen(":0");
    addr = (*l)->address();
  }
  const auto t0 = Clock::now();
  expect_status(tcp_network().connect(addr, 2s).status(), Code::kUnavailable, "connecting to");
  EXPECT_LT(Clock::now() - t0, 1s);
  expect_status(tcp_network().connect("nowhere", 1s).status(), Code::kInvalidArgument, "address 'nowhere'");
}

TEST(Tcp, PeerThatVanishesIsUnavailableAtOnce) {
  TcpPair p = tcp_pair();
  const auto t0 = Clock::now();
  p.server.reset();
  expect_status(p.client->recv(5s).status(), Code::kUnavailable, "closed the connection");
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST(Tcp, CloseWakesRecvAndAccept) {
  TcpPair p = tcp_pair();
  const auto t0 = Clock::now();
  auto recv = std::async(std::launch::async, [&] { return p.client->recv(10s); });
  auto accept = std::async(std::launch::async, [&] { return p.listener->accept(10s); });
  std::this_thread::sleep_for(50ms);
  p.client->close();
  p.listener->close();
  EXPECT_EQ(recv.get().status().code(), Code::kUnavailable);
  EXPECT_EQ(accept.get().status().code(), Code::kUnavailable);
  EXPECT_LT(Clock::now() - t0, 2s);
}

TEST(Tcp, AcceptTimesOut) {
  auto l = tcp_network().listen(":0");
  const auto t0 = Clock::now();
  expect_status((*l)->accept(50ms).status(), Code::kDeadlineExceeded, "no connection");
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST(Tcp, Ipv6Loopback) {
  auto l = tcp_network().listen("[::1]:0");
  if (!l.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << l.status().to_string();
  EXPECT_EQ((*l)->address().rfind("[::1]:", 0), 0u);
  auto c = tcp_network().connect((*l)->address(), 2s);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto s = (*l)->accept(2s);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*c)->send(encode(Ping{1, 1})).ok());
  EXPECT_EQ((*s)->recv(2s)->type, MsgType::kPing);
}

TEST(Tcp, StalledPeerTimesTheSendOut) {
  ConnectionOptions o;
  o.send_timeout = 200ms;
  TcpPair p = tcp_pair(o);  // the server never reads
  const Message big = big_message(8 << 20);
  Status st;
  for (int i = 0; i < 64 && st.ok(); ++i) st = p.client->send(big);  // kernel buffers fill up
  expect_status(st, Code::kUnavailable, "took no bytes for 200 ms");
}

// ---- links --------------------------------------------------------------------------------------

LinkOptions fast_link(std::string name, Millis ping = 20ms, Millis dead = 300ms) {
  LinkOptions o;
  o.name = std::move(name);
  o.ping_interval = ping;
  o.dead_after = dead;
  return o;
}

TEST(Link, UserMessagesPassHeartbeatsDoNot) {
  auto [a, b] = make_connection_pair();
  Link la(std::move(a), fast_link("b"));
  Link lb(std::move(b), fast_link("a"));
  std::this_thread::sleep_for(100ms);  // several pings each way
  ASSERT_TRUE(la.send(encode(Rewind{1, 5})).ok());
  ASSERT_TRUE(lb.send(encode(Rewind{2, 6})).ok());
  auto at_b = lb.recv(1s);
  auto at_a = la.recv(1s);
  ASSERT_TRUE(at_b.ok() && at_a.ok());
  EXPECT_EQ(decode<Rewind>(*at_b)->seq, 1u);
  EXPECT_EQ(decode<Rewind>(*at_a)->seq, 2u);
  expect_status(la.recv(50ms).status(), Code::kDeadlineExceeded, "no message from b");
  EXPECT_GT(la.rtt().count(), 0);
  EXPECT_GT(lb.rtt().count(), 0);
}

TEST(Link, IdleLinksStayUp) {
  auto [a, b] = make_connection_pair();
  Link la(std::move(a), fast_link("b", 30ms, 150ms));
  Link lb(std::move(b), fast_link("a", 30ms, 150ms));
  std::this_thread::sleep_for(600ms);  // four times the dead-peer limit
  EXPECT_TRUE(la.is_up()) << la.status().to_string();
  EXPECT_TRUE(lb.is_up()) << lb.status().to_string();
}

TEST(Link, SilentPeerIsDetectedInTime) {
  auto [a, b] = make_connection_pair();  // b never reads and never answers
  std::promise<Status> down;
  LinkOptions o = fast_link("worker 'w1' (layers 4-7)", 50ms, 300ms);
  o.on_down = [&](const Status& st) { down.set_value(st); };
  const auto t0 = Clock::now();
  Link la(std::move(a), o);
  auto f = down.get_future();
  ASSERT_EQ(f.wait_for(2s), std::future_status::ready);
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 1000ms);
  expect_status(f.get(), Code::kUnavailable, "worker 'w1' (layers 4-7) is not answering (silent for 0.3 s, limit 0.3 s)");
  expect_status(la.recv(1s).status(), Code::kUnavailable, "is not answering");
  expect_status(la.send(encode(Ping{})), Code::kUnavailable, "is not answering");
}

TEST(Link, ASilentPeerIsToldWhyItIsDroppedWhereAsked) {
  for (bool tell : {false, true}) {
    auto [a, b] = make_connection_pair();  // b reads nothing until a has given up on it
    LinkOptions o = fast_link("worker 'w1'", 50ms, 300ms);
    o.bye_to_silent_peer = tell;
    Link la(std::move(a), o);
    expect_status(la.recv(2s).status(), Code::kUnavailable, "is not answering");
    std::string bye;  // what b finds once it wakes: pings, then (where asked) the bye
    for (auto m = b->recv(200ms); m.ok(); m = b->recv(200ms)) {
      if (m->type == MsgType::kBye) bye = decode<Bye>(*m)->reason;
    }
    if (tell) {
      EXPECT_NE(bye.find("nothing heard from this peer for "), std::string::npos) << bye;
      EXPECT_NE(bye.find(" s (limit 0.3 s): it is dropped"), std::string::npos) << bye;
    } else {
      EXPECT_EQ(bye, "");
    }
  }
}

TEST(Link, PeerThatClosesIsDetectedAtOnce) {
  auto [a, b] = make_connection_pair();
  Link la(std::move(a), fast_link("w2", 1000ms, 5000ms));
  const auto t0 = Clock::now();
  b->close();
  const Status st = la.recv(5s).status();
  expect_status(st, Code::kUnavailable, "in-process b closed the connection");
  EXPECT_EQ(st.message().rfind("w2: ", 0), 0u) << st.to_string();
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST(Link, QueuedMessagesComeBeforeTheReason) {
  auto [a, b] = make_connection_pair();
  ASSERT_TRUE(b->send(encode(Rewind{1, 1})).ok());
  ASSERT_TRUE(b->send(encode(Rewind{2, 2})).ok());
  ASSERT_TRUE(b->send(encode(Bye{"shutting down"})).ok());
  Link la(std::move(a), fast_link("w3"));
  EXPECT_EQ(decode<Rewind>(*la.recv(1s))->seq, 1u);
  EXPECT_EQ(decode<Rewind>(*la.recv(1s))->seq, 2u);
  expect_status(la.recv(1s).status(), Code::kUnavailable, "w3 said bye: shutting down");
}

TEST(Link, CloseSaysBye) {
  auto [a, b] = make_connection_pair();
  Link la(std::move(a), fast_link("b"));
  Link lb(std::move(b), fast_link("host"));
  la.close("plan changed");
  expect_status(lb.recv(1s).status(), Code::kUnavailable, "host said bye: plan changed");
  expect_status(la.status(), Code::kUnavailable, "closed here: plan changed");
}

TEST(Link, MalformedBytesTakeTheLinkDown) {
  auto [raw, peer] = make_pipe_pair("a", "b");
  Link l(std::make_unique<Connection>(std::move(peer)), fast_link("w4"));
  ASSERT_TRUE(write_raw(*raw, Bytes{'G', 'E', 'T', ' '}).ok());
  expect_status(l.recv(1s).status(), Code::kCorrupt, "w4: from a: bad magic");
}

TEST(Link, DefaultLimitDetectsAStalledTcpPeerWithinTwoSeconds) {
  TcpPair p = tcp_pair();  // the server end never reads or answers
  LinkOptions o;
  o.name = "worker 'tcp'";
  std::promise<void> down;
  o.on_down = [&](const Status&) { down.set_value(); };
  const auto t0 = Clock::now();
  Link l(std::move(p.client), o);
  ASSERT_EQ(down.get_future().wait_for(5s), std::future_status::ready);
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, 1900ms);
  EXPECT_LT(took, 2400ms);
}

}  // namespace
}  // namespace shoal::pool
