#include "cli/ring_cli.h"

#include <unistd.h>

#include <cstdio>

#include "base/mapped_file.h"
#include "cli/cli_util.h"
#include "kernels/kernels.h"
#include "node/progress.h"
#include "ring/sampling_wire.h"
#include "tokenizer/tokenizer.h"

namespace kvasir::cli {
namespace {

double PerSecond(double n, double ms) { return ms > 0 ? n * 1e3 / ms : 0.0; }

double DecodeRate(const ring::GenerateResult& r) {
  return r.n_generated > 1 ? PerSecond(r.n_generated - 1, r.total_ms - r.ttft_ms) : 0.0;
}

std::string StageName(const wire::StageStats& s) {
  return std::string(s.name, strnlen(s.name, sizeof(s.name)));
}

}  // namespace

Result<RingRun> RunRingRequest(const RingRequest& req, bool with_stage_stats) {
  KV_ASSIGN_OR_RETURN(auto client, ring::RingClient::Connect(req.head, req.client));
  // Time to first token should measure the request, not the ring's start-up.
  KV_RETURN_IF_ERROR(client->WaitReady(req.client.connect_timeout_ms));
  RingRun run;
  if (req.n_predict == 0) {  // as a local run: the prompt alone, no token
    run.result.reason = wire::FinishReason::kMaxTokens;
    if (with_stage_stats) {
      KV_ASSIGN_OR_RETURN(ring::StatsMsg stats, client->StatsMessage());
    run.stages = std::move(stats.records);
    run.drafts = std::move(stats.drafts);
    run.repairs = std::move(stats.repairs);
    }
    return run;
  }
  ring::GenerateMsg g;
  g.sampling = ring::SamplingToWire(req.sampling, static_cast<uint32_t>(req.n_predict),
                                    req.ignore_eos);
  g.prompt = req.prompt;
  g.stops = req.stops;
  g.add_special = true;
  if (!req.grammar.empty()) {
    g.sampling.flags |= wire::kSamplingGrammar;
    g.extra.grammar = req.grammar;
  }
  Utf8Stream utf8;
  auto write = [](const std::string& s) {
    if (s.empty()) return;
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  KV_ASSIGN_OR_RETURN(run.result,
                      client->Generate(g, [&](const ring::TokenMsg& t) { write(utf8.Push(t.piece)); }));
  write(utf8.Flush());
  if (run.result.reason == wire::FinishReason::kEog) run.result.n_generated--;  // not text
  // End the text's line when the summary that follows on stderr would otherwise join it.
  if (run.result.n_generated > 0 && (isatty(STDOUT_FILENO) || node::StdoutIsStderr())) write("\n");
  if (with_stage_stats) {
    KV_ASSIGN_OR_RETURN(ring::StatsMsg stats, client->StatsMessage());
    run.stages = std::move(stats.records);
    run.drafts = std::move(stats.drafts);
    run.repairs = std::move(stats.repairs);
  }
  return run;
}

void PrintRingSummary(const RingRun& run, int n_threads) {
  const ring::GenerateResult& r = run.result;
  std::fprintf(stderr,
               "prompt:    %d tokens, %.2f tok/s; time to first token %.1f ms\n"
               "generated: %d tokens, %.2f tok/s (ring of %zu stages, %d threads each, %s); "
               "stop: %s\n",
               r.n_prompt, PerSecond(r.n_prompt, r.ttft_ms), r.ttft_ms, r.n_generated,
               DecodeRate(r), run.stages.size(), n_threads, SimdTargetName().c_str(),
               wire::FinishReasonName(static_cast<uint8_t>(r.reason)));
}

void PrintStageTable(const std::vector<wire::StageStats>& stages,
                     const std::map<int, std::string>& devices,
                     const std::vector<wire::RepairStatsWire>& repairs) {
  using A = Table::Align;
  std::vector<std::string> header = {"stage",      "layers",      "weights", "RSS",
                                     "in B/token", "out B/token", "ms/token"};
  std::vector<A> align = {A::kLeft,  A::kLeft,  A::kRight, A::kRight,
                          A::kRight, A::kRight, A::kRight};
  if (!devices.empty()) {
    header.insert(header.begin() + 2, "backend (device)");
    align.insert(align.begin() + 2, A::kLeft);
  }
  const bool with_repairs = repairs.size() == stages.size() && !repairs.empty();
  if (with_repairs) {
    header.insert(header.end(), {"replayed kept/run", "repairs (max pause)"});
    align.insert(align.end(), {A::kRight, A::kRight});
  }
  Table t(header, align);
  for (const auto& s : stages) {
    const double rows = s.rows > 0 ? static_cast<double>(s.rows) : 1.0;
    const double ms_tok = s.decode_rows > 0 ? s.decode_busy_ns / 1e6 / s.decode_rows : 0.0;
    std::vector<std::string> row = {StageName(s),
                                    fmt::format("{}:{}", s.window_first, s.window_last),
                                    HumanBytes(s.weight_bytes),
                                    HumanBytes(s.rss_bytes),
                                    fmt::format("{:.0f}", s.bytes_in / rows),
                                    fmt::format("{:.0f}", s.bytes_out / rows),
                                    fmt::format("{:.2f}", ms_tok)};
    if (!devices.empty()) {
      auto it = devices.find(static_cast<int>(s.window_first));
      row.insert(row.begin() + 2, it == devices.end() ? "?" : it->second);
    }
    if (with_repairs) {
      const wire::RepairStatsWire& r = repairs[static_cast<size_t>(&s - stages.data())];
      row.push_back(fmt::format("{}/{}", r.kept, r.recomputed));
      row.push_back(r.repairs > 0 ? fmt::format("{} ({} ms)", r.repairs, r.pause_ms_max) : "");
    }
    t.AddRow(std::move(row));
  }
  std::fputs(t.Render().c_str(), stderr);
}

void PrintDraftSummary(const RingRun& run) {
  for (const wire::DraftStatsWire& d : run.drafts) {
    const std::string name(d.drafter, strnlen(d.drafter, sizeof(d.drafter)));
    if (name.empty()) continue;
    std::fprintf(stderr,
                 "drafts:    %s on the last stage, %llu drafted, %llu accepted (%.1f %%) in %llu "
                 "verify chunks\n",
                 name.c_str(), static_cast<unsigned long long>(d.drafted),
                 static_cast<unsigned long long>(d.accepted),
                 d.drafted > 0 ? 100.0 * static_cast<double>(d.accepted) / d.drafted : 0.0,
                 static_cast<unsigned long long>(d.steps));
  }
}

nlohmann::json RingStatsJson(const std::string& model, const RingRun& run, int n_threads) {
  const ring::GenerateResult& r = run.result;
  nlohmann::json stages = nlohmann::json::array();
  for (size_t i = 0; i < run.stages.size(); ++i) {
    const wire::StageStats& s = run.stages[i];
    stages.push_back({{"name", StageName(s)},
                      {"first", s.window_first},
                      {"last", s.window_last},
                      {"weight_bytes", s.weight_bytes},
                      {"rss_bytes", s.rss_bytes},
                      {"bytes_in", s.bytes_in},
                      {"bytes_out", s.bytes_out},
                      {"rows", s.rows},
                      {"decode_rows", s.decode_rows},
                      {"busy_ms", s.busy_ns / 1e6},
                      {"decode_ms_per_token",
                       s.decode_rows > 0 ? s.decode_busy_ns / 1e6 / s.decode_rows : 0.0}});
    if (i < run.drafts.size() && run.drafts[i].drafter[0] != '\0') {
      const wire::DraftStatsWire& d = run.drafts[i];
      stages.back()["draft"] = {
          {"drafter", std::string(d.drafter, strnlen(d.drafter, sizeof(d.drafter)))},
          {"steps", d.steps},
          {"drafted", d.drafted},
          {"accepted", d.accepted},
          {"acceptance", d.drafted > 0 ? static_cast<double>(d.accepted) / d.drafted : 0.0}};
    }
    if (i < run.repairs.size()) {
      const wire::RepairStatsWire& rp = run.repairs[i];
      stages.back()["repair"] = {
          {"sessions_replayed", rp.repairs},       {"positions_kept", rp.kept},
          {"positions_recomputed", rp.recomputed}, {"pauses", rp.pauses},
          {"pause_ms_total", rp.pause_ms_total},   {"pause_ms_max", rp.pause_ms_max}};
    }
  }
  return {{"model", model},
          {"n_prompt", r.n_prompt},
          {"n_generated", r.n_generated},
          {"prefill_tokens_per_s", PerSecond(r.n_prompt, r.ttft_ms)},
          {"decode_tokens_per_s", DecodeRate(r)},
          {"ttft_ms", r.ttft_ms},
          {"total_ms", r.total_ms},
          {"threads", n_threads},
          {"simd_target", SimdTargetName()},
          {"stop_reason", wire::FinishReasonName(static_cast<uint8_t>(r.reason))},
          {"stages", stages}};
}

}  // namespace kvasir::cli
