// URLs for HTTP(S) fetches and WebSocket (relay) connections: scheme, host, port and request
// target, parsed strictly enough that a typo is reported rather than guessed at.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kvasir::net {

struct Url {
  std::string scheme;  // "http" or "https" (ParseUrl); "ws" or "wss" (ParseWebSocketUrl)
  std::string host;    // without brackets for IPv6 literals
  uint16_t port = 0;   // explicit or the scheme's default
  std::string target;  // path and query, always starting with '/'

  bool tls() const { return scheme == "https" || scheme == "wss"; }
  // "https://host:port/target" (port omitted when it is the default).
  std::string ToString() const;
  // "host:port", for messages and the Host header.
  std::string Authority() const;
};

// Parses an absolute http:// or https:// URL. Errors name the text and what is wrong
// ("ftp://x/y: scheme 'ftp' is not supported (use http:// or https://)"). User info and fragments
// are refused; spaces and control characters are refused.
Result<Url> ParseUrl(std::string_view text);

// Parses an absolute ws:// or wss:// URL with the same rules (default ports 80 and 443).
Result<Url> ParseWebSocketUrl(std::string_view text);

// True when `text` looks like a URL (starts with http:// or https://), so a command can take either
// a path or a URL in one flag.
bool LooksLikeUrl(std::string_view text);

// Resolves a redirect's Location (absolute URL, or an absolute path on the same origin) against
// `base`.
Result<Url> ResolveLocation(const Url& base, std::string_view location);

}  // namespace kvasir::net
