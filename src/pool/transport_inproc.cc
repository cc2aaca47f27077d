#include "pool/transport_inproc.h"

#include <condition_variable>
#include <cstring>
#include <deque>

#include "pool/address.h"
#include "pool/byte_io.h"

namespace shoal::pool {
namespace {

// One direction: a bounded byte queue.
struct Pipe {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint8_t> buf;
  size_t head = 0;  // first unread byte
  size_t capacity = 0;
  bool closed = false;
  size_t size() const { return buf.size() - head; }
};

class PipeStream : public ByteStream {
 public:
  PipeStream(std::shared_ptr<Pipe> in, std::shared_ptr<Pipe> out, std::string peer, std::string local)
      : in_(std::move(in)), out_(std::move(out)), peer_(std::move(peer)), local_(std::move(local)) {}
  ~PipeStream() override { close(); }

  Result<size_t> read_some(std::span<uint8_t> buf, Clock::time_point deadline) override {
    std::unique_lock lock(in_->mu);
    if (!in_->cv.wait_until(lock, deadline, [&] { return in_->size() > 0 || in_->closed; })) {
      return make_error(Code::kDeadlineExceeded, "nothing from {} in time", peer_);
    }
    if (in_->size() == 0) return make_error(Code::kUnavailable, "{} closed the connection", peer_);
    const size_t n = std::min(buf.size(), in_->size());
    std::memcpy(buf.data(), in_->buf.data() + in_->head, n);
    in_->head += n;
    if (in_->head == in_->buf.size()) in_->buf.clear(), in_->head = 0;
    in_->cv.notify_all();  // room for the writer
    return n;
  }

  Status write_all(std::span<const std::span<const uint8_t>> parts, Clock::time_point deadline) override {
    std::unique_lock lock(out_->mu);
    for (auto part : parts) {
      while (!part.empty()) {
        if (!out_->cv.wait_until(lock, deadline,
                                 [&] { return out_->closed || out_->size() < out_->capacity; })) {
          return make_error(Code::kDeadlineExceeded, "{} is not reading", peer_);
        }
        if (out_->closed) return make_error(Code::kUnavailable, "{} closed the connection", peer_);
        const size_t n = std::min(part.size(), out_->capacity - out_->size());
        append_bytes(out_->buf, part.data(), n);
        part = part.subspan(n);
        out_->cv.notify_all();
      }
    }
    return Status::Ok();
  }

  void close() override {
    for (Pipe* p : {in_.get(), out_.get()}) {
      std::lock_guard lock(p->mu);
      p->closed = true;
      p->cv.notify_all();
    }
  }

  std::string peer() const override { return peer_; }
  std::string local() const override { return local_; }

 private:
  std::shared_ptr<Pipe> in_;
  std::shared_ptr<Pipe> out_;
  std::string peer_;
  std::string local_;
};

}  // namespace

std::pair<std::unique_ptr<ByteStream>, std::unique_ptr<ByteStream>> make_pipe_pair(
    std::string name_a, std::string name_b, size_t capacity) {
  auto ab = std::make_shared<Pipe>();
  auto ba = std::make_shared<Pipe>();
  ab->capacity = ba->capacity = capacity;
  // Stream a reads what b writes; its peer is b.
  return {std::make_unique<PipeStream>(ba, ab, name_b, name_a), std::make_unique<PipeStream>(ab, ba, name_a, name_b)};
}

std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> make_connection_pair(
    ConnectionOptions opts) {
  auto [a, b] = make_pipe_pair("in-process a", "in-process b");
  return {std::make_unique<Connection>(std::move(a), opts), std::make_unique<Connection>(std::move(b), opts)};
}

// Shared between the listener object and the network's registry.
class InProcessListenerState {
 public:
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::unique_ptr<ByteStream>> pending;
  bool closed = false;
};

namespace {

class InProcessListener : public Listener {
 public:
  InProcessListener(std::shared_ptr<InProcessListenerState> state, std::string address,
                    ConnectionOptions opts)
      : state_(std::move(state)), address_(std::move(address)), opts_(opts) {}
  ~InProcessListener() override { close(); }

  Result<std::unique_ptr<Connection>> accept(Millis timeout) override {
    std::unique_lock lock(state_->mu);
    if (!state_->cv.wait_for(lock, timeout, [&] { return !state_->pending.empty() || state_->closed; })) {
      return make_error(Code::kDeadlineExceeded, "no connection to {} within {} ms", address_, timeout.count());
    }
    if (state_->closed) return make_error(Code::kUnavailable, "listener on {} is closed", address_);
    auto stream = std::move(state_->pending.front());
    state_->pending.pop_front();
    return std::make_unique<Connection>(std::move(stream), opts_);
  }

  std::string address() const override { return address_; }

  void close() override {
    std::lock_guard lock(state_->mu);
    state_->closed = true;
    state_->pending.clear();  // their peers see the connection close
    state_->cv.notify_all();
  }

 private:
  std::shared_ptr<InProcessListenerState> state_;
  std::string address_;
  ConnectionOptions opts_;
};

}  // namespace

Result<std::unique_ptr<Listener>> InProcessNetwork::listen(std::string_view address, ConnectionOptions opts) {
  SHOAL_ASSIGN_OR_RETURN(Address a, parse_address(address, /*allow_port_zero=*/true));
  std::lock_guard lock(mu_);
  if (a.port == 0) a.port = next_port_++;
  const std::string key = a.to_string();
  auto& slot = listeners_[key];
  if (auto live = slot.lock(); live && !live->closed) {
    return make_error(Code::kUnavailable, "in-process address {} is already in use", key);
  }
  auto state = std::make_shared<InProcessListenerState>();
  slot = state;
  return std::unique_ptr<Listener>(std::make_unique<InProcessListener>(state, key, opts));
}

Result<std::unique_ptr<ByteStream>> InProcessNetwork::connect_raw(std::string_view address) {
  SHOAL_ASSIGN_OR_RETURN(Address a, parse_address(address));
  const std::string key = a.to_string();
  std::lock_guard lock(mu_);
  auto it = listeners_.find(key);
  std::shared_ptr<InProcessListenerState> state = it == listeners_.end() ? nullptr : it->second.lock();
  if (!state) return make_error(Code::kUnavailable, "nothing listens on {} (in-process)", key);
  const uint64_t id = next_id_++;
  auto [client, server] = make_pipe_pair(fmt::format("in-process client #{}", id),
                                         fmt::format("in-process {}", key), pipe_capacity_);
  std::lock_guard slock(state->mu);
  if (state->closed) return make_error(Code::kUnavailable, "nothing listens on {} (in-process)", key);
  state->pending.push_back(std::move(server));
  state->cv.notify_all();
  return std::move(client);
}

Result<std::unique_ptr<Connection>> InProcessNetwork::connect(std::string_view address, Millis,
                                                              ConnectionOptions opts) {
  SHOAL_ASSIGN_OR_RETURN(auto stream, connect_raw(address));
  return std::make_unique<Connection>(std::move(stream), opts);
}

}  // namespace shoal::pool
