#include "net/url.h"

#include <cctype>
#include <charconv>

namespace kvasir::net {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

bool HasBadChars(std::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) return true;
  }
  return false;
}

uint16_t DefaultPort(const std::string& scheme) {
  return scheme == "https" || scheme == "wss" ? 443 : 80;
}

Result<Url> Parse(std::string_view text, bool websocket);

}  // namespace

std::string Url::Authority() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

std::string Url::ToString() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::string out = scheme + "://" + h;
  if (port != DefaultPort(scheme)) out += ":" + std::to_string(port);
  return out + target;
}

bool LooksLikeUrl(std::string_view text) {
  const std::string l = Lower(text.substr(0, 8));
  return l.rfind("http://", 0) == 0 || l.rfind("https://", 0) == 0;
}

Result<Url> ParseUrl(std::string_view text) { return Parse(text, false); }

Result<Url> ParseWebSocketUrl(std::string_view text) { return Parse(text, true); }

namespace {

Result<Url> Parse(std::string_view text, bool websocket) {
  const std::string shown(text);
  const char* plain = websocket ? "ws" : "http";
  const char* secure = websocket ? "wss" : "https";
  if (text.empty()) return Error("empty URL");
  if (HasBadChars(text)) return Error("{}: URL has spaces or control characters", shown);
  const size_t colon = text.find("://");
  if (colon == std::string_view::npos) {
    return Error("{}: not a URL (expected {}://HOST[:PORT]/PATH or {}://...)", shown, plain,
                 secure);
  }
  Url url;
  url.scheme = Lower(text.substr(0, colon));
  if (url.scheme != plain && url.scheme != secure) {
    return Error("{}: scheme '{}' is not supported (use {}:// or {}://)", shown, url.scheme, plain,
                 secure);
  }
  std::string_view rest = text.substr(colon + 3);
  const size_t fragment = rest.find('#');
  if (fragment != std::string_view::npos) rest = rest.substr(0, fragment);
  const size_t slash = rest.find_first_of("/?");
  std::string_view authority = rest.substr(0, slash);
  url.target = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (url.target[0] == '?') url.target = "/" + url.target;
  if (authority.find('@') != std::string_view::npos) {
    return Error("{}: user names or passwords in URLs are not supported", shown);
  }
  std::string_view port_text;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return Error("{}: unclosed '[' in host", shown);
    url.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return Error("{}: unexpected text after ']'", shown);
      port_text = after.substr(1);
      if (port_text.empty()) return Error("{}: empty port", shown);
    }
  } else {
    const size_t c = authority.rfind(':');
    url.host = std::string(authority.substr(0, c));
    if (c != std::string_view::npos) {
      port_text = authority.substr(c + 1);
      if (port_text.empty()) return Error("{}: empty port", shown);
    }
  }
  if (url.host.empty()) return Error("{}: no host", shown);
  const bool literal = !authority.empty() && authority[0] == '[';
  for (char c : url.host) {
    const bool ok = literal ? (std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.')
                            : (std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
                               c == '.' || c == '_' || c == '~');
    if (!ok) {
      return Error("{}: host '{}' has a character that is not allowed there{}", shown, url.host,
                   literal ? " (an IPv6 literal holds hex digits, ':' and '.')"
                           : " (letters, digits, '-', '.', '_', '~'; international names in "
                             "punycode)");
    }
  }
  url.host = Lower(url.host);
  url.port = DefaultPort(url.scheme);
  if (!port_text.empty()) {
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), value);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || value == 0 ||
        value > 65535) {
      return Error("{}: port '{}' is not a number in 1..65535", shown, port_text);
    }
    url.port = static_cast<uint16_t>(value);
  }
  return url;
}

}  // namespace

Result<Url> ResolveLocation(const Url& base, std::string_view location) {
  if (LooksLikeUrl(location)) return ParseUrl(location);
  if (location.empty() || location[0] != '/' || (location.size() > 1 && location[1] == '/')) {
    return Error("redirect from {} to '{}': only absolute URLs and absolute paths are followed",
                 base.ToString(), location);
  }
  if (HasBadChars(location)) {
    return Error("redirect from {}: Location has spaces or control characters", base.ToString());
  }
  Url url = base;
  url.target = std::string(location);
  return url;
}

}  // namespace kvasir::net
