#include "ring/receipt.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>

#include "base/check.h"

namespace kvasir::ring {

static_assert(std::endian::native == std::endian::little,
              "receipts copy little-endian wire structs as they are");

namespace {

constexpr size_t kBodyBytes = sizeof(wire::ReceiptBody);
constexpr size_t kLineBytes = sizeof(wire::ReceiptLine);
constexpr size_t kClientBytes = sizeof(wire::ClientCount);
constexpr size_t kLabelBytes = sizeof(wire::kReceiptSignLabel);  // with its NUL
static_assert(kLabelBytes == 18);

wire::ReceiptBody Body(const Receipt& r, uint32_t n_lines) {
  wire::ReceiptBody b{};
  b.session = r.session;
  b.n_lines = n_lines;
  std::memcpy(b.receipt_id, r.id.data(), sizeof(b.receipt_id));
  std::memcpy(b.model_id, r.model_id.data(), sizeof(b.model_id));
  b.version = wire::kReceiptVersion;
  b.flags = r.client ? wire::kReceiptHasClientCount : 0;
  return b;
}

wire::ClientCount Client(const ClientCount& c) {
  wire::ClientCount w{};
  std::memcpy(w.client_key, c.client.data(), sizeof(w.client_key));
  w.tokens = c.tokens;
  std::memcpy(w.signature, c.signature.data(), sizeof(w.signature));
  return w;
}

wire::ReceiptLine Line(const ReceiptLine& l) {
  wire::ReceiptLine w{};
  std::memcpy(w.node_key, l.node.data(), sizeof(w.node_key));
  w.first = l.first;
  w.last = l.last;
  w.tokens = l.tokens;
  std::memcpy(w.rows_root, l.rows_root.data(), sizeof(w.rows_root));
  std::memcpy(w.signature, l.signature.data(), sizeof(w.signature));
  return w;
}

void PutBytes(std::vector<uint8_t>* out, const void* p, size_t n) {
  const size_t at = out->size();
  out->resize(at + n);
  std::memcpy(out->data() + at, p, n);
}

template <typename T>
void Put(std::vector<uint8_t>* out, const T& v, size_t n = sizeof(T)) {
  PutBytes(out, &v, n);
}

// What line i's signature covers: the label with its NUL, the body with n_lines = i + 1, lines
// 0..i-1 whole, and line i up to its signature.
std::vector<uint8_t> SignedBytes(const Receipt& r, size_t i) {
  std::vector<uint8_t> msg;
  msg.reserve(kLabelBytes + kBodyBytes + (i + 1) * kLineBytes);
  PutBytes(&msg, wire::kReceiptSignLabel, kLabelBytes);
  Put(&msg, Body(r, static_cast<uint32_t>(i + 1)));
  if (r.client) Put(&msg, Client(*r.client));
  for (size_t j = 0; j < i; ++j) Put(&msg, Line(r.lines[j]));
  Put(&msg, Line(r.lines[i]), wire::kReceiptLineSigned);
  return msg;
}

// The index of the first nonzero byte of `bytes`, or -1.
template <size_t N>
int FirstNonzero(const uint8_t (&bytes)[N]) {
  for (size_t i = 0; i < N; ++i) {
    if (bytes[i] != 0) return static_cast<int>(i);
  }
  return -1;
}

// What the client's count signature covers.
std::vector<uint8_t> ClientSignedBytes(const std::array<uint8_t, 16>& receipt_id,
                                       const std::array<uint8_t, 16>& model_id, uint32_t session,
                                       uint64_t tokens) {
  std::vector<uint8_t> msg;
  PutBytes(&msg, wire::kClientCountSignLabel, sizeof(wire::kClientCountSignLabel));
  PutBytes(&msg, receipt_id.data(), receipt_id.size());
  PutBytes(&msg, model_id.data(), model_id.size());
  Put(&msg, session);
  Put(&msg, tokens);
  return msg;
}

}  // namespace

ClientCount SignClientCount(const NodeKey& key, const std::array<uint8_t, 16>& receipt_id,
                            const std::array<uint8_t, 16>& model_id, uint32_t session,
                            uint64_t tokens) {
  ClientCount c;
  c.client = key.public_key();
  c.tokens = tokens;
  c.signature = key.Sign(ClientSignedBytes(receipt_id, model_id, session, tokens));
  return c;
}

Status VerifyClientCount(const Receipt& receipt) {
  if (!receipt.client) return Status::Ok();
  const ClientCount& c = *receipt.client;
  if (!VerifySignature(c.client,
                       ClientSignedBytes(receipt.id, receipt.model_id, receipt.session, c.tokens),
                       c.signature)) {
    return Error(StatusCode::kUnauthenticated,
                 "receipt {}: the client count ({} tokens, client {}) does not verify for this "
                 "session",
                 ReceiptIdHex(receipt), c.tokens, ShortKey(c.client));
  }
  return Status::Ok();
}

uint64_t CreditableTokens(const Receipt& receipt) {
  if (receipt.lines.empty()) return 0;
  const uint64_t ring = receipt.lines[0].tokens;
  return receipt.client ? std::min(ring, receipt.client->tokens) : ring;
}

std::vector<uint8_t> EncodeReceipt(const Receipt& receipt) {
  KV_CHECK(receipt.lines.size() <= wire::kMaxReceiptLines, "a receipt of {} lines (limit {})",
           receipt.lines.size(), wire::kMaxReceiptLines);
  std::vector<uint8_t> out;
  out.reserve(kBodyBytes + kClientBytes + receipt.lines.size() * kLineBytes);
  Put(&out, Body(receipt, static_cast<uint32_t>(receipt.lines.size())));
  if (receipt.client) Put(&out, Client(*receipt.client));
  for (const ReceiptLine& l : receipt.lines) Put(&out, Line(l));
  return out;
}

Result<Receipt> ParseReceipt(std::span<const uint8_t> payload) {
  if (payload.size() < kBodyBytes) {
    return Error("RECEIPT: payload of {} bytes is shorter than its {}-byte body", payload.size(),
                 kBodyBytes);
  }
  wire::ReceiptBody b;
  std::memcpy(&b, payload.data(), kBodyBytes);
  if (b.version != wire::kReceiptVersion) {
    if (b.version == 0) {
      return Error(
          "RECEIPT: version (offset 40) is 0: a version 1 receipt, without row "
          "commitments, is no longer accepted (version {} is)",
          wire::kReceiptVersion);
    }
    return Error("RECEIPT: version (offset 40) is {}, this stage knows version {}", b.version,
                 wire::kReceiptVersion);
  }
  if (b.session == 0) return Error("RECEIPT: session (offset 0) is 0 (session ids are nonzero)");
  if (b.n_lines == 0) {
    return Error("RECEIPT: n_lines (offset 4) is 0 (the head signs the first line)");
  }
  if (b.n_lines > wire::kMaxReceiptLines) {
    return Error("RECEIPT: n_lines (offset 4) is {}, over the limit of {} lines", b.n_lines,
                 wire::kMaxReceiptLines);
  }
  if (const int at = FirstNonzero(b.reserved); at >= 0) {
    return Error("RECEIPT: reserved byte {} (offset {}) is {:#04x}, must be 0", at,
                 offsetof(wire::ReceiptBody, reserved) + at, b.reserved[at]);
  }
  if ((b.flags & ~wire::kReceiptHasClientCount) != 0) {
    return Error("RECEIPT: flags (offset 44) are {:#04x}, only {:#04x} is known", b.flags,
                 wire::kReceiptHasClientCount);
  }
  const bool has_client = (b.flags & wire::kReceiptHasClientCount) != 0;
  const size_t lines_at = kBodyBytes + (has_client ? kClientBytes : 0);
  const uint64_t want = (has_client ? kClientBytes : 0) + uint64_t{b.n_lines} * kLineBytes;
  const uint64_t tail = payload.size() - kBodyBytes;
  if (tail != want) {
    return Error("RECEIPT: tail is {} bytes, but {}n_lines {} x {}-byte lines needs {}", tail,
                 has_client ? "a client count and " : "", b.n_lines, kLineBytes, want);
  }
  Receipt r;
  if (has_client) {
    wire::ClientCount w;
    std::memcpy(&w, payload.data() + kBodyBytes, kClientBytes);
    ClientCount& c = r.client.emplace();
    std::memcpy(c.client.data(), w.client_key, c.client.size());
    c.tokens = w.tokens;
    std::memcpy(c.signature.data(), w.signature, c.signature.size());
  }
  r.session = b.session;
  std::memcpy(r.id.data(), b.receipt_id, r.id.size());
  std::memcpy(r.model_id.data(), b.model_id, r.model_id.size());
  r.lines.resize(b.n_lines);
  for (uint32_t i = 0; i < b.n_lines; ++i) {
    const size_t at = lines_at + size_t{i} * kLineBytes;
    wire::ReceiptLine w;
    std::memcpy(&w, payload.data() + at, kLineBytes);
    if (const int z = FirstNonzero(w.reserved); z >= 0) {
      return Error("RECEIPT: line {} (offset {}): reserved byte {} is {:#04x}, must be 0", i, at, z,
                   w.reserved[z]);
    }
    if (w.first >= w.last) {
      return Error("RECEIPT: line {} (offset {}): window [{}, {}) is empty", i, at, w.first,
                   w.last);
    }
    ReceiptLine& l = r.lines[i];
    std::memcpy(l.node.data(), w.node_key, l.node.size());
    l.first = w.first;
    l.last = w.last;
    l.tokens = w.tokens;
    std::memcpy(l.rows_root.data(), w.rows_root, l.rows_root.size());
    std::memcpy(l.signature.data(), w.signature, l.signature.size());
  }
  return r;
}

void AppendReceiptLine(Receipt* receipt, const NodeKey& key, uint32_t first, uint32_t last,
                       uint64_t tokens, const Digest& rows_root) {
  KV_CHECK(receipt->lines.size() < wire::kMaxReceiptLines,
           "appending to a receipt of {} lines (limit {})", receipt->lines.size(),
           wire::kMaxReceiptLines);
  ReceiptLine& l = receipt->lines.emplace_back();
  l.node = key.public_key();
  l.first = first;
  l.last = last;
  l.tokens = tokens;
  l.rows_root = rows_root;
  l.signature = key.Sign(SignedBytes(*receipt, receipt->lines.size() - 1));
}

Status VerifyReceipt(const Receipt& receipt) {
  if (receipt.lines.empty()) return Error("receipt {}: no lines", ReceiptIdHex(receipt));
  if (receipt.lines.size() > wire::kMaxReceiptLines) {
    return Error("receipt {}: {} lines, over the limit of {}", ReceiptIdHex(receipt),
                 receipt.lines.size(), wire::kMaxReceiptLines);
  }
  for (size_t i = 0; i < receipt.lines.size(); ++i) {
    const ReceiptLine& l = receipt.lines[i];
    if (!VerifySignature(l.node, SignedBytes(receipt, i), l.signature)) {
      return Error(StatusCode::kUnauthenticated,
                   "receipt line {} (node {}): the signature does not verify", i, ShortKey(l.node));
    }
  }
  return VerifyClientCount(receipt);
}

std::string ReceiptIdHex(const Receipt& receipt) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(receipt.id.size() * 2);
  for (uint8_t b : receipt.id) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

}  // namespace kvasir::ring
