// The pool's record layer and message codecs (docs/protocol.md). Expected bytes are written out by
// hand from the grammar; CRC values come from RFC 3720 B.4 and an independent bitwise CRC-32C.
// Every malformed case listed in docs/protocol.md has its own test here.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "pool/address.h"
#include "pool/crc32c.h"
#include "pool/messages.h"
#include "pool/wire.h"
#include "test_util.h"

namespace shoal::pool {
namespace {

using test::expect_error;
using test::expect_status;

using Bytes = std::vector<uint8_t>;

// A ping record (nonce 0x0102030405060708, time 0x1122334455667788) written out from the grammar;
// its CRC-32C 0xAEE2056C computed by a bitwise implementation outside Shoal (Python, polynomial
// 0x82F63B78 reflected; 0x4D30EEC1 for the same record of version 1).
const Bytes kPingRecord = {
    'S', 'H', 'O', 'L', 0x02, 0x00, 0x0A, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00,  // header
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // payload
    0x6C, 0x05, 0xE2, 0xAE};                                                                         // crc32c

// Decodes a whole buffer fed at once; returns the first message or the error.
Result<std::optional<Message>> decode_bytes(const Bytes& b, uint32_t max_payload = kDefaultMaxPayload) {
  RecordDecoder d(max_payload);
  d.feed(b);
  return d.next();
}

// A record with the given header fields and payload, and a correct CRC.
Bytes forge(uint16_t version, uint16_t type, uint32_t flags, const Bytes& payload, int64_t length = -1) {
  const uint32_t len = length < 0 ? uint32_t(payload.size()) : uint32_t(length);
  Bytes b = {'S', 'H', 'O', 'L', uint8_t(version), uint8_t(version >> 8), uint8_t(type), uint8_t(type >> 8),
             uint8_t(flags), uint8_t(flags >> 8), uint8_t(flags >> 16), uint8_t(flags >> 24),
             uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16), uint8_t(len >> 24)};
  b.insert(b.end(), payload.begin(), payload.end());
  const uint32_t crc = crc32c(b.data(), b.size());
  for (int i = 0; i < 4; ++i) b.push_back(uint8_t(crc >> (8 * i)));
  return b;
}

// ---- CRC-32C ------------------------------------------------------------------------------------

TEST(Crc32c, Rfc3720Vectors) {
  Bytes zeros(32, 0), ones(32, 0xFF), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) inc[i] = uint8_t(i), dec[i] = uint8_t(31 - i);
  for (auto fn : {&crc32c_extend, &crc32c_extend_portable}) {
    EXPECT_EQ(fn(0, "123456789", 9), 0xE3069283u);
    EXPECT_EQ(fn(0, zeros.data(), 32), 0x8A9136AAu);
    EXPECT_EQ(fn(0, ones.data(), 32), 0x62A8AB43u);
    EXPECT_EQ(fn(0, inc.data(), 32), 0x46DD794Eu);
    EXPECT_EQ(fn(0, dec.data(), 32), 0x113FDB5Cu);
    EXPECT_EQ(fn(0, nullptr, 0), 0u);
  }
}

TEST(Crc32c, ExtendMatchesOneShotAndPortable) {
  std::mt19937 rng(7);
  Bytes data(300);
  for (auto& b : data) b = uint8_t(rng());
  for (size_t n = 0; n <= data.size(); n += 13) {
    const uint32_t whole = crc32c(data.data(), n);
    EXPECT_EQ(whole, crc32c_extend_portable(0, data.data(), n));
    for (size_t cut = 0; cut <= n; cut += 5) {
      EXPECT_EQ(crc32c_extend(crc32c(data.data(), cut), data.data() + cut, n - cut), whole);
    }
  }
}

// ---- record layer -------------------------------------------------------------------------------

TEST(Record, PingMatchesTheGrammarByteForByte) {
  EXPECT_EQ(encode_record(encode(Ping{0x0102030405060708ull, 0x1122334455667788ull})), kPingRecord);
}

TEST(Record, DecodesHandWrittenPing) {
  auto r = decode_bytes(kPingRecord);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_TRUE(r->has_value());
  auto ping = decode<Ping>(**r);
  ASSERT_TRUE(ping.ok()) << ping.status().to_string();
  EXPECT_EQ(ping->nonce, 0x0102030405060708ull);
  EXPECT_EQ(ping->time_us, 0x1122334455667788ull);
}

TEST(Record, ByteByByteYieldsOnlyAtTheEnd) {
  RecordDecoder d;
  for (size_t i = 0; i + 1 < kPingRecord.size(); ++i) {
    d.feed(std::span(&kPingRecord[i], 1));
    auto r = d.next();
    ASSERT_TRUE(r.ok()) << "at byte " << i << ": " << r.status().to_string();
    EXPECT_FALSE(r->has_value()) << "at byte " << i;
  }
  d.feed(std::span(&kPingRecord.back(), 1));
  auto r = d.next();
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->type, MsgType::kPing);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(Record, SeveralRecordsInOneFeed) {
  Bytes b = kPingRecord;
  Bytes bye = encode_record(encode(Bye{"done"}));
  b.insert(b.end(), bye.begin(), bye.end());
  b.insert(b.end(), kPingRecord.begin(), kPingRecord.begin() + 5);  // start of a third
  RecordDecoder d;
  d.feed(b);
  auto m1 = d.next();
  auto m2 = d.next();
  auto m3 = d.next();
  ASSERT_TRUE(m1.ok() && m1->has_value() && m2.ok() && m2->has_value() && m3.ok());
  EXPECT_EQ((*m1)->type, MsgType::kPing);
  EXPECT_EQ(decode<Bye>(**m2)->reason, "done");
  EXPECT_FALSE(m3->has_value());
  EXPECT_EQ(d.buffered(), 5u);
}

TEST(Record, TypeTableSizesFollowTheGrammar) {
  auto sizes = [](MsgType t) {
    const MsgTypeInfo* i = msg_type_info(uint16_t(t));
    return std::pair(i->min_payload, i->max_payload);
  };
  EXPECT_EQ(sizes(MsgType::kChallenge), std::pair(32u, 32u));
  EXPECT_EQ(sizes(MsgType::kAuth), std::pair(65u, 65u));
  EXPECT_EQ(sizes(MsgType::kAuthOk), std::pair(32u, 32u));
  EXPECT_EQ(sizes(MsgType::kHello), std::pair(52u, 564u));
  EXPECT_EQ(sizes(MsgType::kAssign), std::pair(54u, 1378u));
  EXPECT_EQ(sizes(MsgType::kReady), std::pair(12u, 12u));
  EXPECT_EQ(sizes(MsgType::kHopOpen), std::pair(10u, 10u));
  EXPECT_EQ(sizes(MsgType::kFrame), std::pair(20u, 0u));
  EXPECT_EQ(sizes(MsgType::kRewind), std::pair(12u, 12u));
  EXPECT_EQ(sizes(MsgType::kPing), std::pair(16u, 16u));
  EXPECT_EQ(sizes(MsgType::kPong), std::pair(16u, 16u));
  EXPECT_EQ(sizes(MsgType::kError), std::pair(4u, 4100u));
  EXPECT_EQ(sizes(MsgType::kBye), std::pair(2u, 1026u));
  EXPECT_EQ(msg_type_info(0), nullptr);
  EXPECT_EQ(msg_type_info(14), nullptr);
}

// Malformed records: one test per case of docs/protocol.md "Errors".

TEST(RecordMalformed, BadMagic) {
  Bytes b = kPingRecord;
  b[3] = 'X';
  expect_error(decode_bytes(b), Code::kCorrupt, "bad magic 53 48 4f 58");
}

TEST(RecordMalformed, BadMagicRefusedBeforeAWholeHeader) {
  const std::string http = "GET / HTTP/1.1\r\n";  // 16 bytes; refused after its first 4
  RecordDecoder d;
  d.feed(std::span(reinterpret_cast<const uint8_t*>(http.data()), 4));
  expect_error(d.next(), Code::kCorrupt, "\"GET \"");
}

TEST(RecordMalformed, OtherProtocolVersion) {
  expect_error(decode_bytes(forge(3, 10, 0, Bytes(16))), Code::kUnsupported,
               "peer speaks protocol version 3, this build speaks 2");
  expect_error(decode_bytes(forge(1, 10, 0, Bytes(16))), Code::kUnsupported,
               "peer speaks protocol version 1, this build speaks 2");
  expect_error(decode_bytes(forge(0, 10, 0, Bytes(16))), Code::kUnsupported, "version 0");
}

TEST(RecordMalformed, UnknownType) {
  expect_error(decode_bytes(forge(kProtocolVersion, 0, 0, Bytes(16))), Code::kCorrupt, "unknown message type 0");
  expect_error(decode_bytes(forge(kProtocolVersion, 99, 0, Bytes(16))), Code::kCorrupt, "unknown message type 99");
}

TEST(RecordMalformed, HeaderFlagsSet) {
  expect_error(decode_bytes(forge(kProtocolVersion, 10, 0x80, Bytes(16))), Code::kCorrupt, "header flags 0x00000080");
}

TEST(RecordMalformed, LengthOverLimitRefusedFromTheHeaderAlone) {
  Bytes header = forge(kProtocolVersion, uint16_t(MsgType::kFrame), 0, {}, 4096);
  header.resize(kRecordHeaderSize);  // the payload never comes
  expect_error(decode_bytes(header, 1024), Code::kOutOfRange, "payload of 4096 bytes is over the limit of 1024");
  Bytes huge = forge(kProtocolVersion, uint16_t(MsgType::kFrame), 0, {}, 0xFFFFFFFF);
  huge.resize(kRecordHeaderSize);
  expect_error(decode_bytes(huge), Code::kOutOfRange, "over the limit of 67108864");
}

TEST(RecordMalformed, LengthWrongForType) {
  expect_error(decode_bytes(forge(kProtocolVersion, 10, 0, Bytes(15))), Code::kCorrupt, "ping payload is 15 bytes, expected 16");
  expect_error(decode_bytes(forge(kProtocolVersion, 10, 0, Bytes(17))), Code::kCorrupt, "ping payload is 17 bytes, expected 16");
  expect_error(decode_bytes(forge(kProtocolVersion, 4, 0, Bytes(565))), Code::kCorrupt, "hello payload is 565 bytes, expected 52..564");
  expect_error(decode_bytes(forge(kProtocolVersion, 8, 0, Bytes(19))), Code::kCorrupt, "frame payload is 19 bytes");
}

TEST(RecordMalformed, ChecksumMismatchInPayload) {
  Bytes b = kPingRecord;
  b[20] ^= 0x01;
  expect_error(decode_bytes(b), Code::kCorrupt, "checksum mismatch on a ping record");
}

TEST(RecordMalformed, ChecksumMismatchInTrailer) {
  Bytes b = kPingRecord;
  b.back() ^= 0x80;
  expect_error(decode_bytes(b), Code::kCorrupt, "stored 0x2ee2056c, computed 0xaee2056c");
}

TEST(RecordMalformed, ChecksumCoversTheHeader) {
  Bytes b = encode_record(encode(Bye{"ab"}));  // payload 02 00 'a' 'b'
  b[12] = 3;                                   // claim 3 payload bytes: "\x02\x00a"; 'b' + crc follow
  b.push_back(0);
  expect_error(decode_bytes(b), Code::kCorrupt, "checksum mismatch on a bye record of 3 bytes");
}

TEST(RecordMalformed, ErrorIsStickyAndKeepsNoBytes) {
  RecordDecoder d;
  Bytes bad = kPingRecord;
  bad[0] = 'X';
  d.feed(bad);
  ASSERT_FALSE(d.next().ok());
  d.feed(kPingRecord);
  auto r = d.next();
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
}

TEST(Record, TruncatedRecordWaitsForMore) {
  Bytes b(kPingRecord.begin(), kPingRecord.end() - 1);
  auto r = decode_bytes(b);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
}

// ---- payloads -----------------------------------------------------------------------------------

Hello sample_hello() {
  Hello h;
  h.role = PeerRole::kWorker;
  h.device_kind = DeviceKind::kCuda;
  h.threads = 16;
  h.data_port = 7001;
  h.mem_lent = 80ull << 30;
  h.matmul_gflops = 400000.f;
  h.mem_gbps = 4000.f;
  h.capabilities = kCapHopF16 | kCapHopF32 | (1ull << 40);
  h.model_size = 16'000'000'000ull;
  h.model_hash = 0x0123456789abcdefull;
  h.name = "box2";
  h.device_name = "NVIDIA H200 \xc3\xa9";  // UTF-8 is fine
  return h;
}

Assign sample_assign() {
  Assign a;
  a.plan_epoch = 3;
  a.model_size = 1234567;
  a.model_hash = 0xDEADBEEFCAFEF00Dull;
  a.n_layers = 32;
  a.first_layer = 8;
  a.last_layer = 15;
  a.d_model = 4096;
  a.context_length = 8192;
  a.stage = 1;
  a.n_stages = 3;
  a.hop_dtype = HopDType::kF16;
  a.kv_dtype = DType::kBF16;
  a.model_name = "model.gguf";
  a.next_hop = "10.0.0.3:7002";
  return a;
}

// Encodes, frames, decodes the record, decodes the payload.
template <class T>
T round_trip(const T& m) {
  auto r = decode_bytes(encode_record(encode(m)));
  EXPECT_TRUE(r.ok() && r->has_value()) << r.status().to_string();
  auto d = decode<T>(**r);
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  return *d;
}

TEST(Payload, RoundTripsEveryType) {
  Nonce n1, n2;
  Mac mac;
  for (size_t i = 0; i < 32; ++i) n1[i] = uint8_t(i), n2[i] = uint8_t(100 + i), mac[i] = uint8_t(200 + i);
  EXPECT_EQ(round_trip(Challenge{n1}).server_nonce, n1);
  const Auth a = round_trip(Auth{PeerRole::kHop, n1, mac});
  EXPECT_EQ(a.role, PeerRole::kHop);
  EXPECT_EQ(a.client_nonce, n1);
  EXPECT_EQ(a.mac, mac);
  EXPECT_EQ(round_trip(AuthOk{mac}).mac, mac);
  const Hello h = round_trip(sample_hello());
  EXPECT_EQ(h.device_kind, DeviceKind::kCuda);
  EXPECT_EQ(h.threads, 16);
  EXPECT_EQ(h.data_port, 7001);
  EXPECT_EQ(h.mem_lent, 80ull << 30);
  EXPECT_EQ(h.matmul_gflops, 400000.f);
  EXPECT_EQ(h.mem_gbps, 4000.f);
  EXPECT_EQ(h.capabilities, kCapHopF16 | kCapHopF32 | (1ull << 40));
  EXPECT_EQ(h.model_size, 16'000'000'000ull);
  EXPECT_EQ(h.model_hash, 0x0123456789abcdefull);
  EXPECT_EQ(h.name, "box2");
  EXPECT_EQ(h.device_name, "NVIDIA H200 \xc3\xa9");
  const Assign as = round_trip(sample_assign());
  EXPECT_EQ(as.model_hash, 0xDEADBEEFCAFEF00Dull);
  EXPECT_EQ(as.first_layer, 8u);
  EXPECT_EQ(as.last_layer, 15u);
  EXPECT_EQ(as.kv_dtype, DType::kBF16);
  EXPECT_EQ(as.next_hop, "10.0.0.3:7002");
  EXPECT_EQ(round_trip(Ready{1ull << 33, 2.5f}).load_seconds, 2.5f);
  EXPECT_EQ(round_trip(HopOpen{9, 2}).from_stage, 2);
  EXPECT_EQ(round_trip(Rewind{77, 300}).pos, 300u);
  EXPECT_EQ(round_trip(Pong{5, 6}).time_us, 6u);
  const ErrorMsg e = round_trip(ErrorMsg{Code::kNotFound, "wrong model file"});
  EXPECT_EQ(e.code, Code::kNotFound);
  EXPECT_EQ(e.message, "wrong model file");
  EXPECT_EQ(round_trip(Bye{""}).reason, "");
}

TEST(PayloadMalformed, WrongMessageType) {
  expect_status(decode<Ping>(encode(Pong{1, 2})).status(), Code::kCorrupt, "expected a ping message, got pong");
}

TEST(PayloadMalformed, EndsInsideAField) {
  Message m = encode(Ready{1, 1.f});
  m.payload.pop_back();
  expect_status(decode<Ready>(m).status(), Code::kCorrupt,
                "ready payload ends inside field 'load_seconds' (offset 8, needs 4 bytes, 3 left)");
}

TEST(PayloadMalformed, BytesAfterTheLastField) {
  Message m = encode(Ready{1, 1.f});
  m.payload.push_back(0);
  expect_status(decode<Ready>(m).status(), Code::kCorrupt, "ready payload has 1 bytes after its last field");
}

// A bye payload with a raw string field.
Message raw_bye(const Bytes& len_and_text) { return Message{MsgType::kBye, len_and_text}; }

TEST(PayloadMalformed, StringLengthPastTheEnd) {
  expect_status(decode<Bye>(raw_bye({50, 0, 'a', 'b', 'c'})).status(), Code::kCorrupt,
                "bye payload ends inside field 'reason'");
}

TEST(PayloadMalformed, StringOverItsLimit) {
  Hello h = sample_hello();
  h.name = "x";
  Message m = encode(h);
  // Replace the name (length 1) with 257 bytes.
  const size_t at = 48;  // fixed fields end here (protocol 2: with model_size and model_hash)
  ASSERT_EQ(m.payload[at], 1);
  m.payload.erase(m.payload.begin() + at, m.payload.begin() + at + 3);
  Bytes big = {1, 1};  // 257
  big.insert(big.end(), 257, 'n');
  m.payload.insert(m.payload.begin() + at, big.begin(), big.end());
  expect_status(decode<Hello>(m).status(), Code::kCorrupt, "hello field 'name' is 257 bytes long, limit 256");
}

TEST(PayloadMalformed, StringNotUtf8) {
  expect_status(decode<Bye>(raw_bye({2, 0, 0xC3, 0x28})).status(), Code::kCorrupt,
                "bye field 'reason' is not printable UTF-8 (byte 0xc3 at offset 0)");
  expect_status(decode<Bye>(raw_bye({2, 0, 0xC0, 0xAF})).status(), Code::kCorrupt, "byte 0xc0 at offset 0");  // overlong
  expect_status(decode<Bye>(raw_bye({3, 0, 0xED, 0xA0, 0x80})).status(), Code::kCorrupt, "byte 0xed");  // surrogate
  expect_status(decode<Bye>(raw_bye({1, 0, 0xFF})).status(), Code::kCorrupt, "byte 0xff");
  expect_status(decode<Bye>(raw_bye({2, 0, 0xE2, 0x82})).status(), Code::kCorrupt, "byte 0xe2");  // cut short
}

TEST(PayloadMalformed, StringWithControlCharacter) {
  expect_status(decode<Bye>(raw_bye({3, 0, 'a', '\n', 'b'})).status(), Code::kCorrupt, "byte 0x0a at offset 1");
  expect_status(decode<Bye>(raw_bye({1, 0, 0x7F})).status(), Code::kCorrupt, "byte 0x7f");
  expect_status(decode<Bye>(raw_bye({1, 0, 0x00})).status(), Code::kCorrupt, "byte 0x00");
}

TEST(PayloadMalformed, AuthRole) {
  for (uint8_t role : {0, 4, 255}) {
    Message m = encode(Auth{});
    m.payload[0] = role;
    expect_status(decode<Auth>(m).status(), Code::kCorrupt, "auth field 'role'");
  }
}

TEST(PayloadMalformed, HelloFields) {
  struct Case {
    const char* what;
    void (*mutate)(Hello&);
    Code code;
    const char* needle;
  };
  const Case cases[] = {
      {"version", [](Hello& h) { h.protocol_version = 3; }, Code::kUnsupported,
       "hello says protocol version 3, this build speaks 2"},
      {"role hop", [](Hello& h) { h.role = PeerRole::kHop; }, Code::kCorrupt, "hello field 'role' is 3"},
      {"role 0", [](Hello& h) { h.role = PeerRole(0); }, Code::kCorrupt, "hello field 'role' is 0"},
      {"device", [](Hello& h) { h.device_kind = DeviceKind(7); }, Code::kCorrupt, "'device_kind' is 7"},
      {"nan", [](Hello& h) { h.matmul_gflops = std::nanf(""); }, Code::kCorrupt, "'matmul_gflops' is nan"},
      {"inf", [](Hello& h) { h.mem_gbps = std::numeric_limits<float>::infinity(); }, Code::kCorrupt, "'mem_gbps' is inf"},
      {"negative", [](Hello& h) { h.mem_gbps = -1.f; }, Code::kCorrupt, "'mem_gbps' is -1"},
      {"huge", [](Hello& h) { h.mem_gbps = 2e9f; }, Code::kCorrupt, "'mem_gbps' is 2000000000"},
      {"empty name", [](Hello& h) { h.name.clear(); }, Code::kCorrupt, "hello field 'name' is empty"},
  };
  for (const Case& c : cases) {
    Hello h = sample_hello();
    c.mutate(h);
    SCOPED_TRACE(c.what);
    expect_status(decode<Hello>(encode(h)).status(), c.code, c.needle);
  }
}

TEST(PayloadMalformed, AssignFields) {
  struct Case {
    const char* what;
    void (*mutate)(Assign&);
    const char* needle;
  };
  const Case cases[] = {
      {"model size", [](Assign& a) { a.model_size = 0; }, "'model_size' is 0"},
      {"no layers", [](Assign& a) { a.n_layers = 0; }, "'n_layers' is 0"},
      {"too many layers", [](Assign& a) { a.n_layers = kMaxLayers + 1; }, "'n_layers' is 65537"},
      {"backwards", [](Assign& a) { a.first_layer = 9, a.last_layer = 8; }, "layer range 9-8 is not inside 0-31"},
      {"past the end", [](Assign& a) { a.last_layer = 32; }, "layer range 8-32 is not inside 0-31"},
      {"d_model 0", [](Assign& a) { a.d_model = 0; }, "'d_model' is 0"},
      {"d_model huge", [](Assign& a) { a.d_model = kMaxDModel + 1; }, "'d_model' is 1048577"},
      {"context 0", [](Assign& a) { a.context_length = 0; }, "'context_length' is 0"},
      {"stage 0", [](Assign& a) { a.stage = 0; }, "stage 0 of 3"},
      {"stage past end", [](Assign& a) { a.stage = 3; }, "stage 3 of 3"},
      {"too many stages", [](Assign& a) { a.n_stages = kMaxStages + 1; }, "stage 1 of 1025"},
      {"hop dtype", [](Assign& a) { a.hop_dtype = HopDType(2); }, "'hop_dtype' is 2"},
      {"kv dtype", [](Assign& a) { a.kv_dtype = DType(99); }, "'kv_dtype' is 99"},
      {"kv dtype gap", [](Assign& a) { a.kv_dtype = DType(4); }, "'kv_dtype' is 4"},
      {"next hop", [](Assign& a) { a.next_hop = "nowhere"; }, "'next_hop': address 'nowhere'"},
      {"next hop port 0", [](Assign& a) { a.next_hop = "10.0.0.1:0"; }, "port 0"},
  };
  for (const Case& c : cases) {
    Assign a = sample_assign();
    c.mutate(a);
    SCOPED_TRACE(c.what);
    expect_status(decode<Assign>(encode(a)).status(), Code::kCorrupt, c.needle);
  }
}

TEST(PayloadMalformed, ReadySeconds) {
  expect_status(decode<Ready>(encode(Ready{1, std::nanf("")})).status(), Code::kCorrupt, "'load_seconds' is nan");
  expect_status(decode<Ready>(encode(Ready{1, -2.f})).status(), Code::kCorrupt, "'load_seconds' is -2");
}

TEST(PayloadMalformed, HopOpenStage) {
  expect_status(decode<HopOpen>(encode(HopOpen{1, kMaxStages})).status(), Code::kCorrupt, "'from_stage' is 1024");
}

TEST(PayloadMalformed, ErrorCode) {
  expect_status(decode<ErrorMsg>(encode(ErrorMsg{Code::kOk, "x"})).status(), Code::kCorrupt, "'code' is 0");
  expect_status(decode<ErrorMsg>(encode(ErrorMsg{Code(13), "x"})).status(), Code::kCorrupt, "'code' is 13");
}

TEST(Payload, ErrorFromStatusIsPrintableAndBounded) {
  const ErrorMsg e = ErrorMsg::from(Status(Code::kCorrupt, std::string("a\nb\xff") + std::string(5000, 'z')));
  EXPECT_EQ(e.code, Code::kCorrupt);
  EXPECT_EQ(e.message.substr(0, 4), "a?b?");
  EXPECT_EQ(e.message.size(), kMaxErrorLen);
  EXPECT_TRUE(decode<ErrorMsg>(encode(e)).ok());
  EXPECT_EQ(printable_text("\xc3\xa9\xc3\xa9", 3), "\xc3\xa9");  // never cuts a character
}

// ---- frames -------------------------------------------------------------------------------------

constexpr FrameLimits kLimits{8, 100};  // d_model 8, context 100

Message sample_frame(uint16_t n_tokens, HopDType dtype, size_t data_bytes) {
  FrameHeader h;
  h.seq = 42;
  h.pos = 10;
  h.n_tokens = n_tokens;
  h.kind = FrameKind::kPrefill;
  h.dtype = dtype;
  Bytes data(data_bytes);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i);
  return encode_frame(h, data);
}

TEST(Frame, RoundTripsF16AndF32) {
  for (HopDType t : {HopDType::kF16, HopDType::kF32}) {
    const size_t bytes = 3 * 8 * hop_dtype_size(t);
    Message m = sample_frame(3, t, bytes);
    ASSERT_EQ(m.payload.size(), kFrameHeaderSize + bytes);
    auto r = decode_bytes(encode_record(m));
    ASSERT_TRUE(r.ok() && r->has_value());
    auto f = decode_frame(**r, kLimits);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_EQ(f->header.seq, 42u);
    EXPECT_EQ(f->header.pos, 10u);
    EXPECT_EQ(f->header.n_tokens, 3);
    EXPECT_EQ(f->header.dtype, t);
    ASSERT_EQ(f->data.size(), bytes);
    EXPECT_EQ(f->data[5], 5);
  }
}

TEST(Frame, HeaderLayoutByHand) {
  FrameHeader h;
  h.seq = 0x0807060504030201ull;
  h.pos = 0x0C0B0A09u;
  h.n_tokens = 0x0E0D;
  h.kind = FrameKind::kVerify;
  h.flags = kFrameWantAllLogits;
  h.dtype = HopDType::kF32;
  const Bytes want = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x0D, 0x0E, 2, 1, 0, 0, 0, 0, 0xAB};
  EXPECT_EQ(encode_frame(h, Bytes{0xAB}).payload, want);
}

// The last worker returns only the rows the host's head reads: the frame's last one, or none.
TEST(Frame, KeptRowsCarryOnlyTheRowsTheHeadReads) {
  Message last = sample_frame(3, HopDType::kF16, 16);
  last.payload[15] = kFrameHeadReadsLast | kFrameRowsKept;
  auto f = decode_frame(last, kLimits);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->header.n_tokens, 3);
  EXPECT_EQ(frame_rows(f->header), 1);
  EXPECT_EQ(f->data.size(), 16u);
  Message none = sample_frame(3, HopDType::kF32, 0);
  none.payload[15] = kFrameHeadReadsNone | kFrameRowsKept;
  f = decode_frame(none, kLimits);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(frame_rows(f->header), 0);
  EXPECT_TRUE(f->data.empty());
  // The requests alone (on their way to the last worker) still carry every row.
  for (uint8_t flags : {kFrameHeadReadsLast, kFrameHeadReadsNone}) {
    Message m = sample_frame(3, HopDType::kF16, 48);
    m.payload[15] = flags;
    f = decode_frame(m, kLimits);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_EQ(frame_rows(f->header), 3);
  }
}

TEST(FrameMalformed, ShorterThanItsHeader) {
  Message m{MsgType::kFrame, Bytes(19)};
  expect_status(decode_frame(m, kLimits).status(), Code::kCorrupt, "frame payload ends inside field 'reserved'");
}

TEST(FrameMalformed, ZeroTokens) {
  expect_status(decode_frame(sample_frame(0, HopDType::kF16, 0), kLimits).status(), Code::kCorrupt,
                "'n_tokens' is 0");
}

TEST(FrameMalformed, UnknownKind) {
  Message m = sample_frame(1, HopDType::kF16, 16);
  m.payload[14] = 3;
  expect_status(decode_frame(m, kLimits).status(), Code::kCorrupt, "'kind' is 3");
}

TEST(FrameMalformed, UnknownFlag) {
  Message m = sample_frame(1, HopDType::kF16, 16);
  m.payload[15] = 0x81;  // want-all-logits plus an unknown bit
  expect_status(decode_frame(m, kLimits).status(), Code::kCorrupt, "unknown bits 0x80");
}

TEST(FrameMalformed, MoreThanOneRowsTheHeadReads) {
  for (uint8_t flags : {uint8_t(kFrameHeadReadsLast | kFrameHeadReadsNone),
                        uint8_t(kFrameWantAllLogits | kFrameHeadReadsLast),
                        uint8_t(kFrameWantAllLogits | kFrameHeadReadsNone | kFrameRowsKept)}) {
    Message m = sample_frame(1, HopDType::kF16, 16);
    m.payload[15] = flags;
    expect_status(decode_frame(m, kLimits).status(), Code::kCorrupt, "more than one of bits 0-2");
  }
}

TEST(FrameMalformed, RowsKeptWithoutTheRowsTheHeadReads) {
  for (uint8_t flags : {kFrameRowsKept, uint8_t(kFrameWantAllLogits | kFrameRowsKept)}) {
    Message m = sample_frame(1, HopDType::kF16, 16);
    m.payload[15] = flags;
    expect_status(decode_frame(m, kLimits).status(), Code::kCorrupt, "rows kept (bit 3) without the rows the head reads");
  }
}

TEST(FrameMalformed, KeptRowsWithTheDataOfEveryToken) {
  Message m = sample_frame(3, HopDType::kF16, 48);
  m.payload[15] = kFrameHeadReadsLast | kFrameRowsKept;
  expect_status(decode_frame(m, kLimits).status(), Code::kCorrupt,
                "frame carries 48 bytes of hidden state; 1 kept rows x 8 wide x 2 bytes (f16) = 16 expected");
  m = sample_frame(3, HopDType::kF16, 16);
  m.payload[15] = kFrameHeadReadsNone | kFrameRowsKept;
  expect_status(decode_frame(m, kLimits).status(), Code::kCorrupt, "16 bytes of hidden state; 0 kept rows");
}

TEST(FrameMalformed, UnknownDtype) {
  Message m = sample_frame(1, HopDType::kF16, 16);
  m.payload[16] = 30;  // bf16 is not a hop dtype
  expect_status(decode_frame(m, kLimits).status(), Code::kCorrupt, "'dtype' is 30");
}

TEST(FrameMalformed, ReservedNotZero) {
  Message m = sample_frame(1, HopDType::kF16, 16);
  m.payload[19] = 1;
  expect_status(decode_frame(m, kLimits).status(), Code::kCorrupt, "reserved bytes are not zero");
}

TEST(FrameMalformed, PastTheContext) {
  Message m = sample_frame(3, HopDType::kF16, 48);
  expect_status(decode_frame(m, FrameLimits{8, 12}).status(), Code::kOutOfRange,
                "positions 10..12 exceed the context length 12");
  // pos near 2^32 must not wrap around.
  m.payload[8] = m.payload[9] = m.payload[10] = m.payload[11] = 0xFF;
  expect_status(decode_frame(m, FrameLimits{8, kMaxContext}).status(), Code::kOutOfRange, "exceed");
}

TEST(FrameMalformed, DataShorterThanCountTimesWidth) {
  expect_status(decode_frame(sample_frame(3, HopDType::kF16, 47), kLimits).status(), Code::kCorrupt,
                "frame carries 47 bytes of hidden state; 3 tokens x 8 wide x 2 bytes (f16) = 48 expected");
}

TEST(FrameMalformed, DataLongerThanCountTimesWidth) {
  expect_status(decode_frame(sample_frame(3, HopDType::kF32, 97), kLimits).status(), Code::kCorrupt,
                "97 bytes of hidden state; 3 tokens x 8 wide x 4 bytes (f32) = 96 expected");
}

TEST(FrameMalformed, WidthOfAnotherModel) {
  // Right size for d_model 16, wrong for the assignment's 8.
  expect_status(decode_frame(sample_frame(1, HopDType::kF16, 32), kLimits).status(), Code::kCorrupt,
                "1 tokens x 8 wide");
}

// ---- addresses ----------------------------------------------------------------------------------

TEST(Address, Forms) {
  auto a = parse_address("10.1.2.3:7000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "10.1.2.3");
  EXPECT_EQ(a->port, 7000);
  EXPECT_EQ(parse_address(":7000")->to_string(), "127.0.0.1:7000");
  EXPECT_EQ(parse_address("7000")->to_string(), "127.0.0.1:7000");
  EXPECT_EQ(parse_address("[::1]:80")->host, "::1");
  EXPECT_EQ(parse_address("[::1]:80")->to_string(), "[::1]:80");
  EXPECT_EQ(parse_address("box-2.lan:65535")->port, 65535);
  EXPECT_EQ(parse_address("0.0.0.0:0", true)->port, 0);
}

TEST(Address, Refused) {
  for (const char* bad : {"", ":", "host:", "host:x", "host:65536", "host:0", "::1:80", "[::1]80", "[::1",
                          "[zz]:80", "a b:80", "host:123456"}) {
    auto a = parse_address(bad);
    EXPECT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), Code::kInvalidArgument) << bad;
  }
  // A host without a port is named as such (a word of digits alone is a port).
  test::expect_error(parse_address("127.0.0.1"), Code::kInvalidArgument, "address '127.0.0.1': no ':PORT'");
  test::expect_error(parse_address("box-2.lan"), Code::kInvalidArgument, "no ':PORT'");
}

}  // namespace
}  // namespace shoal::pool
