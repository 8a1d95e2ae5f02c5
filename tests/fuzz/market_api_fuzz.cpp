// libFuzzer target: what reaches the market from the network. The bytes are parsed as an HTTP
// request with the server's limits (8 KiB of header, 1 MiB of body) and answered by MarketApi on an
// in-memory database holding one model, as the server would. The first byte picks how much of a
// valid signature the request carries, so signature parsing, nonces and every endpoint's body
// checks are reached. Invariants: every answer has a status from 200 to 599 and, unless it is the
// page, a JSON body; errors have {"error": {"code", "message"}}.
#include <utility>  // before Asio (Boost 1.74 under GCC 12, C++20)

#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "market/api.h"
#include "market/audit.h"
#include "market/signed_request.h"
#include "market/store.h"

namespace http = boost::beast::http;
using namespace kvasir::market;

namespace {

struct World {
  std::unique_ptr<Store> store;
  std::unique_ptr<MarketApi> api;
  std::unique_ptr<kvasir::ring::NodeKey> key;
  World() {
    store = std::move(Store::Open(":memory:")).value();
    ModelSpec m;
    m.name = "tiny";
    m.model_id = "0123456789abcdef0123456789abcdef";
    m.url = "http://files.invalid/tiny.gguf";
    m.n_layer = 4;
    m.ctx = 64;
    m.rings.push_back({{0, 2, 10, 100, {{"blk.0.attn_q.weight", std::string(64, 'a')}}},
                       {2, 4, 10, 100, {{"blk.2.attn_q.weight", std::string(64, 'b')}}}});
    if (!store->AddModel(m, false, 1e9).ok()) std::abort();
    api = std::make_unique<MarketApi>(store.get(), MarketConfig{30, 120, "wss://r.invalid", "s"});
    std::array<uint8_t, 32> seed{};
    key = std::make_unique<kvasir::ring::NodeKey>(kvasir::ring::NodeKey::FromSeed(seed));
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World world;
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  http::request_parser<http::string_body> parser;
  parser.header_limit(8 * 1024);
  parser.body_limit(kMaxRequestBytes);
  parser.eager(true);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(data + 1, size - 1), ec);
  if (ec || !parser.is_header_done()) return 0;
  if (!parser.is_done()) parser.put_eof(ec);
  const auto& req = parser.get();
  ApiRequest r;
  r.method = std::string(req.method_string());
  r.target = std::string(req.target());
  r.body = req.body();
  r.remote_ip = "10.0.0.1";
  for (const auto& f : req) {
    std::string name(f.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers[name] = std::string(f.value());
  }
  const double now = 1e9 + (mode >> 2);
  if (mode & 1) {
    // A correct signature over whatever the request says (bodies then reach the field checks).
    for (auto& [k, v] : SignRequest(*world.key, r.method, r.target, r.body, static_cast<int64_t>(now))) {
      std::string lower = k;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (!(mode & 2) || !r.headers.count(lower)) r.headers[lower] = v;
    }
  }
  // The audit fields a heartbeat and its reply carry, parsed directly as well: any JSON body
  // reaches them without first passing a signature check.
  if (const auto body = nlohmann::json::parse(r.body, nullptr, false); !body.is_discarded()) {
    (void)ParseAuditAnswers(body);
    (void)ParseAuditRequests(body);
  }
  const ApiResponse res = world.api->Handle(r, now);
  if (res.status < 200 || res.status > 599) std::abort();
  if (res.content_type == "application/json") {
    const auto j = nlohmann::json::parse(res.body, nullptr, false);
    if (j.is_discarded()) std::abort();
    if (res.status >= 400 && (!j.contains("error") || !j["error"].contains("message"))) std::abort();
  }
  return 0;
}
