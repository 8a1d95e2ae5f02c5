// libFuzzer target: arbitrary text through the URL parser, redirect resolution and the
// Content-Range parser. Invariants: a parsed URL prints as a URL that parses back to the same
// parts; a parsed Content-Range is ordered and inside its total.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "net/http_client.h"
#include "net/url.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto url = kvasir::net::ParseUrl(text);
  if (url.ok()) {
    auto again = kvasir::net::ParseUrl(url->ToString());
    if (!again.ok() || again->scheme != url->scheme || again->host != url->host ||
        again->port != url->port || again->target != url->target) {
      std::abort();
    }
    (void)kvasir::net::ResolveLocation(*url, text.substr(size / 2));
  }
  uint64_t first = 0, last = 0, total = 0;
  if (kvasir::net::ParseContentRange(text, &first, &last, &total)) {
    if (first > last || (total != 0 && last >= total)) std::abort();
  }
  return 0;
}
