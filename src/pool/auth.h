// Joining a room: mutual challenge-response over any Connection, keyed by the room secret, which
// never crosses the wire (docs/protocol.md, "Handshake").
//   server -> client  CHALLENGE  server_nonce (32 random bytes)
//   client -> server  AUTH       role, client_nonce, HMAC-SHA256(secret, "shoal-auth-client" |
//                                server_nonce | client_nonce | version u16 | role u8)
//   server -> client  AUTH_OK    HMAC-SHA256(secret, "shoal-auth-server" | the same inputs)
//                  or ERROR      permission denied, and the server closes
// Both nonces are fresh per connection, so a recorded AUTH does not verify on another connection;
// the labels keep a client proof from serving as a server proof. MACs are compared in constant
// time (CRYPTO_memcmp). HMAC: RFC 2104 with SHA-256 (FIPS 180-4), from OpenSSL's libcrypto.
#pragma once

#include <string_view>

#include "core/status.h"
#include "pool/messages.h"
#include "pool/transport.h"

namespace shoal::pool {

inline constexpr Millis kDefaultHandshakeTimeout{5000};

/// Server side (the host's listener). Returns the role the client proved. On a wrong secret the
/// client gets an ERROR and the connection is closed: kPermissionDenied naming the peer. Also
/// kUnsupported (other protocol version), kCorrupt (not a shoal peer), kDeadlineExceeded (the
/// client said nothing in time), kUnavailable (it left), kInvalidArgument (empty secret).
Result<PeerRole> auth_server(Connection& conn, std::string_view secret, Millis timeout = kDefaultHandshakeTimeout);

/// Client side (a joining worker, a guest, a hop). kPermissionDenied when the server refuses our
/// proof ("wrong room secret") or its own proof does not verify (it does not know the secret);
/// other errors as auth_server.
Status auth_client(Connection& conn, std::string_view secret, PeerRole role,
                   Millis timeout = kDefaultHandshakeTimeout);

/// HMAC-SHA256(secret, label | server_nonce | client_nonce | version u16 LE | role u8).
Mac auth_mac(std::string_view secret, std::string_view label, const Nonce& server_nonce,
             const Nonce& client_nonce, uint16_t version, PeerRole role);

/// 32 bytes from the OS's cryptographic random source (OpenSSL RAND_bytes; CHECKs it works).
Nonce random_nonce();

inline constexpr std::string_view kClientLabel = "shoal-auth-client";
inline constexpr std::string_view kServerLabel = "shoal-auth-server";

}  // namespace shoal::pool
