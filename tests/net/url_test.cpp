#include "net/url.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "net/http_client.h"

namespace kvasir::net {
namespace {

using ::testing::HasSubstr;

TEST(UrlTest, ParsesSchemesHostsPortsAndTargets) {
  auto u = ParseUrl("http://example.com/models/a.gguf");
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_EQ(u->scheme, "http");
  EXPECT_EQ(u->host, "example.com");
  EXPECT_EQ(u->port, 80);
  EXPECT_EQ(u->target, "/models/a.gguf");
  EXPECT_FALSE(u->tls());
  EXPECT_EQ(u->ToString(), "http://example.com/models/a.gguf");

  u = ParseUrl("HTTPS://Host.Example:8443/x?download=1#frag");
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->tls());
  EXPECT_EQ(u->host, "host.example");
  EXPECT_EQ(u->port, 8443);
  EXPECT_EQ(u->target, "/x?download=1");
  EXPECT_EQ(u->ToString(), "https://host.example:8443/x?download=1");

  u = ParseUrl("http://[::1]:8080/m.gguf");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->Authority(), "[::1]:8080");

  u = ParseUrl("https://h");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->port, 443);
  EXPECT_EQ(u->target, "/");
}

TEST(UrlTest, RefusesWhatItCannotFetch) {
  EXPECT_THAT(ParseUrl("ftp://h/x").status().message(), HasSubstr("scheme 'ftp'"));
  EXPECT_THAT(ParseUrl("model.gguf").status().message(), HasSubstr("not a URL"));
  EXPECT_THAT(ParseUrl("http:///x").status().message(), HasSubstr("no host"));
  EXPECT_THAT(ParseUrl("http://h:0/x").status().message(), HasSubstr("port '0'"));
  EXPECT_THAT(ParseUrl("http://h:99999/x").status().message(), HasSubstr("1..65535"));
  EXPECT_THAT(ParseUrl("http://h:/x").status().message(), HasSubstr("empty port"));
  EXPECT_THAT(ParseUrl("http://u:p@h/x").status().message(), HasSubstr("passwords"));
  EXPECT_THAT(ParseUrl("http://h/a b").status().message(), HasSubstr("spaces"));
  EXPECT_THAT(ParseUrl("http://[::1/x").status().message(), HasSubstr("unclosed"));
  EXPECT_THAT(ParseUrl("").status().message(), HasSubstr("empty"));
  EXPECT_THAT(ParseUrl("http://h\xc3\xa9/x").status().message(), HasSubstr("punycode"));
  EXPECT_THAT(ParseUrl("http://a:b:1]:80/").status().message(), HasSubstr("not allowed"));
  EXPECT_THAT(ParseUrl("http://[zz::1]/").status().message(), HasSubstr("IPv6 literal"));
}

TEST(UrlTest, ParsesWebSocketUrls) {
  auto u = ParseWebSocketUrl("wss://Relay.Example/edge/r1-r2");
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_EQ(u->scheme, "wss");
  EXPECT_TRUE(u->tls());
  EXPECT_EQ(u->port, 443);
  EXPECT_EQ(u->target, "/edge/r1-r2");
  EXPECT_EQ(u->ToString(), "wss://relay.example/edge/r1-r2");
  u = ParseWebSocketUrl("ws://127.0.0.1:8080/edge/x");
  ASSERT_TRUE(u.ok());
  EXPECT_FALSE(u->tls());
  EXPECT_EQ(u->Authority(), "127.0.0.1:8080");
  EXPECT_EQ(ParseWebSocketUrl(u->ToString())->port, 8080);
  EXPECT_THAT(ParseWebSocketUrl("https://h/edge/x").status().message(),
              HasSubstr("use ws:// or wss://"));
  EXPECT_THAT(ParseUrl("wss://h/x").status().message(), HasSubstr("use http:// or https://"));
}

TEST(UrlTest, LooksLikeUrl) {
  EXPECT_TRUE(LooksLikeUrl("http://x"));
  EXPECT_TRUE(LooksLikeUrl("HTTPS://x"));
  EXPECT_FALSE(LooksLikeUrl("models/http.gguf"));
  EXPECT_FALSE(LooksLikeUrl("/tmp/https://"));
}

TEST(UrlTest, ResolvesRedirects) {
  Url base = ParseUrl("https://a.example/dl/m.gguf").value();
  auto r = ResolveLocation(base, "/cdn/m.gguf?sig=1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ToString(), "https://a.example/cdn/m.gguf?sig=1");
  r = ResolveLocation(base, "https://b.example:444/x");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->Authority(), "b.example:444");
  EXPECT_FALSE(ResolveLocation(base, "relative/path").ok());
  EXPECT_FALSE(ResolveLocation(base, "//other/x").ok());
}

TEST(ContentRangeTest, ParsesAndRejects) {
  uint64_t a = 0, b = 0, t = 0;
  EXPECT_TRUE(ParseContentRange("bytes 0-99/1000", &a, &b, &t));
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 99u);
  EXPECT_EQ(t, 1000u);
  EXPECT_TRUE(ParseContentRange("bytes 5-5/*", &a, &b, &t));
  EXPECT_EQ(t, 0u);
  EXPECT_FALSE(ParseContentRange("bytes 10-5/100", &a, &b, &t));   // reversed
  EXPECT_FALSE(ParseContentRange("bytes 0-100/100", &a, &b, &t));  // past the end
  EXPECT_FALSE(ParseContentRange("bytes */100", &a, &b, &t));
  EXPECT_FALSE(ParseContentRange("items 0-1/2", &a, &b, &t));
  EXPECT_FALSE(ParseContentRange("bytes 0-1", &a, &b, &t));
  EXPECT_FALSE(ParseContentRange("bytes x-1/2", &a, &b, &t));
  EXPECT_FALSE(ParseContentRange("", &a, &b, &t));
}

}  // namespace
}  // namespace kvasir::net
