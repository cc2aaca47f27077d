// Joining a room: the HMAC challenge-response (pool/auth.h) and the Room that runs it for every
// incoming connection. Expected MACs come from Python's hmac module; misbehaving peers are forged
// by hand over in-process pipes.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "pool/address.h"
#include "pool/auth.h"
#include "pool/crc32c.h"
#include "pool/room.h"
#include "pool/transport_inproc.h"
#include "pool/transport_tcp.h"
#include "test_util.h"

namespace shoal::pool {
namespace {

using test::expect_status;

using namespace std::chrono_literals;

constexpr std::string_view kSecret = "room secret";

std::string hex(const Mac& m) {
  std::string s;
  for (uint8_t b : m) s += fmt::format("{:02x}", b);
  return s;
}

TEST(Auth, MacMatchesHmacSha256) {
  Nonce s, c;
  for (size_t i = 0; i < 32; ++i) s[i] = uint8_t(i), c[i] = uint8_t(100 + i);
  // hmac.new(b"room secret", label + s + c + b"\x01\x00" + role, hashlib.sha256)
  EXPECT_EQ(hex(auth_mac(kSecret, kClientLabel, s, c, 1, PeerRole::kWorker)),
            "b239093b7bc13dd4cb8504e971beda914aa99db17b2e546a42425ac8655f0997");
  EXPECT_EQ(hex(auth_mac(kSecret, kServerLabel, s, c, 1, PeerRole::kWorker)),
            "5c5c554a5e8998af4405b36ea130f4f11150facc45d014ee927faa46b0bcb71b");
  EXPECT_EQ(hex(auth_mac(kSecret, kClientLabel, s, c, 1, PeerRole::kHop)),
            "e37529661f469a284ecd88b550e55db494a6e402023a515b71bbc0aa83c55c2e");
}

TEST(Auth, NoncesAreFresh) { EXPECT_NE(random_nonce(), random_nonce()); }

TEST(Auth, RightSecretJoins) {
  auto [server, client] = make_connection_pair();
  auto role = std::async(std::launch::async, [&, &s = server] { return auth_server(*s, kSecret); });
  EXPECT_TRUE(auth_client(*client, kSecret, PeerRole::kGuest).ok());
  auto r = role.get();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, PeerRole::kGuest);
  // The connection stays usable after the handshake.
  ASSERT_TRUE(client->send(encode(Bye{"x"})).ok());
  EXPECT_EQ(server->recv(1s)->type, MsgType::kBye);
}

TEST(Auth, WrongSecretRefusedOnBothSides) {
  auto [server, client] = make_connection_pair();
  auto role = std::async(std::launch::async, [&, &s = server] { return auth_server(*s, kSecret); });
  Status c = auth_client(*client, "not the secret", PeerRole::kWorker);
  expect_status(c, Code::kPermissionDenied, "says: wrong room secret");
  expect_status(role.get().status(), Code::kPermissionDenied, "(worker) answered the challenge with a wrong room secret");
  EXPECT_TRUE(server->is_closed());
}

TEST(Auth, ServerWithoutTheSecretIsRefusedByTheClient) {
  auto [server, client] = make_connection_pair();
  auto fake = std::async(std::launch::async, [&, &s = server] {
    EXPECT_TRUE(s->send(encode(Challenge{random_nonce()})).ok());
    auto m = s->recv(2s);  // the client's AUTH
    EXPECT_TRUE(m.ok());
    EXPECT_TRUE(s->send(encode(AuthOk{Mac{}})).ok());  // a proof it cannot compute
    return s->recv(2s);                                  // the client's ERROR
  });
  expect_status(auth_client(*client, kSecret, PeerRole::kWorker), Code::kPermissionDenied,
                "does not know the room secret (its proof did not verify)");
  auto told = fake.get();
  ASSERT_TRUE(told.ok());
  expect_status(decode<ErrorMsg>(*told)->to_status("client"), Code::kPermissionDenied, "room secrets differ");
}

TEST(Auth, ReflectedClientProofIsNotAServerProof) {
  auto [server, client] = make_connection_pair();
  auto fake = std::async(std::launch::async, [&, &s = server] {
    (void)s->send(encode(Challenge{random_nonce()}));
    auto auth = decode<Auth>(*s->recv(2s));
    (void)s->send(encode(AuthOk{auth->mac}));  // echo the client's own MAC
  });
  expect_status(auth_client(*client, kSecret, PeerRole::kWorker), Code::kPermissionDenied, "does not know the room secret");
  fake.get();
}

TEST(Auth, ReplayedAnswerRefused) {
  // Record a good client's AUTH with a sniffing server...
  Message recorded;
  {
    auto [server, client] = make_connection_pair();
    auto sniff = std::async(std::launch::async, [&, &s = server] {
      (void)s->send(encode(Challenge{random_nonce()}));
      recorded = *s->recv(2s);
      s->close();
    });
    (void)auth_client(*client, kSecret, PeerRole::kWorker, 2s);
    sniff.get();
  }
  ASSERT_EQ(recorded.type, MsgType::kAuth);
  // ...and replay it to a real server, which sent a fresh challenge.
  auto [server, client] = make_connection_pair();
  auto role = std::async(std::launch::async, [&, &s = server] { return auth_server(*s, kSecret); });
  ASSERT_EQ(client->recv(2s)->type, MsgType::kChallenge);
  ASSERT_TRUE(client->send(recorded).ok());
  expect_status(role.get().status(), Code::kPermissionDenied, "wrong room secret");
  auto told = client->recv(2s);
  ASSERT_TRUE(told.ok());
  EXPECT_EQ(told->type, MsgType::kError);
}

TEST(Auth, ClientOfAnotherProtocolVersion) {
  auto [server, raw] = make_pipe_pair("server", "client");
  Connection conn(std::move(server));
  auto role = std::async(std::launch::async, [&] { return auth_server(conn, kSecret); });
  const std::vector<uint8_t> auth_v3 = encode_record(encode(Auth{}), /*version=*/3);
  const std::span<const uint8_t> parts[1] = {auth_v3};
  ASSERT_TRUE(raw->write_all(parts, Clock::now() + 1s).ok());
  expect_status(role.get().status(), Code::kUnsupported, "peer speaks protocol version 3, this build speaks 2");
}

TEST(Auth, ServerOfAnotherProtocolVersion) {
  auto [client, raw] = make_pipe_pair("client", "server");
  Connection conn(std::move(client));
  const std::vector<uint8_t> challenge_v4 = encode_record(encode(Challenge{}), /*version=*/4);
  const std::span<const uint8_t> parts[1] = {challenge_v4};
  ASSERT_TRUE(raw->write_all(parts, Clock::now() + 1s).ok());
  expect_status(auth_client(conn, kSecret, PeerRole::kWorker), Code::kUnsupported,
                "peer speaks protocol version 4, this build speaks 2");
}

TEST(Auth, GarbageInsteadOfAnAnswer) {
  auto [server, raw] = make_pipe_pair("server", "client");
  Connection conn(std::move(server));
  auto role = std::async(std::launch::async, [&] { return auth_server(conn, kSecret); });
  const std::string junk = "SSH-2.0-OpenSSH_9.2\r\n";
  const std::span<const uint8_t> parts[1] = {std::span(reinterpret_cast<const uint8_t*>(junk.data()), junk.size())};
  ASSERT_TRUE(raw->write_all(parts, Clock::now() + 1s).ok());
  expect_status(role.get().status(), Code::kCorrupt, "not a shoal peer");
}

TEST(Auth, UnexpectedMessageDuringHandshake) {
  auto [server, client] = make_connection_pair();
  auto role = std::async(std::launch::async, [&, &s = server] { return auth_server(*s, kSecret); });
  ASSERT_EQ(client->recv(2s)->type, MsgType::kChallenge);
  ASSERT_TRUE(client->send(encode(Hello{})).ok());
  expect_status(role.get().status(), Code::kCorrupt, "sent hello during the handshake, expected auth");
}

TEST(Auth, SilentClientTimesOut) {
  auto [server, client] = make_connection_pair();
  const auto t0 = Clock::now();
  expect_status(auth_server(*server, kSecret, 100ms).status(), Code::kDeadlineExceeded,
                "did not answer the challenge within 100 ms");
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST(Auth, EmptySecretRefused) {
  auto [server, client] = make_connection_pair();
  expect_status(auth_server(*server, "").status(), Code::kInvalidArgument, "the room secret is empty");
  expect_status(auth_client(*client, "", PeerRole::kWorker), Code::kInvalidArgument, "the room secret is empty");
}

// ---- the room -----------------------------------------------------------------------------------

struct Refusals {
  std::mutex mu;
  std::vector<std::string> reasons;
  void add(const Status& st) {
    std::lock_guard lock(mu);
    reasons.push_back(st.to_string());
  }
  bool wait_for(size_t n, std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      {
        std::lock_guard lock(mu);
        if (reasons.size() >= n) return true;
      }
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
};

std::unique_ptr<Room> open_room(InProcessNetwork& net, Refusals& refusals, Millis handshake = 2000ms) {
  auto listener = net.listen(":7000");
  EXPECT_TRUE(listener.ok());
  RoomOptions o;
  o.secret = std::string(kSecret);
  o.handshake_timeout = handshake;
  o.on_refused = [&](const std::string&, const Status& st) { refusals.add(st); };
  auto room = Room::open(std::move(*listener), o);
  EXPECT_TRUE(room.ok());
  return std::move(*room);
}

TEST(Room, AuthenticatedPeersArriveRefusedOnesDoNot) {
  InProcessNetwork net;
  Refusals refusals;
  auto room = open_room(net, refusals);
  EXPECT_EQ(room->address(), "127.0.0.1:7000");

  auto bad = net.connect("127.0.0.1:7000", 1s);
  ASSERT_TRUE(bad.ok());
  expect_status(auth_client(**bad, "guess", PeerRole::kWorker), Code::kPermissionDenied, "wrong room secret");

  auto good = net.connect(":7000", 1s);
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE(auth_client(**good, kSecret, PeerRole::kWorker).ok());
  auto arrival = room->next(2s);
  ASSERT_TRUE(arrival.ok()) << arrival.status().to_string();
  EXPECT_EQ(arrival->role, PeerRole::kWorker);
  // The arrival is the server end of `good`.
  ASSERT_TRUE((*good)->send(encode(Bye{"hi"})).ok());
  EXPECT_EQ(arrival->conn->recv(1s)->type, MsgType::kBye);

  ASSERT_TRUE(refusals.wait_for(1, 2s));
  EXPECT_EQ(room->refused(), 1u);
  expect_status(room->next(50ms).status(), Code::kDeadlineExceeded, "nobody joined 127.0.0.1:7000");
}

TEST(Room, SilentClientDoesNotHoldUpOthers) {
  InProcessNetwork net;
  Refusals refusals;
  auto room = open_room(net, refusals, /*handshake=*/1500ms);
  auto silent = net.connect(":7000", 1s);  // connects and never answers
  ASSERT_TRUE(silent.ok());
  const auto t0 = Clock::now();
  auto good = net.connect(":7000", 1s);
  ASSERT_TRUE(auth_client(**good, kSecret, PeerRole::kGuest).ok());
  auto arrival = room->next(2s);
  ASSERT_TRUE(arrival.ok());
  EXPECT_LT(Clock::now() - t0, 1200ms);  // before the silent one's handshake timed out
  ASSERT_TRUE(refusals.wait_for(1, 2s));
  EXPECT_NE(refusals.reasons[0].find("did not answer the challenge"), std::string::npos);
}

TEST(Room, TooManyPendingHandshakes) {
  InProcessNetwork net;
  Refusals refusals;
  auto listener = net.listen(":7001");
  RoomOptions o;
  o.secret = "s";
  o.max_pending = 1;
  o.on_refused = [&](const std::string&, const Status& st) { refusals.add(st); };
  auto room = Room::open(std::move(*listener), o);
  ASSERT_TRUE(room.ok());
  auto first = net.connect(":7001", 1s);   // stays silent: holds the only slot
  std::this_thread::sleep_for(50ms);
  auto second = net.connect(":7001", 1s);  // refused at once
  ASSERT_TRUE(refusals.wait_for(1, 2s));
  EXPECT_NE(refusals.reasons[0].find("1 handshakes already in progress"), std::string::npos);
  EXPECT_EQ((*second)->recv(1s).status().code(), Code::kUnavailable);
}

TEST(Room, EmptySecretRefused) {
  InProcessNetwork net;
  auto room = Room::open(net.listen(":7002").value(), RoomOptions{});
  expect_status(room.status(), Code::kInvalidArgument, "the room secret is empty");
}

// ---- garbage on a real TCP port -----------------------------------------------------------------

// A plain POSIX client that sends bytes and reads until the server closes (or 5 s pass).
struct RawClient {
  int fd = -1;
  explicit RawClient(uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  }
  ~RawClient() { ::close(fd); }
  void send(const std::vector<uint8_t>& b) { EXPECT_EQ(::send(fd, b.data(), b.size(), MSG_NOSIGNAL), ssize_t(b.size())); }
  // Everything the server sent until it closed; `closed` false when it did not close in time.
  std::vector<uint8_t> read_to_end(bool& closed) {
    std::vector<uint8_t> out;
    const auto end = Clock::now() + 5s;
    closed = false;
    while (Clock::now() < end) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      uint8_t buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        closed = true;
        break;
      }
      out.insert(out.end(), buf, buf + n);
    }
    return out;
  }
};

// The messages in what the server sent (a challenge, then its error notice).
std::vector<Message> messages_in(const std::vector<uint8_t>& bytes) {
  RecordDecoder d;
  d.feed(bytes);
  std::vector<Message> out;
  for (auto m = d.next(); m.ok() && m->has_value(); m = d.next()) out.push_back(std::move(**m));
  return out;
}

TEST(TcpRoom, GarbageIsRefusedAndTheRoomKeepsAccepting) {
  auto listener = tcp_network().listen(":0");
  ASSERT_TRUE(listener.ok());
  Refusals refusals;
  RoomOptions o;
  o.secret = std::string(kSecret);
  o.on_refused = [&](const std::string&, const Status& st) { refusals.add(st); };
  auto room = Room::open(std::move(*listener), o);
  ASSERT_TRUE(room.ok());
  const uint16_t port = parse_address((*room)->address())->port;

  std::mt19937 rng(1);
  std::vector<uint8_t> random_bytes(300);
  for (auto& b : random_bytes) b = uint8_t(rng());
  random_bytes[0] = 'x';  // not by chance an 'S'
  const std::string http = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
  struct Case {
    const char* what;
    std::vector<uint8_t> bytes;
    Code code;
    const char* reason;
  };
  const Case cases[] = {
      {"random bytes", random_bytes, Code::kCorrupt, "bad magic"},
      {"an HTTP request", std::vector<uint8_t>(http.begin(), http.end()), Code::kCorrupt, "(\"GET \")"},
      {"a record of version 3", encode_record(encode(Auth{}), 3), Code::kUnsupported,
       "peer speaks protocol version 3, this build speaks 2"},
      {"an oversized record", [] {
         auto b = encode_record(Message{MsgType::kFrame, std::vector<uint8_t>(64)});
         b[12] = b[13] = b[14] = b[15] = 0xFF;  // 4 GiB payload
         b.resize(kRecordHeaderSize);
         return b;
       }(),
       Code::kOutOfRange, "over the limit"},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(cases[i].what);
    RawClient c(port);
    c.send(cases[i].bytes);
    bool closed = false;
    const auto got = messages_in(c.read_to_end(closed));
    EXPECT_TRUE(closed) << "the room kept the connection open";
    ASSERT_EQ(got.size(), 2u);  // the challenge, then why we were dropped
    EXPECT_EQ(got[0].type, MsgType::kChallenge);
    auto err = decode<ErrorMsg>(got[1]);
    ASSERT_TRUE(err.ok()) << err.status().to_string();
    EXPECT_EQ(err->code, cases[i].code);
    EXPECT_NE(err->message.find(cases[i].reason), std::string::npos) << err->message;
    ASSERT_TRUE(refusals.wait_for(i + 1, 2s));
    std::lock_guard lock(refusals.mu);
    EXPECT_NE(refusals.reasons[i].find(cases[i].reason), std::string::npos) << refusals.reasons[i];
  }
  // Still accepting: a real worker joins.
  auto conn = tcp_network().connect((*room)->address(), 2s);
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(auth_client(**conn, kSecret, PeerRole::kWorker).ok());
  auto arrival = (*room)->next(2s);
  ASSERT_TRUE(arrival.ok());
  EXPECT_EQ(arrival->role, PeerRole::kWorker);
  EXPECT_EQ((*room)->refused(), std::size(cases));
}

}  // namespace
}  // namespace shoal::pool
