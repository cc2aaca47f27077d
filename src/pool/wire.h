// The pool's record layer (docs/protocol.md): every message between machines travels as one record
//   magic "SHOL" | version u16 | type u16 | flags u32 | payload length u32 | payload | crc32c u32
// little-endian, the CRC-32C covering header and payload. RecordDecoder is fed bytes as they
// arrive from a socket and yields whole messages, or the first error in the stream (sticky).
// Record framing after google/leveldb doc/log_format.md; payload layouts are in pool/messages.h.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace shoal::pool {

/// Protocol version this build speaks; a record with any other version is refused.
inline constexpr uint16_t kProtocolVersion = 2;  // 2: hello carries the model identity
inline constexpr std::array<uint8_t, 4> kMagic = {'S', 'H', 'O', 'L'};
inline constexpr size_t kRecordHeaderSize = 16;
inline constexpr size_t kRecordTrailerSize = 4;
/// Default limit on one record's payload (a 16-token f32 frame of an 8192-wide model is 512 KiB).
inline constexpr uint32_t kDefaultMaxPayload = 64u << 20;

/// Message types; numbering is part of the protocol.
enum class MsgType : uint16_t {
  kChallenge = 1,  // server -> client: server nonce
  kAuth = 2,       // client -> server: role, client nonce, HMAC proof
  kAuthOk = 3,     // server -> client: the server's HMAC proof
  kHello = 4,      // worker/guest -> host: device facts
  kAssign = 5,     // host -> worker: model identity, layer range, dtypes, next hop
  kReady = 6,      // worker -> host: slice loaded
  kHopOpen = 7,    // first message on a hop connection: plan epoch and sending stage
  kFrame = 8,      // hidden state of n_tokens positions
  kRewind = 9,     // drop positions >= p of a sequence
  kPing = 10,
  kPong = 11,
  kError = 12,     // a Status code and message (e.g. "wrong model file")
  kBye = 13,       // orderly goodbye with a reason
};

/// Static facts about one message type: its name and the payload sizes it allows.
struct MsgTypeInfo {
  MsgType type;
  std::string_view name;  // "hello"
  uint32_t min_payload;   // bytes
  uint32_t max_payload;   // bytes; 0 = bounded only by the decoder's limit
};

/// Info for a raw type number read from the wire; nullptr for numbers that are not types.
const MsgTypeInfo* msg_type_info(uint16_t raw);
/// "hello", "frame"... ("type 99" never: the type is known here).
std::string_view msg_type_name(MsgType t);

/// One decoded message: its type and its payload bytes (layout per type in pool/messages.h).
struct Message {
  MsgType type = MsgType::kBye;
  std::vector<uint8_t> payload;
};

/// Header and trailer of one record, so a transport can send header, payload and trailer without
/// copying the payload. `version` is kProtocolVersion except in tests that forge other versions.
struct RecordFraming {
  std::array<uint8_t, kRecordHeaderSize> header;
  std::array<uint8_t, kRecordTrailerSize> trailer;
};
RecordFraming frame_record(MsgType type, std::span<const uint8_t> payload,
                           uint16_t version = kProtocolVersion);

/// The whole record as one buffer (tests, fuzzing, small messages).
std::vector<uint8_t> encode_record(const Message& m, uint16_t version = kProtocolVersion);

/// Incremental record decoder. Checks, in this order, as soon as the bytes are there: magic
/// (kCorrupt), version (kUnsupported, naming both versions), type (kCorrupt), flags (kCorrupt),
/// length against `max_payload` (kOutOfRange) and against the type's sizes (kCorrupt), then the
/// checksum (kCorrupt). An error is sticky: the stream cannot be resynchronised, so the
/// connection must be closed. Buffered bytes stay below one record plus what one feed() added.
class RecordDecoder {
 public:
  explicit RecordDecoder(uint32_t max_payload = kDefaultMaxPayload) : max_payload_(max_payload) {}

  /// Appends bytes received from the peer.
  void feed(std::span<const uint8_t> bytes);
  /// The next whole message; nullopt when more bytes are needed; the error once malformed.
  Result<std::optional<Message>> next();
  /// Bytes received but not yet returned as messages.
  size_t buffered() const { return buf_.size() - pos_; }
  uint32_t max_payload() const { return max_payload_; }

 private:
  Status check_header(const uint8_t* h) const;

  uint32_t max_payload_;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;  // start of the first unconsumed byte in buf_
  Status error_;
};

}  // namespace shoal::pool
