#include "pool/transport_tcp.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <asio.hpp>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/check.h"
#include "core/log.h"
#include "pool/address.h"

namespace shoal::pool {
namespace {

using asio::ip::tcp;

// Never run (every operation is synchronous) and never destroyed, so sockets may outlive statics.
asio::io_context& io() {
  static auto* ctx = new asio::io_context(1);
  return *ctx;
}

std::string endpoint_string(const tcp::endpoint& ep) {
  return Address{ep.address().to_string(), ep.port()}.to_string();
}

// Milliseconds poll() should wait to reach `deadline` (rounded up, at least 0).
int poll_ms(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  return static_cast<int>(std::chrono::ceil<Millis>(left).count());
}

// Waits for `events` on fd (and for `wake_fd` when >= 0). Returns the fd's revents; 0 on deadline.
Result<short> wait_fd(int fd, short events, Clock::time_point deadline, int wake_fd = -1) {
  for (;;) {
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int r = ::poll(fds, wake_fd >= 0 ? 2 : 1, poll_ms(deadline));
    if (r < 0) {
      if (errno == EINTR) continue;
      return make_error(Code::kIoError, "poll: {}", std::strerror(errno));
    }
    if (wake_fd >= 0 && (fds[1].revents & POLLIN)) return short(-1);
    return fds[0].revents;
  }
}

class TcpStream : public ByteStream {
 public:
  TcpStream(tcp::socket socket, std::string peer) : socket_(std::move(socket)), peer_(std::move(peer)) {
    asio::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    socket_.set_option(asio::socket_base::keep_alive(true), ec);
    socket_.non_blocking(true, ec);
    fd_ = socket_.native_handle();
    const tcp::endpoint me = socket_.local_endpoint(ec);
    local_ = ec ? std::string("unknown") : endpoint_string(me);
  }
  ~TcpStream() override {
    asio::error_code ec;
    socket_.close(ec);
  }

  Result<size_t> read_some(std::span<uint8_t> buf, Clock::time_point deadline) override {
    for (;;) {
      if (closed_.load()) return make_error(Code::kUnavailable, "connection to {} is closed", peer_);
      const ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
      if (n > 0) return static_cast<size_t>(n);
      if (n == 0) {
        if (closed_.load()) return make_error(Code::kUnavailable, "connection to {} is closed", peer_);
        return make_error(Code::kUnavailable, "{} closed the connection", peer_);
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return make_error(Code::kUnavailable, "reading from {}: {}", peer_, std::strerror(errno));
      }
      SHOAL_ASSIGN_OR_RETURN(short ev, wait_fd(fd_, POLLIN, deadline));
      if (ev == 0) return make_error(Code::kDeadlineExceeded, "nothing from {} in time", peer_);
    }
  }

  Status write_all(std::span<const std::span<const uint8_t>> parts, Clock::time_point deadline) override {
    constexpr size_t kMaxParts = 8;
    SHOAL_CHECK(parts.size() <= kMaxParts);
    iovec iov[kMaxParts];
    size_t n_iov = 0;
    for (auto p : parts) {
      if (!p.empty()) iov[n_iov++] = {const_cast<uint8_t*>(p.data()), p.size()};
    }
    size_t first = 0;
    while (first < n_iov) {
      if (closed_.load()) return make_error(Code::kUnavailable, "connection to {} is closed", peer_);
      msghdr msg{};
      msg.msg_iov = iov + first;
      msg.msg_iovlen = n_iov - first;
      ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          return make_error(Code::kUnavailable, "writing to {}: {}", peer_, std::strerror(errno));
        }
        SHOAL_ASSIGN_OR_RETURN(short ev, wait_fd(fd_, POLLOUT, deadline));
        if (ev == 0) return make_error(Code::kDeadlineExceeded, "{} is not reading", peer_);
        continue;
      }
      auto left = static_cast<size_t>(n);
      while (first < n_iov && left >= iov[first].iov_len) left -= iov[first++].iov_len;
      if (first < n_iov) {
        iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
      }
    }
    return Status::Ok();
  }

  void close() override {
    if (closed_.exchange(true)) return;
    ::shutdown(fd_, SHUT_RDWR);  // wakes poll() in both directions; the fd is closed on destruction
  }

  std::string peer() const override { return peer_; }
  std::string local() const override { return local_; }

 private:
  tcp::socket socket_;
  std::string peer_;
  std::string local_;
  int fd_ = -1;
  std::atomic<bool> closed_{false};
};

class TcpListener : public Listener {
 public:
  TcpListener(tcp::acceptor acceptor, ConnectionOptions opts)
      : acceptor_(std::move(acceptor)), opts_(opts), wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    asio::error_code ec;
    const tcp::endpoint ep = acceptor_.local_endpoint(ec);
    address_ = endpoint_string(ep);
  }
  ~TcpListener() override {
    close();
    asio::error_code ec;
    acceptor_.close(ec);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  Result<std::unique_ptr<Connection>> accept(Millis timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (closed_.load()) return make_error(Code::kUnavailable, "listener on {} is closed", address_);
      tcp::socket socket(io());
      asio::error_code ec;
      acceptor_.accept(socket, ec);
      if (!ec) {
        tcp::endpoint remote = socket.remote_endpoint(ec);
        std::string peer = ec ? std::string("unknown peer") : endpoint_string(remote);
        return std::make_unique<Connection>(std::make_unique<TcpStream>(std::move(socket), std::move(peer)), opts_);
      }
      if (ec != asio::error::would_block && ec != asio::error::try_again &&
          ec != asio::error::connection_aborted && ec != asio::error::interrupted) {
        return make_error(Code::kIoError, "accept on {}: {}", address_, ec.message());
      }
      SHOAL_ASSIGN_OR_RETURN(short ev, wait_fd(acceptor_.native_handle(), POLLIN, deadline, wake_fd_));
      if (ev == 0) {
        return make_error(Code::kDeadlineExceeded, "no connection to {} within {} ms", address_, timeout.count());
      }
    }
  }

  std::string address() const override { return address_; }

  void close() override {
    if (closed_.exchange(true)) return;
    const uint64_t one = 1;
    if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof one);
  }

 private:
  tcp::acceptor acceptor_;
  ConnectionOptions opts_;
  int wake_fd_;
  std::string address_;
  std::atomic<bool> closed_{false};
};

Result<std::vector<tcp::endpoint>> resolve(const Address& a) {
  asio::error_code ec;
  tcp::resolver resolver(io());
  auto results = resolver.resolve(a.host, std::to_string(a.port), tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return make_error(Code::kUnavailable, "cannot resolve {}: {}", a.to_string(),
                      ec ? ec.message() : std::string("no addresses"));
  }
  std::vector<tcp::endpoint> out;
  for (const auto& r : results) out.push_back(r.endpoint());
  return out;
}

// Connects one endpoint without blocking past the deadline.
Result<tcp::socket> connect_endpoint(const tcp::endpoint& ep, Clock::time_point deadline) {
  tcp::socket socket(io());
  asio::error_code ec;
  socket.open(ep.protocol(), ec);
  if (!ec) socket.non_blocking(true, ec);
  if (ec) return make_error(Code::kIoError, "socket for {}: {}", endpoint_string(ep), ec.message());
  const int fd = socket.native_handle();
  if (::connect(fd, ep.data(), static_cast<socklen_t>(ep.size())) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      return make_error(Code::kUnavailable, "connecting to {}: {}", endpoint_string(ep), std::strerror(errno));
    }
    SHOAL_ASSIGN_OR_RETURN(short ev, wait_fd(fd, POLLOUT, deadline));
    if (ev == 0) return make_error(Code::kUnavailable, "connecting to {}: no answer in time", endpoint_string(ep));
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      return make_error(Code::kUnavailable, "connecting to {}: {}", endpoint_string(ep), std::strerror(err));
    }
  }
  return socket;
}

class TcpNetwork : public Network {
 public:
  Result<std::unique_ptr<Listener>> listen(std::string_view address, ConnectionOptions opts) override {
    SHOAL_ASSIGN_OR_RETURN(Address a, parse_address(address, /*allow_port_zero=*/true));
    SHOAL_ASSIGN_OR_RETURN(auto endpoints, resolve(a));
    const tcp::endpoint ep = endpoints.front();
    tcp::acceptor acceptor(io());
    asio::error_code ec;
    acceptor.open(ep.protocol(), ec);
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(ep, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) acceptor.non_blocking(true, ec);
    if (ec) return make_error(Code::kUnavailable, "cannot listen on {}: {}", a.to_string(), ec.message());
    auto listener = std::make_unique<TcpListener>(std::move(acceptor), opts);
    spdlog::debug("listening on {}", listener->address());
    return std::unique_ptr<Listener>(std::move(listener));
  }

  Result<std::unique_ptr<Connection>> connect(std::string_view address, Millis timeout,
                                              ConnectionOptions opts) override {
    SHOAL_ASSIGN_OR_RETURN(Address a, parse_address(address));
    SHOAL_ASSIGN_OR_RETURN(auto endpoints, resolve(a));
    const auto deadline = Clock::now() + timeout;
    Status last;
    for (const auto& ep : endpoints) {
      auto socket = connect_endpoint(ep, deadline);
      if (socket.ok()) {
        return std::make_unique<Connection>(
            std::make_unique<TcpStream>(std::move(*socket), endpoint_string(ep)), opts);
      }
      last = socket.status();
    }
    return last;
  }
};

}  // namespace

Network& tcp_network() {
  static auto* net = new TcpNetwork;
  return *net;
}

}  // namespace shoal::pool
