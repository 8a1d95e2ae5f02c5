// One HTTP(S) request and its whole answer, for small JSON APIs (the market): connect with the
// shared secure dial (net/dial.h), send, read the response with a size limit, close. Blocking on
// the caller's thread, with one deadline over all of it.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "base/status.h"

namespace kvasir::net {

struct HttpRequestOptions {
  std::string ca_file;          // PEM certificates to trust for https:// instead of the system's
  int timeout_ms = 10000;       // connect, send and the whole response
  size_t max_body_bytes = size_t{16} << 20;
  std::function<bool()> cancelled;  // polled while waiting; true abandons the request
};

struct HttpReply {
  int status = 0;
  std::string content_type;
  std::string body;
};

// `method` to `url` with `headers` and `body` (Content-Type application/json when a body is
// given). Any status is a reply; errors are the network's (kUnavailable, kTimeout), a
// certificate that does not verify (kUnauthenticated), or a response over max_body_bytes
// (kTooLarge), each naming the URL.
Result<HttpReply> HttpRequest(const std::string& method, const std::string& url,
                              const std::map<std::string, std::string>& headers,
                              const std::string& body, const HttpRequestOptions& options = {});

}  // namespace kvasir::net
