#include "market/signed_request.h"

#include <fmt/format.h>
#include <sodium.h>

#include <charconv>
#include <cstdlib>

namespace kvasir::market {
namespace {

constexpr std::string_view kDomain = "kvasir-market-v1";

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> Header(const std::map<std::string, std::string>& headers, const char* name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto it = headers.find(lower);
  if (it == headers.end()) {
    return Error(StatusCode::kUnauthenticated, "{}: missing (this request must be signed)", name);
  }
  return it->second;
}

}  // namespace

std::string ToHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

Result<std::string> FromHex(std::string_view hex, size_t want_bytes) {
  if (hex.size() % 2 != 0) return Error("odd number of hex digits ({})", hex.size());
  if (want_bytes != 0 && hex.size() != want_bytes * 2) {
    return Error("{} hex digits, expected {}", hex.size(), want_bytes * 2);
  }
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = HexValue(hex[2 * i]), lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return Error("not a hex digit at position {}", hi < 0 ? 2 * i : 2 * i + 1);
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

std::string SigningMessage(std::string_view method, std::string_view target,
                           std::string_view time, std::string_view nonce, std::string_view body) {
  std::string m;
  m.reserve(kDomain.size() + method.size() + target.size() + time.size() + nonce.size() +
            body.size() + 5);
  for (std::string_view part : {kDomain, method, target, time, nonce}) {
    m.append(part);
    m.push_back('\0');
  }
  m.append(body);
  return m;
}

std::map<std::string, std::string> SignRequest(const ring::NodeKey& key, std::string_view method,
                                               std::string_view target, std::string_view body,
                                               int64_t time) {
  ring::InitCrypto();
  std::string nonce_bytes(16, '\0');
  randombytes_buf(nonce_bytes.data(), nonce_bytes.size());
  const std::string nonce = ToHex(nonce_bytes);
  const std::string t = std::to_string(time);
  const std::string msg = SigningMessage(method, target, t, nonce, body);
  const ring::Signature sig = key.Sign(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(msg.data()), msg.size()));
  return {{kNodeHeader, ring::PublicKeyHex(key.public_key())},
          {kTimeHeader, t},
          {kNonceHeader, nonce},
          {kSignatureHeader,
           ToHex(std::string_view(reinterpret_cast<const char*>(sig.data()), sig.size()))}};
}

Result<SignedBy> VerifySignedRequest(const std::map<std::string, std::string>& headers,
                                     std::string_view method, std::string_view target,
                                     std::string_view body, int64_t now, int64_t max_skew_s) {
  KV_ASSIGN_OR_RETURN(std::string node, Header(headers, kNodeHeader));
  KV_ASSIGN_OR_RETURN(std::string time, Header(headers, kTimeHeader));
  KV_ASSIGN_OR_RETURN(std::string nonce, Header(headers, kNonceHeader));
  KV_ASSIGN_OR_RETURN(std::string sig_hex, Header(headers, kSignatureHeader));
  SignedBy by;
  auto key = ring::ParsePublicKey(node);
  if (!key.ok()) {
    return Error(StatusCode::kUnauthenticated, "{}: {}", kNodeHeader, key.status().message());
  }
  by.node = *key;
  by.node_hex = ring::PublicKeyHex(*key);
  if (time.empty() || time.size() > 18) {
    return Error(StatusCode::kUnauthenticated, "{}: not a Unix time in seconds", kTimeHeader);
  }
  auto [end, ec] = std::from_chars(time.data(), time.data() + time.size(), by.time);
  if (ec != std::errc() || end != time.data() + time.size() || by.time < 0) {
    return Error(StatusCode::kUnauthenticated, "{}: not a Unix time in seconds", kTimeHeader);
  }
  if (std::llabs(by.time - now) > max_skew_s) {
    return Error(StatusCode::kUnauthenticated,
                 "{}: {} s away from the market's clock (at most {} s); check the node's clock",
                 kTimeHeader, std::llabs(by.time - now), max_skew_s);
  }
  auto nonce_bytes = FromHex(nonce, 16);
  if (!nonce_bytes.ok()) {
    return Error(StatusCode::kUnauthenticated, "{}: {}", kNonceHeader,
                 nonce_bytes.status().message());
  }
  by.nonce = ToHex(*nonce_bytes);
  auto sig_bytes = FromHex(sig_hex, ring::kSignatureBytes);
  if (!sig_bytes.ok()) {
    return Error(StatusCode::kUnauthenticated, "{}: {}", kSignatureHeader,
                 sig_bytes.status().message());
  }
  ring::Signature sig{};
  std::copy(sig_bytes->begin(), sig_bytes->end(), reinterpret_cast<char*>(sig.data()));
  // The signer's own spelling of time and nonce is what was signed.
  const std::string msg = SigningMessage(method, target, time, nonce, body);
  if (!ring::VerifySignature(
          by.node, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(msg.data()), msg.size()),
          sig)) {
    return Error(StatusCode::kUnauthenticated,
                 "{}: does not verify for node {} (wrong key, or the request was altered)",
                 kSignatureHeader, ring::ShortKey(by.node));
  }
  return by;
}

}  // namespace kvasir::market
