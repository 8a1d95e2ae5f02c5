// The codec's speculation parts (spec_wire.h).
#include "ring/spec_wire.h"

#include <cstring>

namespace kvasir::ring {

Status CheckHiddenFlags(uint16_t flags, uint32_t n_tokens) {
  if ((flags & ~(wire::kHiddenSample | wire::kHiddenVerify)) != 0) {
    return Error("HIDDEN: flags 0x{:x} has unknown bits", flags);
  }
  if ((flags & wire::kHiddenVerify) == 0) return Status::Ok();
  if ((flags & wire::kHiddenSample) == 0) {
    return Error("HIDDEN: a verify chunk that does not sample");
  }
  if (n_tokens < 2 || n_tokens > 1 + wire::kMaxDraftTokens) {
    return Error("HIDDEN: a verify chunk of {} rows (a token and 1..{} drafts)", n_tokens,
                 wire::kMaxDraftTokens);
  }
  return Status::Ok();
}

Status CheckTokenDrafts(const TokenMsg& m) {
  if (m.drafts.size() > wire::kMaxDraftTokens) {
    return Error("TOKEN: {} drafts exceed the limit of {}", m.drafts.size(), wire::kMaxDraftTokens);
  }
  if (!m.drafts.empty() && (m.more || m.token.finished != 0)) {
    return Error("TOKEN: drafts after a token that is not the last of its verify chunk");
  }
  if (m.more && m.token.finished != 0) return Error("TOKEN: kTokenMore on a finished token");
  if (m.ahead && (m.drafts.empty() || m.more || m.token.finished != 0 || m.n_cached)) {
    return Error("TOKEN: kTokenAhead is a guessed token with its drafts, nothing else");
  }
  for (int32_t d : m.drafts) {
    if (d < 0) return Error("TOKEN: draft id {} is negative", d);
  }
  return Status::Ok();
}

Status DecodeTokenDrafts(const uint8_t** p, size_t* left, bool finished,
                         std::vector<int32_t>* drafts) {
  uint32_t n = 0;
  if (*left < sizeof(n)) return Error("TOKEN: the tail ends before its draft count");
  std::memcpy(&n, *p, sizeof(n));
  *p += sizeof(n);
  *left -= sizeof(n);
  if (n == 0 || n > wire::kMaxDraftTokens) {
    return Error("TOKEN: n_drafts {} is not 1..{}", n, wire::kMaxDraftTokens);
  }
  if (*left < uint64_t{n} * sizeof(int32_t)) {
    return Error("TOKEN: {} drafts but the tail holds {} bytes", n, *left);
  }
  drafts->resize(n);
  std::memcpy(drafts->data(), *p, n * sizeof(int32_t));
  *p += n * sizeof(int32_t);
  *left -= n * sizeof(int32_t);
  for (int32_t d : *drafts) {
    if (d < 0) return Error("TOKEN: draft id {} is negative", d);
  }
  if (finished) return Error("TOKEN: drafts after a finished token");
  return Status::Ok();
}

}  // namespace kvasir::ring
