#include "pool/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "core/check.h"
#include "core/log.h"

namespace shoal::pool {
namespace {

bool macs_equal(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

// Receives the next message; an ERROR from the peer becomes its Status.
Result<Message> recv_expecting(Connection& conn, MsgType want, Millis timeout) {
  SHOAL_ASSIGN_OR_RETURN(Message m, conn.recv(timeout));
  if (m.type == MsgType::kError) {
    SHOAL_ASSIGN_OR_RETURN(ErrorMsg e, decode<ErrorMsg>(m));
    conn.close();
    return e.to_status(conn.peer());
  }
  if (m.type != want) {
    Status st = make_error(Code::kCorrupt, "{} sent {} during the handshake, expected {}", conn.peer(),
                           msg_type_name(m.type), msg_type_name(want));
    (void)conn.send(encode(ErrorMsg::from(st)));
    conn.close();
    return st;
  }
  return m;
}

// Tells the peer why and closes; returns `st`.
Status refuse(Connection& conn, const Status& st, std::string_view told) {
  (void)conn.send(encode(ErrorMsg::from(Status(st.code(), std::string(told)))));
  conn.close();
  return st;
}

}  // namespace

Nonce random_nonce() {
  Nonce n;
  SHOAL_CHECK(RAND_bytes(n.data(), static_cast<int>(n.size())) == 1, "RAND_bytes failed");
  return n;
}

Mac auth_mac(std::string_view secret, std::string_view label, const Nonce& server_nonce,
             const Nonce& client_nonce, uint16_t version, PeerRole role) {
  std::vector<uint8_t> msg;
  const uint8_t tail[3] = {uint8_t(version), uint8_t(version >> 8), static_cast<uint8_t>(role)};
  append_bytes(msg, label.data(), label.size());
  append_bytes(msg, server_nonce.data(), server_nonce.size());
  append_bytes(msg, client_nonce.data(), client_nonce.size());
  append_bytes(msg, tail, sizeof tail);
  Mac out{};
  unsigned int len = 0;
  const uint8_t* r = HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg.data(),
                          msg.size(), out.data(), &len);
  SHOAL_CHECK(r != nullptr && len == out.size(), "HMAC-SHA256 failed");
  return out;
}

Result<PeerRole> auth_server(Connection& conn, std::string_view secret, Millis timeout) {
  if (secret.empty()) return make_error(Code::kInvalidArgument, "the room secret is empty");
  const auto deadline = Clock::now() + timeout;
  auto left = [&] { return std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now())); };
  Challenge ch{random_nonce()};
  SHOAL_RETURN_IF_ERROR(conn.send(encode(ch)));
  auto m = recv_expecting(conn, MsgType::kAuth, left());
  if (!m.ok()) {
    if (m.status().code() == Code::kDeadlineExceeded) {
      conn.close();
      return make_error(Code::kDeadlineExceeded, "{} did not answer the challenge within {} ms", conn.peer(),
                        timeout.count());
    }
    return m.status();
  }
  auto auth = decode<Auth>(*m);
  if (!auth.ok()) return refuse(conn, auth.status(), auth.status().message());
  const Mac want = auth_mac(secret, kClientLabel, ch.server_nonce, auth->client_nonce, kProtocolVersion, auth->role);
  if (!macs_equal(want, auth->mac)) {
    return refuse(conn,
                  make_error(Code::kPermissionDenied, "{} ({}) answered the challenge with a wrong room secret",
                             conn.peer(), peer_role_name(auth->role)),
                  "wrong room secret");
  }
  const Mac proof = auth_mac(secret, kServerLabel, ch.server_nonce, auth->client_nonce, kProtocolVersion, auth->role);
  SHOAL_RETURN_IF_ERROR(conn.send(encode(AuthOk{proof})));
  return auth->role;
}

Status auth_client(Connection& conn, std::string_view secret, PeerRole role, Millis timeout) {
  if (secret.empty()) return make_error(Code::kInvalidArgument, "the room secret is empty");
  const auto deadline = Clock::now() + timeout;
  auto left = [&] { return std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now())); };
  SHOAL_ASSIGN_OR_RETURN(Message m, recv_expecting(conn, MsgType::kChallenge, left()));
  auto ch = decode<Challenge>(m);
  if (!ch.ok()) return refuse(conn, ch.status(), ch.status().message());
  Auth auth{role, random_nonce(), {}};
  auth.mac = auth_mac(secret, kClientLabel, ch->server_nonce, auth.client_nonce, kProtocolVersion, role);
  SHOAL_RETURN_IF_ERROR(conn.send(encode(auth)));
  SHOAL_ASSIGN_OR_RETURN(Message reply, recv_expecting(conn, MsgType::kAuthOk, left()));
  auto ok = decode<AuthOk>(reply);
  if (!ok.ok()) return refuse(conn, ok.status(), ok.status().message());
  const Mac want = auth_mac(secret, kServerLabel, ch->server_nonce, auth.client_nonce, kProtocolVersion, role);
  if (!macs_equal(want, ok->mac)) {
    return refuse(conn,
                  make_error(Code::kPermissionDenied,
                             "{} does not know the room secret (its proof did not verify)", conn.peer()),
                  "your proof did not verify: the room secrets differ");
  }
  return Status::Ok();
}

}  // namespace shoal::pool
