#include "streaming_clients.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "ring/sampling_wire.h"
#include "ring_test_util.h"

namespace kvasir::testing {

using Clock = std::chrono::steady_clock;

std::string StreamPrompt(int i) {
  const char* prompts[] = {"Once upon a time", "The little dog", "Lily went to the park",
                           "One day, a bird"};
  return prompts[i % 4];
}

SamplingParams StreamSampling(int i, uint64_t seed_base) {
  SamplingParams p = Greedy();
  if (i % 2 == 1) {
    p.temperature = 0.9f;
    p.top_k = 20;
    p.seed = seed_base + static_cast<uint64_t>(i);
  }
  return p;
}

std::vector<ClientRun> StreamWhile(const std::string& head, const ring::ClientOptions& options,
                                   int n, int tokens, int before,
                                   const std::function<void()>& disturb,
                                   const std::function<SamplingParams(int)>& sampling) {
  std::vector<ClientRun> runs(static_cast<size_t>(n));
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ClientRun& r = runs[static_cast<size_t>(i)];
      auto client = ring::RingClient::Connect(head, options);
      if (!client.ok()) {
        r.error = client.status().message();
        seen[static_cast<size_t>(i)] = tokens;
        return;
      }
      ring::GenerateMsg req;
      req.prompt = StreamPrompt(i);
      req.sampling = ring::SamplingToWire(sampling(i), tokens, /*ignore_eog=*/true);
      Clock::time_point last = Clock::now();
      auto res = (*client)->Generate(req, [&](const ring::TokenMsg& t) {
        const auto now = Clock::now();
        if (!r.ids.empty()) {
          r.pause_ms =
              std::max(r.pause_ms, std::chrono::duration<double, std::milli>(now - last).count());
        }
        last = now;
        r.ids.push_back(t.token.id);
        seen[static_cast<size_t>(i)] = static_cast<int>(r.ids.size());
      });
      if (!res.ok()) r.error = res.status().message();
      seen[static_cast<size_t>(i)] = tokens;  // done either way
    });
  }
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  auto all_seen = [&] {
    for (auto& s : seen) {
      if (s.load() < before) return false;
    }
    return true;
  };
  while (!all_seen() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (int i = 0; i < n; ++i) runs[static_cast<size_t>(i)].seen_at_disturb = seen[i].load();
  disturb();
  for (auto& t : threads) t.join();
  return runs;
}

void ExpectUndisturbed(const std::vector<ClientRun>& runs, const std::string& what, int tokens,
                       const std::function<std::vector<int32_t>(int)>& reference) {
  ASSERT_FALSE(runs.empty()) << what;
  for (size_t i = 0; i < runs.size(); ++i) {
    const ClientRun& r = runs[i];
    EXPECT_EQ(r.error, "") << what << ", client " << i;
    EXPECT_LT(r.seen_at_disturb, tokens) << what << ", client " << i << " had finished";
    EXPECT_EQ(r.ids, reference(static_cast<int>(i))) << what << ", client " << i;
    std::printf("%s: client %zu paused %.0f ms (%d tokens before)\n", what.c_str(), i, r.pause_ms,
                r.seen_at_disturb);
  }
}

}  // namespace kvasir::testing
