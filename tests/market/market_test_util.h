// Shared by the market tests: a model registered without a GGUF file, node keys from fixed seeds,
// signed API requests, receipts signed by a ring's holders, and a stand-in for the checker.
#pragma once

#include <array>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "market/api.h"
#include "market/ring_check.h"
#include "market/signed_request.h"
#include "market/store.h"
#include "ring/node_key.h"
#include "ring/receipt.h"

namespace kvasir::testing {

// 6 layers in 3 windows [0,2) [2,4) [4,6), `rings` rings, model id 00..0 + n.
inline market::ModelSpec TestModel(const std::string& name = "tiny", int rings = 1) {
  market::ModelSpec m;
  m.name = name;
  m.model_id = "0123456789abcdef0123456789abcdef";
  m.url = "http://files.invalid/" + name + ".gguf";
  m.n_layer = 6;
  m.ctx = 256;
  m.max_rows_per_s = 1000;
  std::vector<market::WindowSpec> ring;
  for (int w = 0; w < 3; ++w) {
    market::WindowSpec win;
    win.first = 2 * w;
    win.last = 2 * w + 2;
    win.bytes = 1000 * (w + 1);
    win.memory = 100000 * (w + 1);
    win.tensors.push_back({"blk." + std::to_string(2 * w) + ".attn_q.weight",
                           std::string(64, static_cast<char>('a' + w))});
    ring.push_back(win);
  }
  m.rings.assign(static_cast<size_t>(rings), ring);
  return m;
}

inline ring::NodeKey KeyN(int n) {
  std::array<uint8_t, 32> seed{};
  seed[0] = static_cast<uint8_t>(n);
  seed[1] = static_cast<uint8_t>(n >> 8);
  seed[31] = 0x5a;
  return ring::NodeKey::FromSeed(seed);
}

inline std::string Hex(const ring::NodeKey& k) { return ring::PublicKeyHex(k.public_key()); }

// A signed request as a node would send it, at time `now`.
inline market::ApiRequest Signed(const ring::NodeKey& key, const std::string& method,
                                 const std::string& target, const std::string& body, double now) {
  market::ApiRequest r;
  r.method = method;
  r.target = target;
  r.body = body;
  r.remote_ip = "10.0.0.7";
  for (auto& [k, v] : market::SignRequest(key, method, target, body, static_cast<int64_t>(now))) {
    std::string lower = k;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers[lower] = v;
  }
  return r;
}

inline market::ApiRequest Plain(const std::string& method, const std::string& target,
                                const std::string& body = "") {
  market::ApiRequest r;
  r.method = method;
  r.target = target;
  r.body = body;
  r.remote_ip = "10.0.0.7";
  return r;
}

// A receipt of `tokens` tokens signed in ring order by `keys`, each over windows of 2 layers.
inline ring::Receipt SignedReceipt(const std::vector<const ring::NodeKey*>& keys, uint64_t tokens,
                                   uint8_t id_byte = 1,
                                   const std::string& model_id_hex =
                                       "0123456789abcdef0123456789abcdef") {
  ring::Receipt r;
  r.id.fill(id_byte);
  for (size_t i = 0; i < 16; ++i) {
    r.model_id[i] = static_cast<uint8_t>(std::stoi(model_id_hex.substr(2 * i, 2), nullptr, 16));
  }
  r.session = 7;
  for (size_t i = 0; i < keys.size(); ++i) {
    ring::AppendReceiptLine(&r, *keys[i], static_cast<uint32_t>(2 * i),
                            static_cast<uint32_t>(2 * i + 2), tokens, ring::Digest{});
  }
  return r;
}

inline std::string ReceiptBody(const ring::Receipt& r) {
  const std::vector<uint8_t> bytes = ring::EncodeReceipt(r);
  return nlohmann::json{{"receipt", market::ToHex(std::string_view(
                                        reinterpret_cast<const char*>(bytes.data()), bytes.size()))}}
      .dump();
}

inline nlohmann::json Body(const market::ApiResponse& r) {
  return nlohmann::json::parse(r.body, nullptr, false);
}

// Records the checks of holders the API asks for; Answer() gives them an outcome in the store, as
// the real checker (ring_check.h) would after dialing.
class FakeChecks final : public market::CheckQueue {
 public:
  void Request(const market::CheckJob& job) override { jobs.push_back(job); }
  // Records every requested check as `outcome` at `now`, and forgets them.
  void Answer(market::Store* store, double now, const Status& outcome = Status::Ok()) {
    for (const market::CheckJob& j : jobs) {
      EXPECT_TRUE(store->RecordCheck(j.claim, j.node, j.address, j.epoch, outcome, now).ok());
    }
    jobs.clear();
  }
  std::vector<market::CheckJob> jobs;
};

}  // namespace kvasir::testing
