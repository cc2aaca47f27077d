// libFuzzer target for the pool's wire: random bytes go (1) through the incremental record decoder
// in chunks the input chooses, every message it yields through its payload codec, and (2) straight
// into the payload codec of the type the input picks. When the input asks, the harness first
// rewrites each record's checksum, so mutated payloads get past the CRC into the codecs. Whatever
// decodes must encode back to the same bytes. Any crash, sanitizer report or trap is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "pool/crc32c.h"
#include "pool/messages.h"
#include "pool/wire.h"

namespace {

using namespace shoal::pool;

template <class T>
void check_codec(const Message& m) {
  auto r = decode<T>(m);
  if (r.ok() && encode(*r).payload != m.payload) std::abort();  // decode must be exact
}

void check_frame(const Message& m, uint32_t d_model, uint32_t context) {
  auto f = decode_frame(m, FrameLimits{d_model, context});
  if (!f.ok()) return;
  const size_t rows = size_t(frame_rows(f->header));
  if (rows > f->header.n_tokens || f->data.size() != rows * d_model * hop_dtype_size(f->header.dtype)) std::abort();
  if (encode_frame(f->header, f->data).payload != m.payload) std::abort();
}

void check_payload(const Message& m, uint32_t d_model, uint32_t context) {
  check_codec<Challenge>(m);
  check_codec<Auth>(m);
  check_codec<AuthOk>(m);
  check_codec<Hello>(m);
  check_codec<Assign>(m);
  check_codec<Ready>(m);
  check_codec<HopOpen>(m);
  check_codec<Rewind>(m);
  check_codec<Ping>(m);
  check_codec<Pong>(m);
  check_codec<ErrorMsg>(m);
  check_codec<Bye>(m);
  check_frame(m, d_model, context);
}

// Walks the records the header lengths describe and stores the right CRC-32C after each one.
void fix_checksums(std::vector<uint8_t>& b) {
  size_t at = 0;
  while (b.size() - at >= kRecordHeaderSize) {
    const uint8_t* h = b.data() + at;
    const size_t len = size_t(h[12]) | size_t(h[13]) << 8 | size_t(h[14]) << 16 | size_t(h[15]) << 24;
    if (len > b.size() - at - kRecordHeaderSize || b.size() - at - kRecordHeaderSize - len < kRecordTrailerSize) return;
    const uint32_t crc = crc32c(h, kRecordHeaderSize + len);
    for (int i = 0; i < 4; ++i) b[at + kRecordHeaderSize + len + i] = uint8_t(crc >> (8 * i));
    at += kRecordHeaderSize + len + kRecordTrailerSize;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const bool fix_crc = (data[0] & 0x80) != 0;
  const size_t chunk = (data[0] & 0x7F) == 0 ? 1 : (data[0] & 0x7F);  // feed size
  const uint32_t d_model = 1u + data[1] % 16u;
  const uint32_t context = 1u + data[2] * 64u;
  const uint8_t type = uint8_t(1 + data[3] % 13);
  std::vector<uint8_t> bytes(data + 4, data + size);
  if (fix_crc) fix_checksums(bytes);
  const std::span<const uint8_t> rest(bytes);

  // (1) the record layer, fed piecewise, with a small limit so the length checks are reached.
  RecordDecoder dec(/*max_payload=*/4096);
  for (size_t off = 0; off < rest.size(); off += chunk) {
    dec.feed(rest.subspan(off, std::min<size_t>(chunk, rest.size() - off)));
    for (;;) {
      auto m = dec.next();
      if (!m.ok() || !m->has_value()) break;
      check_payload(**m, d_model, context);
    }
  }
  // (2) the same bytes as the payload of the message type data[3] picks.
  Message direct{static_cast<MsgType>(type), std::vector<uint8_t>(rest.begin(), rest.end())};
  check_payload(direct, d_model, context);
  return 0;
}
