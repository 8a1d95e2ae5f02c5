// Contribution receipts (docs/PROTOCOL.md, "RECEIPT"): after a session closes, a receipt travels
// once around the ring and every stage appends a line saying how many token rows its window ran
// for the session, signed with its node key over everything before it. The completed receipt
// proves to anyone who knows the ring's keys (the market) who did what, and no stage can alter,
// drop or reorder another's line. Pure: no links, no model; any thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "ring/node_key.h"
#include "ring/row_commit.h"
#include "ring/wire.h"

namespace kvasir::ring {

struct ReceiptLine {
  PublicKey node{};              // the signer
  uint32_t first = 0, last = 0;  // the signer's window [first, last)
  uint64_t tokens = 0;           // token rows the window ran for the session
  Digest rows_root{};            // Merkle root of those rows, in and out (row_commit.h)
  Signature signature{};         // over everything before it (wire.h, "RECEIPT")
};

// A count of tokens the session's client says it received, signed with the client's own key over
// the session's receipt id, model id and session id (wire.h, "ClientCount"), so it cannot be
// moved to another session.
struct ClientCount {
  PublicKey client{};
  uint64_t tokens = 0;
  Signature signature{};
};

struct Receipt {
  std::array<uint8_t, 16> id{};        // random, chosen by the head
  std::array<uint8_t, 16> model_id{};  // the model identity
  uint32_t session = 0;                // the head's session id
  std::optional<ClientCount>
      client;                      // set by the head before it signs line 0, if the client sent one
  std::vector<ReceiptLine> lines;  // in ring order from the head; at most kMaxReceiptLines
};

// The client's count of `tokens` for the session (receipt_id, model_id, session), signed by `key`.
ClientCount SignClientCount(const NodeKey& key, const std::array<uint8_t, 16>& receipt_id,
                            const std::array<uint8_t, 16>& model_id, uint32_t session,
                            uint64_t tokens);

// Checks receipt.client's signature over the receipt's own id, model id and session: a forged
// count, or one signed for another session, is refused (kUnauthenticated). Ok when there is no
// client count.
Status VerifyClientCount(const Receipt& receipt);

// The tokens to credit: line 0's count (the lines must agree), and no more than the client's count
// if there is one. Trust it only once VerifyReceipt is ok.
uint64_t CreditableTokens(const Receipt& receipt);

// The RECEIPT payload: ReceiptBody, then the lines. Requires lines.size() <= kMaxReceiptLines.
std::vector<uint8_t> EncodeReceipt(const Receipt& receipt);

// Parses a RECEIPT payload (any bytes are safe). Refuses unknown flags, a payload shorter than the
// body, a version other than wire::kReceiptVersion (a version 1 receipt, from a stage that predates
// row commitments, is named as such), a session of 0, n_lines of 0 or over kMaxReceiptLines, a tail
// that is not exactly n_lines lines, nonzero reserved bytes and empty windows; errors name the
// field and its offset: "RECEIPT: line 2 (offset 288): reserved byte 3 is 0x07, must be 0".
// Signatures are not checked here (VerifyReceipt). A receipt that parses encodes back to the same
// bytes.
Result<Receipt> ParseReceipt(std::span<const uint8_t> payload);

// Appends `key`'s line for window [first, last), `tokens` rows and their commitment `rows_root`
// (SessionRows::Root), signed over the receipt as it stands plus the new line. Requires
// receipt->lines.size() < kMaxReceiptLines (check before appending to a receipt from a peer).
void AppendReceiptLine(Receipt* receipt, const NodeKey& key, uint32_t first, uint32_t last,
                       uint64_t tokens, const Digest& rows_root);

// Checks every line's signature, each over everything before it, the client count's signature if
// any (VerifyClientCount), and the line count (1 to kMaxReceiptLines). The error names the first
// line that fails and its signer: "receipt line 1 (node 3fa91c07): the signature does not verify".
// Says nothing of whether the signers are the ones that should have signed (that is for whoever
// knows the ring: the head, the market).
Status VerifyReceipt(const Receipt& receipt);

// The receipt id as 32 lowercase hex digits.
std::string ReceiptIdHex(const Receipt& receipt);

}  // namespace kvasir::ring
