#include "cli/ring_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "ring/client.h"
#include "ring/sampling_wire.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "bench";

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A prompt of roughly n tokens for SentencePiece vocabularies (about one token per short word).
std::string BenchPrompt(int n) {
  static const char* kWords[] = {"the", "cat", "sat", "on", "a",   "red", "mat",  "and",
                                 "saw", "big", "dog", "in", "sun", "by",  "tree", "."};
  std::string s = "Once upon a time";
  for (int i = 4; i < n; ++i) {
    s += ' ';
    s += kWords[(i * 7) % 16];
  }
  return s;
}

struct Round {
  double wall_ms = 0;
  int tokens = 0;
  std::vector<double> ttft_ms, decode_tps;
};

Result<Round> RunRound(const RingBenchOptions& o, int streams, int round) {
  std::vector<std::future<Result<ring::GenerateResult>>> futures;
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < streams; ++s) {
    futures.push_back(
        std::async(std::launch::async, [&o, s, round]() -> Result<ring::GenerateResult> {
          ring::ClientOptions co = o.client;
          co.connect_timeout_ms = 10000;
          KV_ASSIGN_OR_RETURN(auto client, ring::RingClient::Connect(o.head, co));
          ring::GenerateMsg g;
          // Different text per stream and round, so no two requests are the same work.
          g.prompt = fmt::format("{} {}", BenchPrompt(o.n_prompt - 2), s + round * 97);
          SamplingParams greedy;
          greedy.temperature = 0;
          g.sampling = ring::SamplingToWire(greedy, static_cast<uint32_t>(o.n_gen), true);
          return client->Generate(g, [](const ring::TokenMsg&) {});
        }));
  }
  Round r;
  Status first_error = Status::Ok();
  for (auto& f : futures) {
    auto res = f.get();
    if (!res.ok()) {
      if (first_error.ok()) first_error = res.status();
      continue;
    }
    r.tokens += res->n_generated;
    r.ttft_ms.push_back(res->ttft_ms);
    if (res->n_generated > 1) {
      r.decode_tps.push_back((res->n_generated - 1) * 1e3 / (res->total_ms - res->ttft_ms));
    }
  }
  if (!first_error.ok()) return first_error;
  r.wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

std::string RingBenchUsageError(const RingBenchOptions& o) {
  if (o.streams.empty()) return "--streams needs at least one count";
  for (int s : o.streams) {
    if (s < 1 || s > 256) return fmt::format("--streams {} is not in 1..256", s);
  }
  if (o.n_gen < 2 || o.n_prompt < 4 || o.repetitions < 1) {
    return "a ring bench needs -n >= 2, -p >= 4 and -r >= 1";
  }
  return "";
}

int RunRingBench(const RingBenchOptions& o) {
  if (std::string e = RingBenchUsageError(o); !e.empty()) return UsageError(kCmd, e);
  auto probe = ring::RingClient::Connect(o.head, o.client);
  if (!probe.ok()) return Fail(kCmd, probe.status());
  if (Status s = (*probe)->WaitReady(30000); !s.ok()) return Fail(kCmd, s);
  auto before_msg = (*probe)->StatsMessage();
  if (!before_msg.ok()) return Fail(kCmd, before_msg.status());
  const std::vector<wire::StageStats>* before = &before_msg->records;
  const size_t n_stages = before->size();

  if (auto warm = RunRound(o, 1, -1); !warm.ok()) return Fail(kCmd, warm.status());
  Table table({"streams", "aggregate t/s", "per-stream decode t/s", "TTFT ms", "tokens"},
              {Table::Align::kRight, Table::Align::kRight, Table::Align::kRight,
               Table::Align::kRight, Table::Align::kRight});
  nlohmann::json rows = nlohmann::json::array();
  for (int streams : o.streams) {
    std::vector<double> aggregate, decode, ttft;
    int tokens = 0;
    for (int rep = 0; rep < o.repetitions; ++rep) {
      auto r = RunRound(o, streams, rep);
      if (!r.ok()) return Fail(kCmd, r.status());
      aggregate.push_back(r->tokens * 1e3 / r->wall_ms);
      decode.push_back(Median(r->decode_tps));
      ttft.push_back(Median(r->ttft_ms));
      tokens = r->tokens;
    }
    table.AddRow({std::to_string(streams), fmt::format("{:.1f}", Median(aggregate)),
                  fmt::format("{:.1f}", Median(decode)), fmt::format("{:.1f}", Median(ttft)),
                  std::to_string(tokens)});
    rows.push_back({{"streams", streams},
                    {"aggregate_tokens_per_s", Median(aggregate)},
                    {"per_stream_decode_tokens_per_s", Median(decode)},
                    {"ttft_ms", Median(ttft)},
                    {"samples_aggregate", aggregate}});
  }
  auto after_msg = (*probe)->StatsMessage();
  if (!after_msg.ok()) return Fail(kCmd, after_msg.status());
  const std::vector<wire::StageStats>* after = &after_msg->records;
  // Speculation: what the drafting stage drafted and got accepted during the bench.
  nlohmann::json drafts = nlohmann::json::array();
  std::string draft_line;
  for (size_t i = 0; i < after_msg->drafts.size(); ++i) {
    const wire::DraftStatsWire& a = after_msg->drafts[i];
    const wire::DraftStatsWire b =
        i < before_msg->drafts.size() ? before_msg->drafts[i] : wire::DraftStatsWire{};
    const std::string drafter(a.drafter, strnlen(a.drafter, sizeof(a.drafter)));
    if (drafter.empty()) continue;
    const uint64_t drafted = a.drafted - b.drafted, accepted = a.accepted - b.accepted;
    const double acceptance = drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0;
    drafts.push_back({{"stage", i},
                      {"drafter", drafter},
                      {"steps", a.steps - b.steps},
                      {"drafted", drafted},
                      {"accepted", accepted},
                      {"acceptance", acceptance}});
    draft_line += fmt::format("drafts: {} on stage {}, {} drafted, {} accepted ({:.1f} %)\n",
                              drafter, i, drafted, accepted, 100 * acceptance);
  }
  nlohmann::json hops = nlohmann::json::array();
  Table hop_table(
      {"stage", "layers", "out B/token", "ms/decode token"},
      {Table::Align::kLeft, Table::Align::kLeft, Table::Align::kRight, Table::Align::kRight});
  for (size_t i = 0; i < after->size() && i < n_stages; ++i) {
    const auto& a = (*after)[i];
    const auto& b = (*before)[i];
    const double rows_done = static_cast<double>(a.rows - b.rows);
    const double out_per_row = rows_done > 0 ? (a.bytes_out - b.bytes_out) / rows_done : 0.0;
    const double dec_rows = static_cast<double>(a.decode_rows - b.decode_rows);
    const double ms_per = dec_rows > 0 ? (a.decode_busy_ns - b.decode_busy_ns) / 1e6 / dec_rows : 0;
    const std::string name(a.name, strnlen(a.name, sizeof(a.name)));
    hop_table.AddRow({name, fmt::format("{}:{}", a.window_first, a.window_last),
                      fmt::format("{:.0f}", out_per_row), fmt::format("{:.3f}", ms_per)});
    hops.push_back({{"stage", name},
                    {"first", a.window_first},
                    {"last", a.window_last},
                    {"bytes_out_per_token", out_per_row},
                    {"ms_per_decode_token", ms_per}});
  }
  if (o.json) {
    nlohmann::json j = {{"ring", o.head},   {"stages", n_stages}, {"n_prompt", o.n_prompt},
                        {"n_gen", o.n_gen}, {"rows", rows},       {"hops", hops}};
    if (!o.links.empty()) j["links"] = o.links;
    if (!drafts.empty()) j["drafts"] = drafts;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf(
        "ring %s: %zu stages%s%s, prompt ~%d tokens, %d generated per stream, median of %d\n",
        o.head.c_str(), n_stages, o.links.empty() ? "" : ", ", o.links.c_str(), o.n_prompt, o.n_gen,
        o.repetitions);
    std::fputs(table.Render().c_str(), stdout);
    std::fputs(hop_table.Render().c_str(), stdout);
    std::fputs(draft_line.c_str(), stdout);
  }
  return kExitOk;
}

}  // namespace kvasir::cli
