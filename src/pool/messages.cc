#include "pool/messages.h"

#include <algorithm>
#include <cmath>

#include "pool/address.h"

namespace shoal::pool {
namespace {

Status check_speed(std::string_view field, float v) {
  if (!std::isfinite(v) || v < 0 || v > kMaxSpeed) {
    return make_error(Code::kCorrupt, "hello field '{}' is {}, expected 0..{}", field, v, kMaxSpeed);
  }
  return Status::Ok();
}

// Visitor that adds up a message's payload size with every string empty (lo) or full (hi).
struct SizeVisitor {
  uint32_t lo = 0;
  uint32_t hi = 0;
  template <typename T>
  void num(const char*, const T&) {
    lo += sizeof(T), hi += sizeof(T);
  }
  template <typename W, typename T>
  void num_as(const char*, const T&) {
    lo += sizeof(W), hi += sizeof(W);
  }
  template <size_t N>
  void blob(const char*, const std::array<uint8_t, N>&) {
    lo += N, hi += N;
  }
  void str(const char*, const std::string&, size_t max_len) {
    lo += 2, hi += 2 + static_cast<uint32_t>(max_len);
  }
};

}  // namespace

std::string_view peer_role_name(PeerRole r) {
  switch (r) {
    case PeerRole::kWorker: return "worker";
    case PeerRole::kGuest: return "guest";
    case PeerRole::kHop: return "hop";
  }
  return "unknown role";
}

std::string_view device_kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kCuda: return "cuda";
  }
  return "unknown device";
}

std::string_view frame_kind_name(FrameKind k) {
  switch (k) {
    case FrameKind::kPrefill: return "prefill";
    case FrameKind::kDecode: return "decode";
    case FrameKind::kVerify: return "verify";
  }
  return "unknown kind";
}

std::string_view hop_dtype_name(HopDType t) {
  switch (t) {
    case HopDType::kF32: return "f32";
    case HopDType::kF16: return "f16";
  }
  return "unknown dtype";
}

Status Auth::check() const {
  if (role != PeerRole::kWorker && role != PeerRole::kGuest && role != PeerRole::kHop) {
    return make_error(Code::kCorrupt, "auth field 'role' is {}, expected 1 (worker), 2 (guest) or 3 (hop)",
                      static_cast<int>(role));
  }
  return Status::Ok();
}

Status Hello::check() const {
  if (protocol_version != kProtocolVersion) {
    return make_error(Code::kUnsupported, "hello says protocol version {}, this build speaks {}",
                      protocol_version, kProtocolVersion);
  }
  if (role != PeerRole::kWorker && role != PeerRole::kGuest) {
    return make_error(Code::kCorrupt, "hello field 'role' is {}, expected 1 (worker) or 2 (guest)",
                      static_cast<int>(role));
  }
  if (device_kind != DeviceKind::kCpu && device_kind != DeviceKind::kCuda) {
    return make_error(Code::kCorrupt, "hello field 'device_kind' is {}, expected 0 (cpu) or 1 (cuda)",
                      static_cast<int>(device_kind));
  }
  SHOAL_RETURN_IF_ERROR(check_speed("matmul_gflops", matmul_gflops));
  SHOAL_RETURN_IF_ERROR(check_speed("mem_gbps", mem_gbps));
  if (name.empty()) return make_error(Code::kCorrupt, "hello field 'name' is empty");
  return Status::Ok();
}

Status Assign::check() const {
  if (model_size == 0) return make_error(Code::kCorrupt, "assign field 'model_size' is 0");
  if (n_layers == 0 || n_layers > kMaxLayers) {
    return make_error(Code::kCorrupt, "assign field 'n_layers' is {}, expected 1..{}", n_layers, kMaxLayers);
  }
  if (first_layer > last_layer || last_layer >= n_layers) {
    return make_error(Code::kCorrupt, "assign layer range {}-{} is not inside 0-{}", first_layer,
                      last_layer, n_layers - 1);
  }
  if (d_model == 0 || d_model > kMaxDModel) {
    return make_error(Code::kCorrupt, "assign field 'd_model' is {}, expected 1..{}", d_model, kMaxDModel);
  }
  if (context_length == 0 || context_length > kMaxContext) {
    return make_error(Code::kCorrupt, "assign field 'context_length' is {}, expected 1..{}",
                      context_length, kMaxContext);
  }
  if (n_stages < 2 || n_stages > kMaxStages || stage == 0 || stage >= n_stages) {
    return make_error(Code::kCorrupt, "assign stage {} of {} is not a worker stage (1..n_stages-1, n_stages <= {})",
                      stage, n_stages, kMaxStages);
  }
  if (hop_dtype != HopDType::kF32 && hop_dtype != HopDType::kF16) {
    return make_error(Code::kCorrupt, "assign field 'hop_dtype' is {}, expected 0 (f32) or 1 (f16)",
                      static_cast<int>(hop_dtype));
  }
  const auto kv = dtype_info(static_cast<uint32_t>(kv_dtype));
  if (!kv || kv->block_size == 0) {
    return make_error(Code::kCorrupt, "assign field 'kv_dtype' is {}, not a known ggml type id",
                      static_cast<uint32_t>(kv_dtype));
  }
  if (auto addr = parse_address(next_hop); !addr.ok()) {
    return make_error(Code::kCorrupt, "assign field 'next_hop': {}", addr.status().message());
  }
  return Status::Ok();
}

Status Ready::check() const {
  if (!std::isfinite(load_seconds) || load_seconds < 0) {
    return make_error(Code::kCorrupt, "ready field 'load_seconds' is {}", load_seconds);
  }
  return Status::Ok();
}

Status HopOpen::check() const {
  if (from_stage >= kMaxStages) {
    return make_error(Code::kCorrupt, "hop_open field 'from_stage' is {}, limit {}", from_stage, kMaxStages - 1);
  }
  return Status::Ok();
}

Status ErrorMsg::check() const {
  const int c = static_cast<int>(code);
  if (c <= 0 || c > static_cast<int>(Code::kInternal)) {
    return make_error(Code::kCorrupt, "error field 'code' is {}, expected 1..{}", c,
                      static_cast<int>(Code::kInternal));
  }
  return Status::Ok();
}

Status ErrorMsg::to_status(std::string_view from) const {
  return Status(code, fmt::format("{} says: {}", from, message));
}

ErrorMsg ErrorMsg::from(const Status& st) {
  return ErrorMsg{st.ok() ? Code::kInternal : st.code(), printable_text(st.message(), kMaxErrorLen)};
}

template <class T>
std::pair<uint32_t, uint32_t> payload_bounds() {
  SizeVisitor v;
  T t;
  T::fields(t, v);
  return {v.lo, v.hi};
}
template std::pair<uint32_t, uint32_t> payload_bounds<Challenge>();
template std::pair<uint32_t, uint32_t> payload_bounds<Auth>();
template std::pair<uint32_t, uint32_t> payload_bounds<AuthOk>();
template std::pair<uint32_t, uint32_t> payload_bounds<Hello>();
template std::pair<uint32_t, uint32_t> payload_bounds<Assign>();
template std::pair<uint32_t, uint32_t> payload_bounds<Ready>();
template std::pair<uint32_t, uint32_t> payload_bounds<HopOpen>();
template std::pair<uint32_t, uint32_t> payload_bounds<Rewind>();
template std::pair<uint32_t, uint32_t> payload_bounds<Ping>();
template std::pair<uint32_t, uint32_t> payload_bounds<Pong>();
template std::pair<uint32_t, uint32_t> payload_bounds<ErrorMsg>();
template std::pair<uint32_t, uint32_t> payload_bounds<Bye>();
template std::pair<uint32_t, uint32_t> payload_bounds<FrameHeader>();

Message encode_frame(const FrameHeader& h, std::span<const uint8_t> data) {
  Message out{MsgType::kFrame, {}};
  out.payload.reserve(kFrameHeaderSize + data.size());
  PayloadWriter w(out.payload);
  FrameHeader::fields(h, w);
  append_bytes(out.payload, data.data(), data.size());
  return out;
}

int frame_rows(const FrameHeader& h) {
  if (!(h.flags & kFrameRowsKept)) return h.n_tokens;
  return (h.flags & kFrameHeadReadsLast) ? std::min<int>(h.n_tokens, 1) : 0;
}

Result<FrameView> decode_frame(const Message& m, const FrameLimits& limits) {
  if (m.type != MsgType::kFrame) {
    return make_error(Code::kCorrupt, "expected a frame message, got {}", msg_type_name(m.type));
  }
  FrameView f;
  PayloadReader r(m.payload, "frame");
  FrameHeader::fields(f.header, r);
  SHOAL_RETURN_IF_ERROR(r.status());
  const FrameHeader& h = f.header;
  if (h.n_tokens == 0) return make_error(Code::kCorrupt, "frame field 'n_tokens' is 0");
  if (h.kind != FrameKind::kPrefill && h.kind != FrameKind::kDecode && h.kind != FrameKind::kVerify) {
    return make_error(Code::kCorrupt, "frame field 'kind' is {}, expected 0..2", static_cast<int>(h.kind));
  }
  if (const uint8_t unknown = h.flags & uint8_t(~kFrameKnownFlags); unknown != 0) {
    return make_error(Code::kCorrupt, "frame field 'flags' is 0x{:02x}, unknown bits 0x{:02x}", h.flags, unknown);
  }
  const uint8_t reads = h.flags & (kFrameWantAllLogits | kFrameHeadReadsLast | kFrameHeadReadsNone);
  if ((reads & (reads - 1)) != 0) {
    return make_error(Code::kCorrupt,
                      "frame field 'flags' is 0x{:02x}: more than one of bits 0-2 (which rows the head reads)", h.flags);
  }
  if ((h.flags & kFrameRowsKept) && !(reads & (kFrameHeadReadsLast | kFrameHeadReadsNone))) {
    return make_error(Code::kCorrupt,
                      "frame field 'flags' is 0x{:02x}: rows kept (bit 3) without the rows the head reads (bit 1 or 2)",
                      h.flags);
  }
  if (h.dtype != HopDType::kF32 && h.dtype != HopDType::kF16) {
    return make_error(Code::kCorrupt, "frame field 'dtype' is {}, expected 0 (f32) or 1 (f16)",
                      static_cast<int>(h.dtype));
  }
  if (h.reserved != std::array<uint8_t, 3>{}) {
    return make_error(Code::kCorrupt, "frame reserved bytes are not zero");
  }
  if (uint64_t(h.pos) + h.n_tokens > limits.context_length) {
    return make_error(Code::kOutOfRange, "frame positions {}..{} exceed the context length {}", h.pos,
                      uint64_t(h.pos) + h.n_tokens - 1, limits.context_length);
  }
  const int rows = frame_rows(h);
  const uint64_t want = uint64_t(rows) * limits.d_model * hop_dtype_size(h.dtype);
  f.data = r.rest();
  if (f.data.size() != want) {
    return make_error(Code::kCorrupt,
                      "frame carries {} bytes of hidden state; {} {} x {} wide x {} bytes ({}) = {} expected",
                      f.data.size(), rows, (h.flags & kFrameRowsKept) ? "kept rows" : "tokens", limits.d_model,
                      hop_dtype_size(h.dtype), hop_dtype_name(h.dtype), want);
  }
  return f;
}

}  // namespace shoal::pool
