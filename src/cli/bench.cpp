// kvasir bench: prefill and decode speed of a model. Each repetition prefills -p fixed
// pseudo-random tokens in one Forward, then runs -n greedy decode steps feeding each pick back;
// one warm-up repetition runs first and is not counted. Prints a llama-bench-like table or JSON.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "cli/backend_flag.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/draft_flags.h"
#include "cli/hop_delay.h"
#include "cli/ring_bench.h"
#include "cli/ring_options.h"
#include "kernels/kernels.h"
#include "model/arch/registry.h"
#include "model/sampler.h"
#include "node/supervised_ring.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "bench";

struct BenchOptions {
  std::string model_path;
  int n_threads = 1;
  std::string backend = "cpu";
  int n_prompt = 128;
  int n_gen = 64;
  int repetitions = 5;
  bool json = false;
};

// Tokens per second of each counted repetition.
struct Samples {
  std::vector<double> values;
  double Median() const {
    if (values.empty()) return 0.0;
    std::vector<double> v = values;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }
  double Min() const {
    return values.empty() ? 0.0 : *std::min_element(values.begin(), values.end());
  }
  double Max() const {
    return values.empty() ? 0.0 : *std::max_element(values.begin(), values.end());
  }
  nlohmann::json Json() const {
    return {{"median", Median()}, {"min", Min()}, {"max", Max()}, {"samples", values}};
  }
};

// Fixed pseudo-random ids in [0, n_vocab) (a linear congruential sequence: same ids every run).
std::vector<int32_t> BenchTokens(int n, int n_vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t state = 0x2545F4914F6CDD1DULL;
  for (int32_t& id : ids) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    id = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(n_vocab));
  }
  return ids;
}

// One repetition: returns prefill and decode tokens/s (0 when that phase has no tokens).
Status RunOnce(LayerWindow& window, const std::vector<int32_t>& prompt, int n_gen,
               double* prefill_tps, double* decode_tps) {
  window.CloseSequence(0);
  KV_RETURN_IF_ERROR(window.OpenSequence(0));
  ForwardInput in;
  ForwardOutput out;
  Stopwatch clock;
  in.chunks = {SeqChunk{0, 0, static_cast<int>(prompt.size())}};
  in.tokens = prompt;
  KV_RETURN_IF_ERROR(window.Forward(in, &out).WithContext("prefill"));
  const double prefill_s = clock.Seconds();
  *prefill_tps = prefill_s > 0 ? prompt.size() / prefill_s : 0.0;

  clock.Reset();
  int32_t next = 0;
  for (int i = 0; i < n_gen; ++i) {
    next = ArgMax(out.logits);
    in.chunks = {SeqChunk{0, static_cast<int>(prompt.size()) + i, 1}};
    in.tokens = std::span<const int32_t>(&next, 1);
    KV_RETURN_IF_ERROR(window.Forward(in, &out).WithContext(fmt::format("decode step {}", i)));
  }
  const double decode_s = clock.Seconds();
  *decode_tps = n_gen > 0 && decode_s > 0 ? n_gen / decode_s : 0.0;
  window.CloseSequence(0);
  return Status::Ok();
}

std::string Rate(const Samples& s) {
  return fmt::format("{:.2f} ({:.2f} .. {:.2f})", s.Median(), s.Min(), s.Max());
}

std::string TypesText(const GgufFile& file) {
  std::string s;
  for (const auto& [type, bytes] : BytesPerType(file)) {
    s += fmt::format("{}{} {}", s.empty() ? "" : ", ", type, HumanBytes(bytes));
  }
  return s;
}

int RunBench(const BenchOptions& o) {
  if (o.n_threads < 1)
    return UsageError(kCmd, fmt::format("-t must be >= 1 (got {})", o.n_threads));
  if (o.n_prompt < 1) return UsageError(kCmd, fmt::format("-p must be >= 1 (got {})", o.n_prompt));
  if (o.n_gen < 0) return UsageError(kCmd, fmt::format("-n must be >= 0 (got {})", o.n_gen));
  if (o.repetitions < 1) {
    return UsageError(kCmd, fmt::format("-r must be >= 1 (got {})", o.repetitions));
  }
  if (auto code = CheckBackendFlag(kCmd, "--backend", o.backend)) return *code;
  auto model = LoadModel(o.model_path, o.n_prompt + o.n_gen, o.n_threads, false, o.backend);
  if (!model.ok()) return Fail(kCmd, model.status());
  LayerWindow& window = *model->window;
  const std::vector<int32_t> prompt = BenchTokens(o.n_prompt, window.config().n_vocab);

  Samples prefill, decode;
  for (int r = 0; r <= o.repetitions; ++r) {
    double p = 0, d = 0;
    if (Status st = RunOnce(window, prompt, o.n_gen, &p, &d); !st.ok()) {
      return Fail(kCmd, WithPath(st, o.model_path));
    }
    if (r == 0) continue;  // warm-up
    prefill.values.push_back(p);
    decode.values.push_back(d);
  }

  const GgufFile& file = *model->file;
  const uint64_t model_bytes = TensorBytes(file);
  const uint64_t params = TensorElements(file);
  const std::string simd = SimdTargetName();
  const std::string name = model->window->config().name.empty() ? model->window->config().arch
                                                                : model->window->config().name;
  if (o.json) {
    nlohmann::json types = nlohmann::json::object();
    for (const auto& [type, bytes] : BytesPerType(file)) types[type] = bytes;
    nlohmann::json j = {{"model", o.model_path},
                        {"model_name", name},
                        {"model_bytes", model_bytes},
                        {"params", params},
                        {"bytes_per_type", types},
                        {"threads", o.n_threads},
                        {"backend", window.device().address},
                        {"device", window.device().name},
                        {"simd_target", simd},
                        {"n_prompt", o.n_prompt},
                        {"n_gen", o.n_gen},
                        {"repetitions", o.repetitions},
                        {"prefill_tokens_per_s", prefill.Json()},
                        {"decode_tokens_per_s", decode.Json()},
                        {"peak_rss_bytes", PeakRssBytes()}};
    std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    std::fwrite(text.data(), 1, text.size(), stdout);
    return kExitOk;
  }
  using A = Table::Align;
  Table table({"model", "size", "params", "threads", "test", "t/s (median, min .. max)"},
              {A::kLeft, A::kRight, A::kRight, A::kRight, A::kRight, A::kRight});
  table.AddRow({OneLine(name, 40), HumanBytes(model_bytes), HumanCount(params),
                std::to_string(o.n_threads), fmt::format("pp{}", o.n_prompt), Rate(prefill)});
  if (o.n_gen > 0) {
    table.AddRow({OneLine(name, 40), HumanBytes(model_bytes), HumanCount(params),
                  std::to_string(o.n_threads), fmt::format("tg{}", o.n_gen), Rate(decode)});
  }
  std::string text = table.Render(/*markdown=*/true);
  text += fmt::format(
      "\nbackend: {} ({})   simd: {}   types: {}   peak RSS: {}   repetitions: {} (+1 warm-up)\n",
      window.device().address, window.device().name, simd, TypesText(file),
      HumanBytes(PeakRssBytes()), o.repetitions);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return kExitOk;
}

// `bench -m MODEL --stages N`: the ring bench on a local ring this process starts and stops.
int RunLocalRingBench(const std::string& model, int n_stages, int threads,
                      const std::string& backend, const std::optional<net::LinkShape>& hops,
                      const DraftFlags& draft, RingBenchOptions ring) {
  auto file = OpenGguf(model);
  if (!file.ok()) return Fail(kCmd, file.status());
  auto cfg = LoadModelConfig(**file);
  if (!cfg.ok()) return Fail(kCmd, cfg.status());
  if (Status d = CheckDraftForModel(draft, *cfg); !d.ok()) return UsageError(kCmd, d.message());
  if (n_stages < 1 || n_stages > cfg->n_layer) {
    return UsageError(kCmd, fmt::format("--stages {} must be between 1 and the model's {} layers",
                                        n_stages, cfg->n_layer));
  }
  node::LocalRingPlan plan;
  plan.model_path = model;
  plan.n_stages = n_stages;
  plan.threads_per_stage = threads;
  plan.backends = {backend};
  plan.stage_log_level = "error";
  for (int s : ring.streams) plan.max_sessions = std::max(plan.max_sessions, s);
  plan.hops = hops;
  auto draft_options = CheckDraftFlags(draft);
  if (!draft_options.ok()) return Fail(kCmd, draft_options.status());
  plan.draft = *draft_options;
  plan.draft_args = DraftStageArgs(draft);
  auto local = node::SupervisedRing::Start(plan, cfg->n_layer, nullptr);
  if (!local.ok()) return Fail(kCmd, local.status());
  ring.head = (*local)->head();
  ring.client.ring_secret = (*local)->secret();
  ring.links = HopText(hops);
  const int code = RunRingBench(ring);
  (*local)->Stop();
  return code;
}

}  // namespace

int BenchMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{"Measure prefill and decode tokens/s of a model.", "kvasir bench"};
    BenchOptions o;
    o.n_threads = DefaultThreads();
    RingBenchOptions ring;
    app.add_option("-m,--model", o.model_path, "GGUF model file");
    app.add_option("--ring", ring.head, "benchmark a running ring instead: HOST:PORT of its head");
    app.add_option("--streams", ring.streams,
                   "(with --ring or --stages) concurrent streams to measure")
        ->delimiter(',')
        ->capture_default_str();
    app.add_option("-t,--threads", o.n_threads, "threads (with --stages: per stage)")
        ->capture_default_str();
    AddBackendFlag(app, &o.backend);
    app.add_option("-p,--n-prompt", o.n_prompt, "prompt tokens per prefill")->capture_default_str();
    app.add_option("-n,--n-gen", o.n_gen, "decode steps")->capture_default_str();
    app.add_option("-r,--repetitions", o.repetitions, "counted repetitions")->capture_default_str();
    app.add_flag("--json", o.json, "print one JSON object instead of a table");
    TrustFlags trust;
    AddClientTrustFlags(app, &trust);
    int n_stages = 0;
    app.add_option("--stages", n_stages,
                   "benchmark a local ring of this many stage processes on -m (even split, -t "
                   "threads each), as --ring does a running one")
        ->capture_default_str();
    HopFlags hop_flags;
    AddHopFlags(app, &hop_flags);
    DraftFlags draft_flags;
    AddDraftFlags(app, &draft_flags);
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (Status d = CheckDraftFlags(draft_flags).status(); !d.ok()) {
      return UsageError(kCmd, d.message());
    }
    if (draft_flags.kind != "none" && n_stages == 0) {
      return UsageError(kCmd, "--draft needs --stages (the ring's last stage drafts)");
    }
    auto hops = HopShape(hop_flags);
    if (!hops.ok()) return UsageError(kCmd, hops.status().message());
    if (*hops && n_stages == 0) return UsageError(kCmd, "the --hop-* flags need --stages");
    if (n_stages != 0) {
      if (!ring.head.empty()) return UsageError(kCmd, "use either --stages or --ring, not both");
      if (o.model_path.empty()) return UsageError(kCmd, "--stages needs a model: -m MODEL");
      if (o.n_threads < 1) return UsageError(kCmd, "-t must be >= 1");
      // The local ring makes its own secret and keys: a client identity flag would go unused.
      if (!trust.ring_secret_file.empty() || !trust.head_key.empty() ||
          !trust.client_key_file.empty() || trust.insecure) {
        return UsageError(kCmd,
                          "--stages starts a ring with its own secret: drop --ring-secret-file, "
                          "--head-key, --client-key-file and --insecure");
      }
      bool usage = false;
      if (Status s = ApplyClientTrust(trust, nullptr, &ring.client, &usage); !s.ok()) {
        return usage ? UsageError(kCmd, s.message()) : Fail(kCmd, s);
      }
      if (auto code = CheckBackendFlag(kCmd, "--backend", o.backend)) return *code;
      ring.n_prompt = o.n_prompt;
      ring.n_gen = o.n_gen;
      ring.repetitions = o.repetitions;
      ring.json = o.json;
      if (std::string e = RingBenchUsageError(ring); !e.empty()) return UsageError(kCmd, e);
      return RunLocalRingBench(o.model_path, n_stages, o.n_threads, o.backend, *hops, draft_flags,
                               std::move(ring));
    }
    if (!ring.head.empty()) {
      if (!o.model_path.empty()) return UsageError(kCmd, "use either -m or --ring, not both");
      bool usage = false;
      if (Status s = ApplyClientTrust(trust, nullptr, &ring.client, &usage); !s.ok()) {
        return usage ? UsageError(kCmd, s.message()) : Fail(kCmd, s);
      }
      ring.n_prompt = o.n_prompt;
      ring.n_gen = o.n_gen;
      ring.repetitions = o.repetitions;
      ring.json = o.json;
      return RunRingBench(ring);
    }
    if (o.model_path.empty()) return UsageError(kCmd, "a model is required: -m MODEL (or --ring)");
    return RunBench(o);
  });
}

}  // namespace kvasir::cli
