// Signed market requests (docs/MARKET.md, "Signed requests"): a node proves with its Ed25519 key
// that it sent a request, bound to the method, the target, the exact body, a time and a nonce, in
// four headers. Pure functions; the market keeps the nonces (Store::UseNonce).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "base/status.h"
#include "ring/node_key.h"

namespace kvasir::market {

inline constexpr const char* kNodeHeader = "X-Kvasir-Node";
inline constexpr const char* kTimeHeader = "X-Kvasir-Time";
inline constexpr const char* kNonceHeader = "X-Kvasir-Nonce";
inline constexpr const char* kSignatureHeader = "X-Kvasir-Signature";

// The signed bytes: "kvasir-market-v1" 0x00 method 0x00 target 0x00 time 0x00 nonce 0x00 body.
std::string SigningMessage(std::string_view method, std::string_view target,
                           std::string_view time, std::string_view nonce, std::string_view body);

// The four headers for a request, with `time` (Unix seconds) and a fresh random nonce.
std::map<std::string, std::string> SignRequest(const ring::NodeKey& key, std::string_view method,
                                               std::string_view target, std::string_view body,
                                               int64_t time);

struct SignedBy {
  ring::PublicKey node{};
  std::string node_hex;  // 64 lowercase hex digits
  std::string nonce;     // 32 lowercase hex digits
  int64_t time = 0;
};

// Checks the proof of a request. `headers` maps lowercase header names to values. Errors are
// kUnauthenticated and name the header and what is wrong with it ("X-Kvasir-Time: 400 s away
// from the market's clock (at most 120 s)", "X-Kvasir-Signature: does not verify"). The nonce is
// not checked against earlier ones here.
Result<SignedBy> VerifySignedRequest(const std::map<std::string, std::string>& headers,
                                     std::string_view method, std::string_view target,
                                     std::string_view body, int64_t now, int64_t max_skew_s);

// Lowercase hex of bytes, and back (errors: odd length, a character that is not a hex digit,
// wrong length when `want_bytes` is not 0).
std::string ToHex(std::string_view bytes);
Result<std::string> FromHex(std::string_view hex, size_t want_bytes = 0);

}  // namespace kvasir::market
