// /metrics in Prometheus' text format: every family announced with HELP and TYPE, cumulative
// histogram buckets, the ring's stages as labelled gauges, label values escaped.
#include "serve/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

namespace kvasir::serve {
namespace {

using ::testing::HasSubstr;

wire::StageStats Stage(const char* name, int first, int last) {
  wire::StageStats s{};
  std::strncpy(s.name, name, sizeof(s.name) - 1);
  std::strncpy(s.backend, "cpu", sizeof(s.backend) - 1);
  s.window_first = first;
  s.window_last = last;
  s.decode_rows = 10;
  s.decode_busy_ns = 25'000'000;
  s.sessions_open = 2;
  return s;
}

TEST(MetricsTest, CountersHistogramAndStages) {
  Metrics m;
  m.CountRequest("/v1/completions", 200);
  m.CountRequest("/v1/completions", 200);
  m.CountRequest("/v1/completions", 400);
  m.CountTokens(5, 16);
  m.ObserveFirstToken(0.02);
  m.ObserveFirstToken(3.0);
  m.ObserveDecode(15, 0.5);
  MetricsGauges g;
  g.ring_up = true;
  g.sessions_busy = 3;
  g.sessions_deferred = 1;
  g.max_sessions = 16;
  g.stages = {Stage("stage0", 0, 2), Stage("we\"ird\\", 2, 5)};
  const std::string text = m.Render(g);
  EXPECT_THAT(text,
              HasSubstr("kvasir_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("kvasir_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_prompt_tokens_total 5\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_generated_tokens_total 16\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_time_to_first_token_seconds_bucket{le=\"0.01\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_time_to_first_token_seconds_bucket{le=\"5\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_time_to_first_token_seconds_count 2\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_decode_tokens_per_second 30.000\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_sessions_busy 3\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_sessions_deferred 1\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_ring_up 1\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_stage_decode_ms_per_token{stage=\"stage0\",layers=\"0:2\","
                              "backend=\"cpu\"} 2.5000\n"));
  EXPECT_THAT(text, HasSubstr("kvasir_stage_sessions_open{stage=\"we\\\"ird\\\\\",layers=\"2:5\","
                              "backend=\"cpu\"} 2\n"));
  // Every sample belongs to a family announced before it.
  std::istringstream lines(text);
  std::string line, family;
  while (std::getline(lines, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      family = line.substr(7, line.find(' ', 7) - 7);
    } else if (line[0] != '#') {
      EXPECT_EQ(line.rfind(family, 0), 0u) << line;
    }
  }
}

TEST(MetricsTest, ARingThatIsDownHasNoStages) {
  Metrics m;
  const std::string text = m.Render(MetricsGauges{});
  EXPECT_THAT(text, HasSubstr("kvasir_ring_up 0\n"));
  EXPECT_EQ(text.find("kvasir_stage_"), std::string::npos);
}

}  // namespace
}  // namespace kvasir::serve
