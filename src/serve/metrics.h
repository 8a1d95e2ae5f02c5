// The counters of `kvasir serve` and their Prometheus text exposition (GET /metrics, format
// 0.0.4): requests by endpoint and status, prompt and generated tokens, time to first token (a
// histogram), decode time and tokens per second, sessions busy and deferred, and per stage of the
// ring its window, backend, open sessions and milliseconds per decode token. Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ring/wire.h"

namespace kvasir::serve {

// What the server knows at the moment of a scrape, besides the counters.
struct MetricsGauges {
  bool ring_up = false;
  int sessions_busy = 0;      // requests running on the ring
  int sessions_deferred = 0;  // requests waiting for a place
  int max_sessions = 0;
  std::vector<wire::StageStats> stages;  // the ring's last statistics, in ring order
};

class Metrics {
 public:
  void CountRequest(const std::string& endpoint, int status);
  void CountTokens(int64_t prompt, int64_t generated, int64_t cached = 0);
  void ObserveFirstToken(double seconds);
  // `tokens` generated after the first one, in `seconds`.
  void ObserveDecode(int64_t tokens, double seconds);
  std::string Render(const MetricsGauges& gauges) const;

  static constexpr std::array<double, 11> kFirstTokenBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                                0.5,   1,    2.5,   5,    10};

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0, cached_tokens_ = 0;
  std::array<uint64_t, kFirstTokenBuckets.size()> ttft_buckets_{};
  uint64_t ttft_count_ = 0;
  double ttft_sum_ = 0;
  uint64_t decode_tokens_ = 0;
  double decode_seconds_ = 0;
};

// A Prometheus label value: backslash, double quote and newline escaped.
std::string PrometheusLabel(const std::string& value);

}  // namespace kvasir::serve
