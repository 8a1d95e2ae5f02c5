// Client side of a ring shared by `kvasir generate --ring` and `kvasir run`: send one request to the
// head, stream the text to stdout, and summarise the run (and each stage) for stderr and --stats.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/sampler.h"
#include "ring/client.h"

namespace kvasir::cli {

struct RingRequest {
  std::string head;        // HOST:PORT of the head stage
  std::string prompt;
  int n_predict = 128;
  SamplingParams sampling;
  bool ignore_eos = false;
  std::vector<std::string> stops;
  std::string grammar;         // grammar text the ring's last stage enforces ("": none)
  ring::ClientOptions client;  // how the head is reached and authenticated
};

struct RingRun {
  ring::GenerateResult result;
  std::vector<wire::StageStats> stages;  // empty unless requested
  std::vector<wire::DraftStatsWire> drafts;  // one per stage when a stage drafts, else empty
  // One per stage when a stage has replayed a session (docs/PROTOCOL.md, "Repair"), else empty.
  std::vector<wire::RepairStatsWire> repairs;
};

// Connects, generates (streaming the text to stdout), and optionally collects the stages' stats.
Result<RingRun> RunRingRequest(const RingRequest& request, bool with_stage_stats);

// The summary lines `generate` prints to stderr.
void PrintRingSummary(const RingRun& run, int n_threads);
// Per-stage table (layers, weights, RSS, bytes in/out per token, ms per decode token) to stderr.
// `devices`, when given, names each stage's backend and device by the first layer of its window
// (the stages of `kvasir run` are local, so their devices are known here). `repairs`, when given
// (one per stage), adds the replayed positions each stage kept and ran again, and the head's
// repairs with the longest pause a client saw.
void PrintStageTable(const std::vector<wire::StageStats>& stages,
                     const std::map<int, std::string>& devices = {},
                     const std::vector<wire::RepairStatsWire>& repairs = {});
// The drafting line of a ring whose last stage drafts (to stderr; nothing otherwise).
void PrintDraftSummary(const RingRun& run);
// The same as JSON: generate's stats fields plus "stages" (each with "draft" when it drafts: its
// drafter, verify steps, drafted and accepted tokens, acceptance; and "repair" when a stage has
// replayed a session: sessions replayed, positions kept and run again, the pauses clients saw).
nlohmann::json RingStatsJson(const std::string& model, const RingRun& run, int n_threads);

}  // namespace kvasir::cli
