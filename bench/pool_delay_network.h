// Latency injection for pool benchmarks where the kernel has no netem qdisc: a Network whose every
// listener sits behind a userspace TCP proxy that holds each byte for `delay` in each direction.
// Every connection of the pool ends at some listener (the host's room, a worker's hop listener),
// so every hop and every control link gets `delay` one way, like `tc qdisc add ... netem delay`
// on the receiving side. Bytes are timestamped on arrival and released when due, so throughput is
// not limited, only latency added.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pool/address.h"
#include "pool/transport.h"

namespace shoal::bench {

using SteadyClock = std::chrono::steady_clock;

/// One direction of a proxied connection: reads `from`, writes `to` each chunk `delay` later.
class DelayPipe {
 public:
  DelayPipe(int from, int to, std::chrono::microseconds delay) : from_(from), to_(to), delay_(delay) {
    reader_ = std::thread([this] { read_loop(); });
    writer_ = std::thread([this] { write_loop(); });
  }
  ~DelayPipe() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    shutdown(from_, SHUT_RDWR);
    reader_.join();
    writer_.join();
  }

 private:
  struct Chunk {
    SteadyClock::time_point due;
    std::vector<char> bytes;  // empty: end of stream
  };
  void read_loop() {
    std::vector<char> buf(64 * 1024);
    for (;;) {
      const ssize_t n = read(from_, buf.data(), buf.size());
      std::lock_guard lock(mu_);
      queue_.push_back({SteadyClock::now() + delay_, n > 0 ? std::vector<char>(buf.begin(), buf.begin() + n) : std::vector<char>{}});
      cv_.notify_all();
      if (n <= 0) return;
    }
  }
  void write_loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const auto due = queue_.front().due;
      if (cv_.wait_until(lock, due, [&] { return stop_.load(); })) return;
      Chunk c = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      if (c.bytes.empty()) {
        shutdown(to_, SHUT_WR);
        return;
      }
      for (size_t off = 0; off < c.bytes.size();) {
        const ssize_t w = write(to_, c.bytes.data() + off, c.bytes.size() - off);
        if (w <= 0) return;
        off += size_t(w);
      }
      lock.lock();
    }
  }
  int from_, to_;
  std::chrono::microseconds delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk> queue_;
  std::atomic<bool> stop_{false};
  std::thread reader_, writer_;
};

/// Listens on 127.0.0.1 and forwards every connection to `target_port` on 127.0.0.1.
class DelayProxy {
 public:
  DelayProxy(uint16_t target_port, std::chrono::microseconds delay) : target_port_(target_port), delay_(delay) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    listen(fd_, 64);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { accept_loop(); });
  }
  ~DelayProxy() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
    std::lock_guard lock(mu_);
    for (auto& c : conns_) {
      c.a_to_b.reset();
      c.b_to_a.reset();
      close(c.a);
      close(c.b);
    }
  }
  uint16_t port() const { return port_; }

 private:
  struct Conn {
    int a = -1, b = -1;
    std::unique_ptr<DelayPipe> a_to_b, b_to_a;
  };
  void accept_loop() {
    while (!stop_) {
      const int a = accept(fd_, nullptr, nullptr);
      if (a < 0) return;
      const int b = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in t{};
      t.sin_family = AF_INET;
      t.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      t.sin_port = htons(target_port_);
      if (connect(b, reinterpret_cast<sockaddr*>(&t), sizeof t) != 0) {
        close(a);
        close(b);
        continue;
      }
      const int one = 1;
      setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      setsockopt(b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard lock(mu_);
      Conn& c = conns_.emplace_back();
      c.a = a;
      c.b = b;
      c.a_to_b = std::make_unique<DelayPipe>(a, b, delay_);
      c.b_to_a = std::make_unique<DelayPipe>(b, a, delay_);
    }
  }
  uint16_t target_port_;
  std::chrono::microseconds delay_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::list<Conn> conns_;
  std::thread thread_;
};

/// A listener reached through a DelayProxy: address() is the proxy's.
class DelayedListener : public pool::Listener {
 public:
  DelayedListener(std::unique_ptr<pool::Listener> inner, std::unique_ptr<DelayProxy> proxy)
      : inner_(std::move(inner)), proxy_(std::move(proxy)) {}
  Result<std::unique_ptr<pool::Connection>> accept(pool::Millis timeout) override { return inner_->accept(timeout); }
  std::string address() const override { return "127.0.0.1:" + std::to_string(proxy_->port()); }
  void close() override { inner_->close(); }

 private:
  std::unique_ptr<pool::Listener> inner_;
  std::unique_ptr<DelayProxy> proxy_;
};

/// Loopback TCP with `delay` added one way on every connection (listeners on 127.0.0.1 only).
class DelayNetwork : public pool::Network {
 public:
  DelayNetwork(pool::Network& inner, std::chrono::microseconds delay) : inner_(inner), delay_(delay) {}
  Result<std::unique_ptr<pool::Listener>> listen(std::string_view address, pool::ConnectionOptions opts) override {
    SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<pool::Listener> l, inner_.listen(address, opts));
    SHOAL_ASSIGN_OR_RETURN(pool::Address a, pool::parse_address(l->address(), true));
    if (a.host != "127.0.0.1") return make_error(Code::kInvalidArgument, "the delay network is loopback only");
    auto proxy = std::make_unique<DelayProxy>(a.port, delay_);
    return std::unique_ptr<pool::Listener>(new DelayedListener(std::move(l), std::move(proxy)));
  }
  Result<std::unique_ptr<pool::Connection>> connect(std::string_view address, pool::Millis timeout,
                                                    pool::ConnectionOptions opts) override {
    return inner_.connect(address, timeout, opts);
  }

 private:
  pool::Network& inner_;
  std::chrono::microseconds delay_;
};

}  // namespace shoal::bench
