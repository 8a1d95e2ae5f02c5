// `kvasir join`: finding a window in the market's map and claiming it (joiner_impl.h).
#include <fmt/format.h>

#include <random>
#include <set>

#include "base/human.h"
#include "base/log.h"
#include "market/api.h"
#include "market/joiner_impl.h"

namespace kvasir::market {

using nlohmann::json;

Result<Grant> ParseGrant(const json& j) {
  Grant g;
  try {
    g.claim = j.at("claim").get<int64_t>();
    g.model = j.at("model").get<std::string>();
    g.model_id = j.at("model_id").get<std::string>();
    g.url = j.at("url").get<std::string>();
    g.ring = j.at("ring").get<int>();
    g.window = j.at("window").get<int>();
    g.first = j.at("first").get<int>();
    g.last = j.at("last").get<int>();
    g.n_layer = j.at("n_layer").get<int>();
    g.ctx = j.at("ctx").get<int>();
    g.lease_s = j.at("lease_s").get<double>();
    for (const auto& t : j.at("tensors")) {
      g.sha256[t.at("name").get<std::string>()] = t.at("sha256").get<std::string>();
    }
  } catch (const std::exception& e) {
    return Error("the market's claim answer is malformed: {}", e.what());
  }
  if (!ValidName(g.model) || g.first < 0 || g.last <= g.first || g.last > g.n_layer) {
    return Error("the market's claim answer names an impossible window");
  }
  return g;
}

Result<Grant> Joiner::Impl::FindAndClaim() {
  std::string said;  // the last waiting message, so it is logged once per change
  auto say = [&](const std::string& what, bool warn) {
    {
      std::lock_guard<std::mutex> lock(mu);
      state.waiting = what;
    }
    if (what == said) return;
    said = what;
    if (warn)
      KV_LOG_WARN("join: {}", what);
    else
      KV_LOG_INFO("join: {}", what);
  };
  std::mt19937_64 rng(std::random_device{}());
  while (!stopping) {
    auto map = client->Get("/v1/map");
    {
      std::lock_guard<std::mutex> lock(mu);
      ++state.maps_read;
    }
    if (!map.ok()) {
      say(fmt::format("cannot read the map: {}; retrying", map.status().message()), true);
      Sleep(o.poll_s);
      continue;
    }
    struct Candidate {
      double reward;
      std::string model;
      int ring, window;
      uint64_t memory;
      size_t standbys = 0;
    };
    std::vector<Candidate> fits;
    uint64_t smallest = 0;
    int uncovered = 0;
    try {
      const bool relay = !map->value("relay", std::string()).empty();
      for (const auto& m : map->at("models")) {
        const std::string name = m.at("name").get<std::string>();
        if (!o.model.empty() && name != o.model) continue;
        for (const auto& r : m.at("rings")) {
          for (const auto& w : r.at("windows")) {
            // A standby wants a held window other than the head's; a claimer an uncovered one.
            const int window = w.at("window").get<int>();
            if ((w.at("state").get<std::string>() == "uncovered") == o.standby) continue;
            if (o.standby && window == 0) continue;
            if (o.behind_nat && (window == 0 || !relay)) continue;
            ++uncovered;
            const uint64_t memory = w.at("memory").get<uint64_t>();
            if (smallest == 0 || memory < smallest) smallest = memory;
            if (memory > o.memory_bytes) continue;
            fits.push_back({w.at("reward").get<double>(), name, r.at("ring").get<int>(), window,
                            memory, w.contains("standbys") ? w.at("standbys").size() : 0});
          }
        }
      }
    } catch (const std::exception& e) {
      say(fmt::format("the market's map is malformed: {}", e.what()), true);
      Sleep(o.poll_s);
      continue;
    }
    if (fits.empty()) {
      if (uncovered > 0) {
        say(fmt::format("no uncovered window fits --memory {} (the smallest of {} needs {}); "
                        "waiting",
                        HumanBytes(o.memory_bytes), uncovered, HumanBytes(smallest)),
            false);
      } else {
        say(o.standby      ? "no held window (but the head's) to stand by for; waiting"
            : o.behind_nat ? "no window a node behind NAT can take is uncovered (the head needs "
                             "an address); waiting"
                           : "every window is held; waiting for one to free up",
            false);
      }
      Sleep(o.poll_s);
      continue;
    }
    std::stable_sort(fits.begin(), fits.end(), [](const Candidate& a, const Candidate& b) {
      // A standby goes where it is needed most: no standby yet, then the fewest.
      if (a.standbys != b.standbys) return a.standbys < b.standbys;
      if (a.reward != b.reward) return a.reward > b.reward;
      if (a.model != b.model) return a.model < b.model;
      if (a.ring != b.ring) return a.ring < b.ring;
      return a.window < b.window;
    });
    for (const Candidate& c : fits) {
      // Nodes that start together spread out instead of all racing for the same window.
      Sleep(std::uniform_real_distribution<double>(0.0, 1.0)(rng));
      if (stopping) break;
      json body = {{"model", c.model}, {"ring", c.ring}, {"window", c.window}};
      if (o.standby) body["standby"] = true;
      if (o.behind_nat) {
        body["behind_nat"] = true;
      } else {
        body["address"] = o.advertise.empty() ? fmt::format(":{}", listener->port()) : o.advertise;
      }
      auto grant = client->PostSigned("/v1/claims", body);
      if (grant.ok()) return ParseGrant(*grant);
      if (grant.status().code() == StatusCode::kConflict) {
        KV_LOG_INFO("join: window {} of ring {} of {} went to another node; trying the next",
                    c.window, c.ring, c.model);
        continue;
      }
      say(fmt::format("claim refused: {}", grant.status().message()), true);
      break;
    }
    Sleep(o.poll_s);
  }
  return Error("stopped");
}

}  // namespace kvasir::market
