// libFuzzer target: arbitrary bytes as the reply to a range request, through the response-head
// parser the HTTP client uses (Beast) and our judgement of it (status, Content-Range,
// Content-Length, redirects, If-Range validators), plus the ETag and HTTP-date parsers.
// Input: [flags:1][offset:8][length:8][response head...]. Invariants: a reply accepted as the
// range is a 206 whose bytes start at the offset, fit the request and their total, and agree with
// Content-Length; a reply pinned by If-Range is accepted only with the pinned validator; every
// refusal has a message.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "net/http_client.h"

namespace {

uint64_t ReadU64(const uint8_t* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace net = kvasir::net;
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  // The validator parsers on the raw text.
  if (net::IsStrongEtag(all)) Check(net::IfRangeValidator(all, "") == all);
  if (auto t = net::ParseHttpDate(all)) {
    Check(all.size() == 29);
    Check(net::IfRangeValidator("W/\"x\"", all) == all);
  }
  if (size < 17) return 0;
  const uint8_t flags = data[0];
  net::RangeRequest rq;
  rq.offset = ReadU64(data + 1);
  rq.length = ReadU64(data + 9);
  rq.clamp_at_eof = (flags & 1) != 0;
  if ((flags & 2) != 0) {  // small numbers reach the interesting comparisons more often
    rq.offset &= 0xffff;
    rq.length &= 0xffff;
  }
  const std::string_view text = all.substr(17);
  auto head = net::ParseResponseHead(text);
  if (!head.ok()) {
    Check(!head.status().message().empty());
    return 0;
  }
  switch ((flags >> 2) & 3) {
    case 0:
      rq.if_range.clear();
      break;
    case 1:
      rq.if_range = net::IfRangeValidator(head->etag, head->last_modified);
      break;
    case 2:
      rq.if_range = "\"pinned\"";
      break;
    default:
      rq.if_range = "Mon, 01 Jan 2024 00:00:00 GMT";
      break;
  }
  const net::ReplyVerdict v = net::JudgeReply(*head, rq, "http://fuzz/m");
  if (v.failure != net::HttpFailure::kNone) {
    Check(!v.status.ok() && !v.status.message().empty());
    return 0;
  }
  Check(v.status.ok());
  if (!v.redirect.empty()) {
    Check(head->status >= 300 && head->status < 400 && v.redirect == head->location);
    return 0;
  }
  Check(head->status == 206);
  Check(rq.length > 0 && v.first == rq.offset && v.first <= v.last);
  Check(v.last - v.first < rq.length);
  Check(v.total == 0 || v.last < v.total);
  Check(rq.clamp_at_eof || v.last - v.first + 1 == rq.length);
  if (head->content_length) Check(*head->content_length == v.last - v.first + 1);
  if (!rq.if_range.empty()) {
    Check(rq.if_range == head->etag || rq.if_range == head->last_modified);
  }
  return 0;
}
