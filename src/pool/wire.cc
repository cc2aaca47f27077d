#include "pool/wire.h"

#include <cstring>

#include "pool/crc32c.h"
#include "pool/messages.h"

namespace shoal::pool {
namespace {

void put_u16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v), p[1] = uint8_t(v >> 8); }
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
uint16_t get_u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t get_u32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

template <class T>
MsgTypeInfo row(std::string_view name) {
  const auto [lo, hi] = payload_bounds<T>();
  return {T::kType, name, lo, hi};
}

// Indexed by type number - 1; sizes come from each message's field list (pool/messages.h).
const std::vector<MsgTypeInfo>& type_table() {
  static const std::vector<MsgTypeInfo> table = {
      row<Challenge>("challenge"),
      row<Auth>("auth"),
      row<AuthOk>("auth_ok"),
      row<Hello>("hello"),
      row<Assign>("assign"),
      row<Ready>("ready"),
      row<HopOpen>("hop_open"),
      {MsgType::kFrame, "frame", payload_bounds<FrameHeader>().first, 0},
      row<Rewind>("rewind"),
      row<Ping>("ping"),
      row<Pong>("pong"),
      row<ErrorMsg>("error"),
      row<Bye>("bye"),
  };
  return table;
}

std::string printable(const uint8_t* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (p[i] >= 0x20 && p[i] < 0x7F) ? char(p[i]) : '.';
  return s;
}

}  // namespace

const MsgTypeInfo* msg_type_info(uint16_t raw) {
  const auto& t = type_table();
  if (raw == 0 || raw > t.size()) return nullptr;
  return &t[raw - 1];
}

std::string_view msg_type_name(MsgType t) {
  const MsgTypeInfo* info = msg_type_info(static_cast<uint16_t>(t));
  return info ? info->name : "unknown";
}

RecordFraming frame_record(MsgType type, std::span<const uint8_t> payload, uint16_t version) {
  RecordFraming f;
  uint8_t* h = f.header.data();
  std::memcpy(h, kMagic.data(), 4);
  put_u16(h + 4, version);
  put_u16(h + 6, static_cast<uint16_t>(type));
  put_u32(h + 8, 0);  // flags: none defined in version 1
  put_u32(h + 12, static_cast<uint32_t>(payload.size()));
  const uint32_t crc = crc32c_extend(crc32c(h, kRecordHeaderSize), payload.data(), payload.size());
  put_u32(f.trailer.data(), crc);
  return f;
}

std::vector<uint8_t> encode_record(const Message& m, uint16_t version) {
  const RecordFraming f = frame_record(m.type, m.payload, version);
  std::vector<uint8_t> out(kRecordHeaderSize + m.payload.size() + kRecordTrailerSize);
  std::memcpy(out.data(), f.header.data(), kRecordHeaderSize);
  if (!m.payload.empty()) std::memcpy(out.data() + kRecordHeaderSize, m.payload.data(), m.payload.size());
  std::memcpy(out.data() + kRecordHeaderSize + m.payload.size(), f.trailer.data(), kRecordTrailerSize);
  return out;
}

void RecordDecoder::feed(std::span<const uint8_t> bytes) {
  if (!error_.ok()) return;  // the stream is dead; keep no more bytes
  if (pos_ > 0 && pos_ >= buf_.size() / 2) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<ptrdiff_t>(pos_));
    pos_ = 0;
  }
  append_bytes(buf_, bytes.data(), bytes.size());
}

Status RecordDecoder::check_header(const uint8_t* h) const {
  if (std::memcmp(h, kMagic.data(), 4) != 0) {
    return make_error(Code::kCorrupt,
                      "bad magic {:02x} {:02x} {:02x} {:02x} (\"{}\"), expected \"SHOL\": not a shoal peer",
                      h[0], h[1], h[2], h[3], printable(h, 4));
  }
  const uint16_t version = get_u16(h + 4);
  if (version != kProtocolVersion) {
    return make_error(Code::kUnsupported, "peer speaks protocol version {}, this build speaks {}",
                      version, kProtocolVersion);
  }
  const uint16_t raw_type = get_u16(h + 6);
  const MsgTypeInfo* info = msg_type_info(raw_type);
  if (!info) return make_error(Code::kCorrupt, "unknown message type {}", raw_type);
  const uint32_t flags = get_u32(h + 8);
  if (flags != 0) {
    return make_error(Code::kCorrupt, "{} record has header flags 0x{:08x}; version {} defines none",
                      info->name, flags, kProtocolVersion);
  }
  const uint32_t len = get_u32(h + 12);
  if (len > max_payload_) {
    return make_error(Code::kOutOfRange, "{} record payload of {} bytes is over the limit of {} bytes",
                      info->name, len, max_payload_);
  }
  if (len < info->min_payload || (info->max_payload != 0 && len > info->max_payload)) {
    if (info->min_payload == info->max_payload) {
      return make_error(Code::kCorrupt, "{} payload is {} bytes, expected {}", info->name, len,
                        info->min_payload);
    }
    return make_error(Code::kCorrupt, "{} payload is {} bytes, expected {}..{}", info->name, len,
                      info->min_payload, info->max_payload == 0 ? max_payload_ : info->max_payload);
  }
  return Status::Ok();
}

Result<std::optional<Message>> RecordDecoder::next() {
  if (!error_.ok()) return error_;
  const size_t avail = buf_.size() - pos_;
  if (avail < kRecordHeaderSize) {
    // Refuse a wrong magic as soon as its first bytes arrive (an HTTP client, a port scanner).
    const size_t n = std::min<size_t>(avail, 4);
    if (n > 0 && std::memcmp(buf_.data() + pos_, kMagic.data(), n) != 0) {
      uint8_t h[4] = {};
      std::memcpy(h, buf_.data() + pos_, n);
      error_ = make_error(Code::kCorrupt, "bad magic (first {} bytes \"{}\"), expected \"SHOL\": not a shoal peer",
                          n, printable(h, n));
      return error_;
    }
    return std::optional<Message>();
  }
  const uint8_t* h = buf_.data() + pos_;
  if (Status st = check_header(h); !st.ok()) {
    error_ = st;
    return error_;
  }
  const uint32_t len = get_u32(h + 12);
  const size_t total = kRecordHeaderSize + size_t(len) + kRecordTrailerSize;
  if (avail < total) return std::optional<Message>();
  const uint8_t* payload = h + kRecordHeaderSize;
  const uint32_t stored = get_u32(payload + len);
  const uint32_t computed = crc32c_extend(crc32c(h, kRecordHeaderSize), payload, len);
  const MsgType type = static_cast<MsgType>(get_u16(h + 6));
  if (stored != computed) {
    error_ = make_error(Code::kCorrupt, "checksum mismatch on a {} record of {} bytes: stored 0x{:08x}, computed 0x{:08x}",
                        msg_type_name(type), len, stored, computed);
    return error_;
  }
  Message m{type, std::vector<uint8_t>(payload, payload + len)};
  pos_ += total;
  return std::optional<Message>(std::move(m));
}

}  // namespace shoal::pool
