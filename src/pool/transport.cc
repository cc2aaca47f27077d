#include "pool/transport.h"

#include "core/log.h"
#include "pool/messages.h"

namespace shoal::pool {
namespace {
constexpr size_t kReadChunk = 64 * 1024;
constexpr Millis kErrorNoticeTimeout{200};  // how long we try to tell a bad peer why it is dropped
}  // namespace

Connection::Connection(std::unique_ptr<ByteStream> stream, ConnectionOptions opts)
    : stream_(std::move(stream)),
      opts_(opts),
      peer_(stream_->peer()),
      decoder_(opts.max_payload),
      rx_buf_(kReadChunk) {}

Connection::~Connection() { close(); }

bool Connection::is_closed() const {
  std::lock_guard lock(state_mu_);
  return closed_;
}

void Connection::close() {
  {
    std::lock_guard lock(state_mu_);
    closed_ = true;
  }
  stream_->close();
}

Status Connection::send(const Message& m) {
  if (m.payload.size() > opts_.max_payload) {
    return make_error(Code::kInvalidArgument, "{} message of {} bytes to {} is over the limit of {} bytes",
                      msg_type_name(m.type), m.payload.size(), peer_, opts_.max_payload);
  }
  std::lock_guard lock(send_mu_);
  if (is_closed()) return make_error(Code::kUnavailable, "connection to {} is closed", peer_);
  const RecordFraming f = frame_record(m.type, m.payload);
  const std::span<const uint8_t> parts[3] = {f.header, m.payload, f.trailer};
  Status st = stream_->write_all(parts, Clock::now() + opts_.send_timeout);
  if (st.ok()) return st;
  if (st.code() == Code::kDeadlineExceeded) {
    close();  // part of a record may have gone out: the stream cannot be used again
    return make_error(Code::kUnavailable, "{} took no bytes for {} ms (sending {}); connection closed",
                      peer_, opts_.send_timeout.count(), msg_type_name(m.type));
  }
  // The peer is gone; what it sent before leaving (a bye, an error) can still be received.
  return make_error(Code::kUnavailable, "sending {} to {}: {}", msg_type_name(m.type), peer_, st.message());
}

void Connection::fail(const Status& why) {
  spdlog::debug("closing the connection: {}", why.to_string());  // callers (Room, Link) log it
  recv_error_ = why;
  // Tell the peer why, briefly and best effort: it may be a port scanner or a dead process.
  Message notice = encode(ErrorMsg::from(why));
  const RecordFraming f = frame_record(notice.type, notice.payload);
  const std::span<const uint8_t> parts[3] = {f.header, notice.payload, f.trailer};
  {
    std::lock_guard lock(send_mu_);
    if (!is_closed()) (void)stream_->write_all(parts, Clock::now() + kErrorNoticeTimeout);
  }
  close();
}

Result<Message> Connection::recv(Millis timeout) {
  if (!recv_error_.ok()) {
    return make_error(Code::kUnavailable, "connection from {} was closed: {}", peer_, recv_error_.message());
  }
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    auto next = decoder_.next();
    if (!next.ok()) {
      const Status why = next.status().with_context(fmt::format("from {}", peer_));
      fail(why);
      return why;
    }
    if (next->has_value()) return std::move(**next);
    if (is_closed()) return make_error(Code::kUnavailable, "connection to {} is closed", peer_);
    auto n = stream_->read_some(rx_buf_, deadline);
    if (!n.ok()) {
      if (n.status().code() == Code::kDeadlineExceeded) {
        return make_error(Code::kDeadlineExceeded, "no message from {} within {} ms", peer_, timeout.count());
      }
      close();
      if (decoder_.buffered() > 0) {
        return make_error(Code::kUnavailable, "{} (inside a record, {} bytes of it received)",
                          n.status().message(), decoder_.buffered());
      }
      return n.status();
    }
    decoder_.feed(std::span<const uint8_t>(rx_buf_.data(), *n));
  }
}

}  // namespace shoal::pool
