// The codec's speculation parts (docs/PROTOCOL.md, "Speculation"), apart from messages.cpp: a
// HIDDEN's verify flag, and the drafts a TOKEN carries. Pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "ring/messages.h"

namespace kvasir::ring {

// A HIDDEN's flags: known bits, and a verify chunk that samples and has 2..1 + kMaxDraftTokens
// rows.
Status CheckHiddenFlags(uint16_t flags, uint32_t n_tokens);

// A TOKEN's flags and drafts as the sender builds them: drafts only on the last token of a verify
// chunk that does not end its session, at most kMaxDraftTokens, ids >= 0.
Status CheckTokenDrafts(const TokenMsg& m);

// Reads a TOKEN's draft tail (kTokenDrafts) at *p, of which *left bytes remain, advancing both:
// u32 n_drafts in 1..kMaxDraftTokens, then that many ids >= 0, never after a finished token.
Status DecodeTokenDrafts(const uint8_t** p, size_t* left, bool finished,
                         std::vector<int32_t>* drafts);

}  // namespace kvasir::ring
