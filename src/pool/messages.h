// Payloads of the pool's messages (docs/protocol.md has the same layouts as a grammar). Each struct
// lists its fields once, in wire order, in `fields(self, visitor)`; encode<T>() and decode<T>()
// walk that list with PayloadWriter / PayloadReader, then decode runs the struct's check() on the
// values. All integers are little-endian and unsigned; strings are u16 length + printable UTF-8.
// Frames carry hidden-state bytes after a fixed header and have their own codec (encode_frame /
// decode_frame) because their length depends on d_model from the assignment.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "pool/byte_io.h"
#include "pool/wire.h"
#include "tensor/dtype.h"

namespace shoal::pool {

inline constexpr size_t kNonceSize = 32;  // bytes of a random challenge / client nonce
inline constexpr size_t kMacSize = 32;    // HMAC-SHA256 output
using Nonce = std::array<uint8_t, kNonceSize>;
using Mac = std::array<uint8_t, kMacSize>;

// String limits (bytes); a longer string makes the message malformed.
inline constexpr size_t kMaxNameLen = 256;        // peer and device names
inline constexpr size_t kMaxModelNameLen = 1024;  // model file name, for messages
inline constexpr size_t kMaxAddressLen = 300;     // "host:port", "[v6]:port"
inline constexpr size_t kMaxErrorLen = 4096;
inline constexpr size_t kMaxByeLen = 1024;
// Range limits on assignment fields.
inline constexpr uint32_t kMaxLayers = 1u << 16;
inline constexpr uint32_t kMaxDModel = 1u << 20;
inline constexpr uint32_t kMaxContext = 1u << 24;
inline constexpr uint16_t kMaxStages = 1024;
inline constexpr float kMaxSpeed = 1e9f;  // GB/s or GFLOP/s; anything above is nonsense

/// Who a connection belongs to; sent in auth (bound into the HMAC) and hello.
enum class PeerRole : uint8_t { kWorker = 1, kGuest = 2, kHop = 3 };
std::string_view peer_role_name(PeerRole r);
/// What computes on the worker.
enum class DeviceKind : uint8_t { kCpu = 0, kCuda = 1 };
std::string_view device_kind_name(DeviceKind k);
/// Why a frame travels: prompt batch, one decoded token, or 1+K tokens to verify a draft.
enum class FrameKind : uint8_t { kPrefill = 0, kDecode = 1, kVerify = 2 };
std::string_view frame_kind_name(FrameKind k);
/// Element type of hidden states on a hop; values equal ggml's type ids (F32 = 0, F16 = 1).
enum class HopDType : uint8_t { kF32 = 0, kF16 = 1 };
std::string_view hop_dtype_name(HopDType t);
inline size_t hop_dtype_size(HopDType t) { return t == HopDType::kF32 ? 4 : 2; }

// Hello capability bits; unknown bits from newer peers are ignored.
inline constexpr uint64_t kCapHopF32 = 1u << 0;
inline constexpr uint64_t kCapHopF16 = 1u << 1;
// The peer reads kFrameHeadReadsLast / kFrameHeadReadsNone and, when it runs the model's last
// layer, returns only the rows the head reads (kFrameRowsKept).
inline constexpr uint64_t kCapKeepRows = 1u << 2;
// Frame flag bits; unknown bits make the frame malformed. At most one of the first three; the
// host sets kFrameHeadReadsLast / kFrameHeadReadsNone only when every worker of the chain
// announced kCapKeepRows.
inline constexpr uint8_t kFrameWantAllLogits = 1u << 0;  // the host wants logits at every position
inline constexpr uint8_t kFrameHeadReadsLast = 1u << 1;  // the host's head reads the frame's last row only
inline constexpr uint8_t kFrameHeadReadsNone = 1u << 2;  // the host's head reads no row (a prefill frame before the last)
// Set by the stage that ran the model's last layer on a kFrameHeadReads* frame: the data holds
// only the rows the head reads (the last one, or none).
inline constexpr uint8_t kFrameRowsKept = 1u << 3;
inline constexpr uint8_t kFrameKnownFlags =
    kFrameWantAllLogits | kFrameHeadReadsLast | kFrameHeadReadsNone | kFrameRowsKept;

/// server -> client, first message on every connection.
struct Challenge {
  static constexpr MsgType kType = MsgType::kChallenge;
  Nonce server_nonce{};
  template <class S, class V> static void fields(S& s, V& v) { v.blob("server_nonce", s.server_nonce); }
  Status check() const { return Status::Ok(); }
};

/// client -> server: mac = HMAC-SHA256(secret, "shoal-auth-client" | server_nonce | client_nonce |
/// version u16 | role u8) (pool/auth.h).
struct Auth {
  static constexpr MsgType kType = MsgType::kAuth;
  PeerRole role = PeerRole::kWorker;
  Nonce client_nonce{};
  Mac mac{};
  template <class S, class V> static void fields(S& s, V& v) {
    v.num("role", s.role);
    v.blob("client_nonce", s.client_nonce);
    v.blob("mac", s.mac);
  }
  Status check() const;
};

/// server -> client: the server's proof, HMAC-SHA256(secret, "shoal-auth-server" | same inputs).
struct AuthOk {
  static constexpr MsgType kType = MsgType::kAuthOk;
  Mac mac{};
  template <class S, class V> static void fields(S& s, V& v) { v.blob("mac", s.mac); }
  Status check() const { return Status::Ok(); }
};

/// worker/guest -> host after authentication: what the peer lends.
struct Hello {
  static constexpr MsgType kType = MsgType::kHello;
  uint16_t protocol_version = kProtocolVersion;
  PeerRole role = PeerRole::kWorker;  // worker or guest
  DeviceKind device_kind = DeviceKind::kCpu;
  uint16_t threads = 0;        // CPU threads the worker will use
  uint16_t data_port = 0;      // port of the worker's hop listener; 0 = none (guests)
  uint64_t mem_lent = 0;       // bytes of device memory lent to the pool
  float matmul_gflops = 0;     // speed probe: GFLOP/s of a large matmul
  float mem_gbps = 0;          // speed probe: GB/s of a large read
  uint64_t capabilities = 0;   // kCap* bits
  uint64_t model_size = 0;     // a worker's own model file (-m): its size in bytes; 0: none opened yet
  uint64_t model_hash = 0;     // and its model_identity() (the host refuses another model at once)
  std::string name;            // peer label for plans and errors ("box2"), non-empty
  std::string device_name;     // "NVIDIA H200", "AMD EPYC 9654"
  template <class S, class V> static void fields(S& s, V& v) {
    v.num("protocol_version", s.protocol_version);
    v.num("role", s.role);
    v.num("device_kind", s.device_kind);
    v.num("threads", s.threads);
    v.num("data_port", s.data_port);
    v.num("mem_lent", s.mem_lent);
    v.num("matmul_gflops", s.matmul_gflops);
    v.num("mem_gbps", s.mem_gbps);
    v.num("capabilities", s.capabilities);
    v.num("model_size", s.model_size);
    v.num("model_hash", s.model_hash);
    v.str("name", s.name, kMaxNameLen);
    v.str("device_name", s.device_name, kMaxNameLen);
  }
  Status check() const;
};

/// host -> worker: what to load and where to send results. Layers [first_layer, last_layer].
struct Assign {
  static constexpr MsgType kType = MsgType::kAssign;
  uint64_t plan_epoch = 0;     // increases with every plan; hop connections name it
  uint64_t model_size = 0;     // model file size in bytes (identity, with model_hash)
  uint64_t model_hash = 0;     // model_identity(): tensor index + sampled weight bytes
  uint32_t n_layers = 0;       // layers in the whole model
  uint32_t first_layer = 0;
  uint32_t last_layer = 0;     // inclusive
  uint32_t d_model = 0;        // hidden-state width (frames are checked against it)
  uint32_t context_length = 0; // positions the KV cache must hold
  uint16_t stage = 0;          // this worker's place in the chain (the host is stage 0)
  uint16_t n_stages = 0;       // stages in the chain, host included
  HopDType hop_dtype = HopDType::kF16;
  DType kv_dtype = DType::kF16;  // a ggml type id, one byte on the wire
  std::string model_name;      // the host's path of the model (workers without -m open it)
  std::string next_hop;        // "host:port" the worker connects its output to (0.0.0.0: the host)
  template <class S, class V> static void fields(S& s, V& v) {
    v.num("plan_epoch", s.plan_epoch);
    v.num("model_size", s.model_size);
    v.num("model_hash", s.model_hash);
    v.num("n_layers", s.n_layers);
    v.num("first_layer", s.first_layer);
    v.num("last_layer", s.last_layer);
    v.num("d_model", s.d_model);
    v.num("context_length", s.context_length);
    v.num("stage", s.stage);
    v.num("n_stages", s.n_stages);
    v.num("hop_dtype", s.hop_dtype);
    v.template num_as<uint8_t>("kv_dtype", s.kv_dtype);
    v.str("model_name", s.model_name, kMaxModelNameLen);
    v.str("next_hop", s.next_hop, kMaxAddressLen);
  }
  Status check() const;
};

/// worker -> host: the slice is loaded.
struct Ready {
  static constexpr MsgType kType = MsgType::kReady;
  uint64_t bytes_loaded = 0;
  float load_seconds = 0;
  template <class S, class V> static void fields(S& s, V& v) {
    v.num("bytes_loaded", s.bytes_loaded);
    v.num("load_seconds", s.load_seconds);
  }
  Status check() const;
};

/// First message on a hop connection (after auth with role hop): which plan and which stage sends.
struct HopOpen {
  static constexpr MsgType kType = MsgType::kHopOpen;
  uint64_t plan_epoch = 0;
  uint16_t from_stage = 0;
  template <class S, class V> static void fields(S& s, V& v) {
    v.num("plan_epoch", s.plan_epoch);
    v.num("from_stage", s.from_stage);
  }
  Status check() const;
};

/// Drop every cached position >= pos of sequence seq; travels the chain in order with frames.
struct Rewind {
  static constexpr MsgType kType = MsgType::kRewind;
  uint64_t seq = 0;
  uint32_t pos = 0;
  template <class S, class V> static void fields(S& s, V& v) {
    v.num("seq", s.seq);
    v.num("pos", s.pos);
  }
  Status check() const { return Status::Ok(); }
};

/// Heartbeat; the answer is a Pong with the same nonce and time.
struct Ping {
  static constexpr MsgType kType = MsgType::kPing;
  uint64_t nonce = 0;
  uint64_t time_us = 0;  // sender's monotonic clock, microseconds
  template <class S, class V> static void fields(S& s, V& v) {
    v.num("nonce", s.nonce);
    v.num("time_us", s.time_us);
  }
  Status check() const { return Status::Ok(); }
};
struct Pong {
  static constexpr MsgType kType = MsgType::kPong;
  uint64_t nonce = 0;
  uint64_t time_us = 0;  // copied from the ping
  template <class S, class V> static void fields(S& s, V& v) {
    v.num("nonce", s.nonce);
    v.num("time_us", s.time_us);
  }
  Status check() const { return Status::Ok(); }
};

/// A failure the peer should know about; code is a shoal::Code other than kOk.
struct ErrorMsg {
  static constexpr MsgType kType = MsgType::kError;
  Code code = Code::kInternal;
  std::string message;
  template <class S, class V> static void fields(S& s, V& v) {
    v.template num_as<uint16_t>("code", s.code);
    v.str("message", s.message, kMaxErrorLen);
  }
  Status check() const;
  /// The Status this message reports: "<from> says: <message>".
  Status to_status(std::string_view from) const;
  /// An error message for `st` (not ok), its text made printable and cut to kMaxErrorLen.
  static ErrorMsg from(const Status& st);
};

/// Orderly goodbye; the sender closes after it.
struct Bye {
  static constexpr MsgType kType = MsgType::kBye;
  std::string reason;
  template <class S, class V> static void fields(S& s, V& v) { v.str("reason", s.reason, kMaxByeLen); }
  Status check() const { return Status::Ok(); }
  /// A bye whose reason is made printable and cut to kMaxByeLen.
  static Bye from(std::string_view reason) { return Bye{printable_text(reason, kMaxByeLen)}; }
};

/// Encodes a message struct (strings must be within their limits: a longer one is a caller bug).
template <class T>
Message encode(const T& m) {
  Message out{T::kType, {}};
  PayloadWriter w(out.payload);
  T::fields(m, w);
  return out;
}

/// Decodes and checks a message of type T; kCorrupt naming the message and field when malformed,
/// kUnsupported for a hello of another protocol version.
template <class T>
Result<T> decode(const Message& m) {
  if (m.type != T::kType) {
    return make_error(Code::kCorrupt, "expected a {} message, got {}", msg_type_name(T::kType),
                      msg_type_name(m.type));
  }
  T out;
  PayloadReader r(m.payload, msg_type_name(T::kType));
  T::fields(out, r);
  SHOAL_RETURN_IF_ERROR(r.finish());
  SHOAL_RETURN_IF_ERROR(out.check());
  return out;
}

/// Payload size bounds of T from its field list: {min, max} bytes (strings empty / at limit).
template <class T>
std::pair<uint32_t, uint32_t> payload_bounds();

// ---- frames ---------------------------------------------------------------------------------

/// Fixed part of a frame payload (20 bytes), followed by frame_rows() x d_model values of dtype.
struct FrameHeader {
  uint64_t seq = 0;       // sequence (conversation) id
  uint32_t pos = 0;       // position of the first token
  uint16_t n_tokens = 0;  // >= 1
  FrameKind kind = FrameKind::kPrefill;
  uint8_t flags = 0;      // kFrame* bits
  HopDType dtype = HopDType::kF16;
  std::array<uint8_t, 3> reserved{};  // zero
  template <class S, class V> static void fields(S& s, V& v) {
    v.num("seq", s.seq);
    v.num("pos", s.pos);
    v.num("n_tokens", s.n_tokens);
    v.num("kind", s.kind);
    v.num("flags", s.flags);
    v.num("dtype", s.dtype);
    v.blob("reserved", s.reserved);
  }
};
inline constexpr size_t kFrameHeaderSize = 20;

/// What the receiver knows from its assignment to check a frame.
struct FrameLimits {
  uint32_t d_model = 0;         // values per token
  uint32_t context_length = 0;  // pos + n_tokens must not exceed it
};

/// The rows of hidden state a frame carries: n_tokens, or with kFrameRowsKept the rows the head
/// reads (1 for kFrameHeadReadsLast, 0 for kFrameHeadReadsNone: the last rows of the frame).
int frame_rows(const FrameHeader& h);

/// A decoded frame; `data` points into the Message it came from (valid while that lives).
struct FrameView {
  FrameHeader header;
  std::span<const uint8_t> data;  // [frame_rows(header), d_model] values of header.dtype, little-endian
};

/// Builds a frame message; data must be frame_rows(h) x d_model values of h.dtype (not checked here).
Message encode_frame(const FrameHeader& h, std::span<const uint8_t> data);
/// Checks every header field (flags: known bits, at most one request, kFrameRowsKept only with
/// a kFrameHeadReads* bit) and that the data is exactly frame_rows x d_model x dtype size bytes.
Result<FrameView> decode_frame(const Message& m, const FrameLimits& limits);

}  // namespace shoal::pool
