// Pool wire figures: CRC-32C and record decode throughput, and the round trip of one hidden-state
// frame over TCP loopback through Connection and through Link (heartbeats on). A hop of the chain
// costs about half a round trip plus the link's own latency.
//   pool_wire_bench [--d-model 5120] [--tokens 1] [--laps 2000]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "core/log.h"
#include "pool/crc32c.h"
#include "pool/link.h"
#include "pool/messages.h"
#include "pool/transport_tcp.h"

using namespace shoal::pool;
using namespace std::chrono_literals;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Median and 99th percentile of round trips, microseconds.
void report(const char* what, std::vector<double>& us, size_t bytes) {
  std::sort(us.begin(), us.end());
  std::printf("%-34s %8zu B  median %7.1f us  p99 %7.1f us  (%zu laps)\n", what, bytes, us[us.size() / 2],
              us[us.size() * 99 / 100], us.size());
}

template <class Send, class Recv>
std::vector<double> ping_pong(Send send, Recv recv, const Message& m, int laps) {
  std::vector<double> us;
  for (int i = 0; i < laps; ++i) {
    const auto t0 = Clock::now();
    if (!send(m).ok() || !recv().ok()) break;
    us.push_back(seconds_since(t0) * 1e6);
  }
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pool wire benchmark"};
  uint32_t d_model = 5120;
  uint16_t tokens = 1;
  int laps = 2000;
  app.add_option("--d-model", d_model, "hidden-state width")->capture_default_str();
  app.add_option("--tokens", tokens, "tokens per frame")->capture_default_str();
  app.add_option("--laps", laps, "round trips to time")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  shoal::init_logging("error");

  std::vector<uint8_t> buf(64 << 20, 0x5A);
  auto t0 = Clock::now();
  uint32_t crc = 0;
  for (int i = 0; i < 8; ++i) crc = crc32c_extend(crc, buf.data(), buf.size());
  std::printf("crc32c                             %8.2f GB/s (%08x)\n", 8.0 * buf.size() / seconds_since(t0) / 1e9, crc);
  t0 = Clock::now();
  for (int i = 0; i < 2; ++i) crc = crc32c_extend_portable(crc, buf.data(), buf.size());
  std::printf("crc32c, table path                 %8.2f GB/s\n", 2.0 * buf.size() / seconds_since(t0) / 1e9);

  FrameHeader h;
  h.n_tokens = tokens;
  h.dtype = HopDType::kF16;
  const Message frame = encode_frame(h, std::vector<uint8_t>(size_t(tokens) * d_model * 2, 1));
  const std::vector<uint8_t> rec = encode_record(frame);
  t0 = Clock::now();
  const int n_dec = 20000;
  for (int i = 0; i < n_dec; ++i) {
    RecordDecoder d;
    d.feed(rec);
    auto m = d.next();
    if (!m.ok() || !decode_frame(**m, FrameLimits{d_model, 1u << 20}).ok()) return 1;
  }
  std::printf("record + frame decode              %8.2f GB/s (%zu B records)\n",
              double(n_dec) * rec.size() / seconds_since(t0) / 1e9, rec.size());

  auto listener = tcp_network().listen(":0");
  auto client = tcp_network().connect((*listener)->address(), 2s);
  auto server = (*listener)->accept(2s);
  if (!client.ok() || !server.ok()) return 1;
  std::thread echo([&] {
    for (;;) {
      auto m = (*server)->recv(5s);
      if (!m.ok() || !(*server)->send(*m).ok()) return;
    }
  });
  auto us = ping_pong([&](const Message& m) { return (*client)->send(m); }, [&] { return (*client)->recv(5s); },
                      frame, laps);
  report("tcp loopback round trip, Connection", us, frame.payload.size());
  (*client)->close();
  echo.join();

  auto c2 = tcp_network().connect((*listener)->address(), 2s);
  auto s2 = (*listener)->accept(2s);
  Link a(std::move(*c2), LinkOptions{"server", 500ms, 2000ms, {}});
  Link b(std::move(*s2), LinkOptions{"client", 500ms, 2000ms, {}});
  std::thread echo2([&] {
    for (;;) {
      auto m = b.recv(5s);
      if (!m.ok() || !b.send(*m).ok()) return;
    }
  });
  us = ping_pong([&](const Message& m) { return a.send(m); }, [&] { return a.recv(5s); }, frame, laps);
  report("tcp loopback round trip, Link", us, frame.payload.size());
  a.close("done");
  echo2.join();
  return 0;
}
