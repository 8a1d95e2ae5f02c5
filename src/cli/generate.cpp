// kvasir generate: text from a prompt with a local model. The prompt is prefilled in one Forward;
// then each sampled token is streamed to stdout (whole UTF-8 characters only) and fed back, until
// -n tokens, an end-of-generation token, or the end of the context. With --draft, each step feeds
// the last token plus up to --draft-max drafted ones and keeps those the sampler accepts
// (spec/decoder.h): greedy output is unchanged, sampled output keeps its distribution.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "base/mapped_file.h"
#include "cli/backend_flag.h"
#include "cli/chat_prompt.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/grammar_flags.h"
#include "cli/ring_cli.h"
#include "cli/ring_options.h"
#include "kernels/kernels.h"
#include "market/market_client.h"
#include "model/sampler.h"
#include "node/progress.h"
#include "ring/sampling_wire.h"
#include "ring/tail_sampler.h"
#include "ring/vocab_trie.h"
#include "spec/decoder.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "generate";

struct GenerateOptions {
  std::string model_path;
  std::string prompt;
  int n_predict = 128;
  SamplingParams sampling;
  std::optional<uint64_t> seed;
  int n_threads = 1;
  std::string backend = "cpu";
  AttnType attn_type = AttnType::kF32;
  int n_ctx = 0;
  std::string stats_path;
  bool ignore_eos = false;
  std::string ring;                // HOST:PORT of a ring's head: generate there instead
  std::string market;              // a market to ask for a ready ring of the model named by -m
  double market_wait_s = 30;       // how long to wait for a ring to become ready
  std::string market_ca;           // PEM certificates to trust for an https:// market
  std::vector<std::string> stops;  // ring only: stop strings
  TrustFlags trust;                // ring only: how the head is authenticated
  std::string manifest_path;       // ring only: a manifest whose rank 0 names the head's key
  ChatFlags chat;                  // -p as a user message in the model's chat template
  std::string draft = "none";      // --draft: auto, mtp, ngram, model or none
  spec::DraftOptions drafting;     // --draft-model, --draft-max
  GrammarFlags grammar_flags;      // --grammar-file, --json-schema-file
  std::string grammar;             // their grammar text, loaded
};

struct GenerateStats {
  int n_prompt = 0;
  int n_generated = 0;
  int n_decode_steps = 0;   // Forward calls after the prefill
  int n_decode_tokens = 0;  // tokens those calls decided (an end-of-generation one included)
  std::string drafter;      // "" without speculation
  spec::DraftStats draft;
  double load_ms = 0;
  double prefill_ms = 0;
  double decode_ms = 0;
  double ttft_ms = 0;
  double total_ms = 0;
  std::string stop_reason;
};

double PerSecond(int n, double ms) { return ms > 0 ? n * 1e3 / ms : 0.0; }

std::optional<std::string> CheckOptions(const GenerateOptions& o) {
  if (o.n_predict < 0) return fmt::format("-n must be >= 0 (got {})", o.n_predict);
  if (o.n_threads < 1) return fmt::format("-t must be >= 1 (got {})", o.n_threads);
  if (o.n_ctx < 0) return fmt::format("-c must be >= 0 (got {})", o.n_ctx);
  if (!o.market_ca.empty() && o.market.empty()) return std::string("--ca goes with --market");
  if (o.attn_type != AttnType::kF32 && o.model_path.empty()) {
    return std::string("--attn-type shapes a local model (-m); a ring's stages have their own");
  }
  if (std::string e = CheckChatFlags(o.chat); !e.empty()) return e;
  if (auto kind = spec::ParseDraftKind(o.draft); !kind.ok()) return kind.status().message();
  if (o.drafting.max_tokens < 0 || o.drafting.max_tokens > 64) {
    return fmt::format("--draft-max must be in 0..64 (got {})", o.drafting.max_tokens);
  }
  return CheckSampling(o.sampling);
}

void WriteOut(const std::string& text) {
  if (text.empty()) return;
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// Prefill, then sample/stream/feed back. Generated text goes to stdout as it is produced.
Status Generate(const GenerateOptions& o, LoadedModel& m, spec::Drafter* drafter,
                const std::vector<int32_t>& prompt, GenerateStats* stats) {
  LayerWindow& window = *m.window;
  const Tokenizer& tok = *m.tokenizer;
  Stopwatch clock;
  Sampler sampler(o.sampling);
  spec::Decoder decoder(window, 0, sampler, drafter, o.drafting.max_tokens);
  KV_RETURN_IF_ERROR(decoder.Start(prompt));
  stats->prefill_ms = clock.Millis();

  Utf8Stream utf8;
  double first_token_ms = 0;
  stats->stop_reason = "length";
  bool done = o.n_predict == 0;
  while (!done) {
    if (decoder.context_full()) {
      stats->stop_reason = "context";
      break;
    }
    const bool first = stats->n_generated == 0 && stats->n_decode_tokens == 0;
    KV_ASSIGN_OR_RETURN(std::vector<int32_t> ids, decoder.Step(o.n_predict - stats->n_generated));
    if (first) {
      first_token_ms = stats->ttft_ms = clock.Millis();
    } else {
      stats->n_decode_steps++;
    }
    for (int32_t id : ids) {
      if (!first) stats->n_decode_tokens++;
      if (!o.ignore_eos && tok.IsEog(id)) {
        stats->stop_reason = "eog";
        done = true;
        break;
      }
      WriteOut(utf8.Push(tok.TokenToPiece(id)));
      if (++stats->n_generated == o.n_predict) {
        done = true;
        break;
      }
    }
  }
  WriteOut(utf8.Flush());
  if (stats->n_generated > 0 && (isatty(STDOUT_FILENO) || node::StdoutIsStderr())) WriteOut("\n");
  stats->total_ms = clock.Millis();
  stats->decode_ms = stats->n_generated > 0 ? stats->total_ms - first_token_ms : 0.0;
  stats->draft = decoder.stats();
  return Status::Ok();
}

// Generate under a grammar: the ring's last stage's sampler (ring/tail_sampler.h) on the one
// process, so a local run draws exactly as a ring does.
Status GenerateConstrained(const GenerateOptions& o, LoadedModel& m,
                           const std::vector<int32_t>& prompt, GenerateStats* stats) {
  LayerWindow& window = *m.window;
  const Tokenizer& tok = *m.tokenizer;
  Stopwatch clock;
  ring::SamplingExtra extra;
  extra.grammar = o.grammar;
  wire::SamplingWire w = ring::SamplingToWire(o.sampling, static_cast<uint32_t>(o.n_predict),
                                              o.ignore_eos);
  w.flags |= wire::kSamplingGrammar;
  ring::VocabTrie vocab(&tok);
  KV_ASSIGN_OR_RETURN(auto sampler, ring::TailSampler::Create(w, prompt, window.n_ctx(),
                                                              window.config().n_vocab, extra,
                                                              &vocab));
  KV_RETURN_IF_ERROR(window.OpenSequence(0));
  ForwardInput in;
  in.chunks = {{0, 0, static_cast<int>(prompt.size())}};
  in.tokens = prompt;
  ForwardOutput out;
  Utf8Stream utf8;
  std::vector<int32_t> fed;
  double first_token_ms = 0;
  stats->stop_reason = "length";
  for (int pos = static_cast<int>(prompt.size()); stats->n_generated < o.n_predict;) {
    KV_RETURN_IF_ERROR(window.Forward(in, &out));
    KV_ASSIGN_OR_RETURN(ring::TokenMsg t,
                        sampler->Sample(0, out.logits, pos, window.n_ctx(),
                                        [&](int32_t id) { return tok.IsEog(id); }));
    if (stats->n_generated == 0 && first_token_ms == 0) {
      first_token_ms = stats->ttft_ms = clock.Millis();
      stats->prefill_ms = first_token_ms;
    } else {
      stats->n_decode_steps++;
      stats->n_decode_tokens++;
    }
    const int32_t id = t.token.id;
    const auto reason = static_cast<wire::FinishReason>(t.token.reason);
    if (!tok.IsEog(id) || o.ignore_eos) {
      WriteOut(utf8.Push(tok.TokenToPiece(id)));
      stats->n_generated++;
    }
    if (t.token.finished) {
      stats->stop_reason = reason == wire::FinishReason::kEog         ? "eog"
                           : reason == wire::FinishReason::kContextFull ? "context"
                                                                        : "length";
      break;
    }
    fed.assign(1, id);
    in.chunks = {{0, pos, 1}};
    in.tokens = fed;
    ++pos;
  }
  WriteOut(utf8.Flush());
  if (stats->n_generated > 0 && (isatty(STDOUT_FILENO) || node::StdoutIsStderr())) WriteOut("\n");
  stats->total_ms = clock.Millis();
  stats->decode_ms = stats->n_generated > 0 ? stats->total_ms - first_token_ms : 0.0;
  return Status::Ok();
}

nlohmann::json StatsJson(const GenerateOptions& o, const GenerateStats& s) {
  return {{"model", o.model_path},
          {"n_prompt", s.n_prompt},
          {"n_generated", s.n_generated},
          {"prefill_tokens_per_s", PerSecond(s.n_prompt, s.prefill_ms)},
          {"decode_tokens_per_s", PerSecond(s.n_decode_tokens, s.decode_ms)},
          {"decode_steps", s.n_decode_steps},
          {"speculation",
           {{"drafter", s.drafter.empty() ? "none" : s.drafter},
            {"draft_max", s.drafter.empty() ? 0 : o.drafting.max_tokens},
            {"steps", s.draft.steps},
            {"drafted", s.draft.drafted},
            {"accepted", s.draft.accepted},
            {"acceptance", s.draft.acceptance()}}},
          {"ttft_ms", s.ttft_ms},
          {"total_ms", s.total_ms},
          {"load_ms", s.load_ms},
          {"threads", o.n_threads},
          {"backend", o.backend},
          {"simd_target", SimdTargetName()},
          {"peak_rss_bytes", PeakRssBytes()},
          {"seed", o.sampling.seed},
          {"stop_reason", s.stop_reason}};
}

// The same request sent to a ring's head: the ring tokenizes, runs and samples; text streams back.
int RunOnRing(const GenerateOptions& o) {
  RingRequest req;
  req.head = o.ring;
  req.prompt = o.prompt;
  if (o.chat.enabled()) {
    // The head tokenizes what it is sent, as a local run would (BOS as its vocabulary asks, special
    // tokens parsed), so the laid-out text gives the same ids there.
    auto text = ChatPromptWithoutModel(o.chat, o.market.empty() ? "--ring" : "--market", o.prompt);
    if (!text.ok()) return UsageError(kCmd, text.status().message());
    req.prompt = std::move(text).value();
  }
  req.n_predict = o.n_predict;
  req.sampling = o.sampling;
  req.ignore_eos = o.ignore_eos;
  req.stops = o.stops;
  req.grammar = o.grammar;
  Manifest m;
  if (!o.manifest_path.empty()) {
    auto loaded = LoadManifest(o.manifest_path);
    if (!loaded.ok()) return Fail(kCmd, loaded.status());
    m = std::move(loaded).value();
  }
  bool usage = false;
  if (Status s =
          ApplyClientTrust(o.trust, o.manifest_path.empty() ? nullptr : &m, &req.client, &usage);
      !s.ok()) {
    return usage ? UsageError(kCmd, s.message()) : Fail(kCmd, s);
  }
  auto run = RunRingRequest(req, /*with_stage_stats=*/true);
  if (!run.ok()) return Fail(kCmd, run.status());
  PrintRingSummary(*run, o.n_threads);
  if (!o.stats_path.empty()) {
    if (Status st = WriteJsonFile(o.stats_path, RingStatsJson(o.ring, *run, o.n_threads));
        !st.ok()) {
      return Fail(kCmd, st);
    }
  }
  return kExitOk;
}

// Asks the market for a ready ring of the model (counting as demand), then runs on its head,
// which must prove the node key the market names.
int RunOnMarket(GenerateOptions o) {
  if (!o.ring.empty()) return UsageError(kCmd, "use either --market or --ring, not both");
  if (o.model_path.empty())
    return UsageError(kCmd, "--market needs --model NAME (a model the market lists)");
  if (!o.trust.head_key.empty())
    return UsageError(kCmd, "--market names the head's key itself; drop --head-key");
  net::HttpRequestOptions http;
  http.ca_file = o.market_ca;
  auto client = market::MarketClient::Create(o.market, nullptr, http);
  if (!client.ok()) return UsageError(kCmd, client.status().message());
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(o.market_wait_s * 1000));
  std::string said;
  while (true) {
    auto ring = client->Get("/v1/rings/" + o.model_path);
    if (ring.ok()) {
      try {
        o.ring = ring->at("head").at("address").get<std::string>();
        o.trust.head_key = ring->at("head").at("node").get<std::string>();
        KV_LOG_INFO("market: ring {} of {} (epoch {}), head {} at {}", ring->at("ring").get<int>(),
                    o.model_path, ring->at("epoch").get<int64_t>(), o.trust.head_key.substr(0, 8),
                    o.ring);
      } catch (const std::exception& e) {
        return Fail(kCmd, fmt::format("market {}: malformed ring answer: {}", o.market, e.what()));
      }
      break;
    }
    if (ring.status().code() != StatusCode::kUnavailable ||
        std::chrono::steady_clock::now() >= deadline) {
      return Fail(kCmd, ring.status());
    }
    if (ring.status().message() != said) {
      said = ring.status().message();
      KV_LOG_INFO("{}; waiting up to {:.0f} s (--market-wait)", said, o.market_wait_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  o.model_path.clear();
  return RunOnRing(o);
}

int RunGenerate(GenerateOptions o) {
  if (auto e = CheckOptions(o)) return UsageError(kCmd, *e);
  o.sampling.seed = o.seed ? *o.seed : std::random_device{}();
  if ((!o.market.empty() || !o.ring.empty()) && o.draft != "none") {
    return UsageError(kCmd, "--draft runs with -m only (a local model)");
  }
  if (o.grammar_flags.given() && o.draft != "none") {
    return UsageError(kCmd, "--draft does not run under --grammar-file or --json-schema-file yet");
  }
  if (auto grammar = LoadGrammar(o.grammar_flags); grammar.ok()) {
    o.grammar = std::move(grammar).value();
  } else {
    return UsageError(kCmd, grammar.status().message());
  }
  if (!o.market.empty()) {
    // Refused before asking the market for a ring: the client has no model to read a template from.
    if (o.chat.enabled() && o.chat.template_name.empty()) {
      return UsageError(kCmd, ChatPromptWithoutModel(o.chat, "--market", "").status().message());
    }
    return RunOnMarket(std::move(o));
  }
  if (!o.ring.empty()) {
    if (!o.model_path.empty()) return UsageError(kCmd, "use either -m or --ring, not both");
    return RunOnRing(o);
  }
  if (o.model_path.empty())
    return UsageError(kCmd, "a model is required: -m MODEL (or --ring HOST:PORT)");
  if (auto code = CheckBackendFlag(kCmd, "--backend", o.backend)) return *code;
  if (auto code = CheckAttnTypeFlag(kCmd, o.attn_type, {o.backend})) return *code;
  if (!o.stats_path.empty()) {
    if (Status st = CheckWritable(o.stats_path); !st.ok()) return Fail(kCmd, st);
  }

  std::string prompt_text = o.prompt;
  if (o.chat.enabled()) {
    // Only the header is read here, so a model without a usable template costs no weight loading.
    auto file = OpenGguf(o.model_path);
    if (!file.ok()) return Fail(kCmd, file.status());
    auto text = ChatPrompt(o.chat, (*file)->header(), o.model_path, o.prompt);
    if (!text.ok()) return Fail(kCmd, text.status());
    prompt_text = std::move(text).value();
  }

  Stopwatch load_clock;
  // A verify batch of K + 1 rows keeps a checkpoint before each row (hybrid models).
  auto model = LoadModel(o.model_path, o.n_ctx, o.n_threads, /*with_tokenizer=*/true, o.backend,
                         std::max(1, o.drafting.max_tokens + 1), o.attn_type);
  if (!model.ok()) return Fail(kCmd, model.status());
  GenerateStats stats;
  spec::DraftOptions drafting = o.drafting;
  drafting.kind = *spec::ParseDraftKind(o.draft);
  drafting.n_threads = o.n_threads;
  drafting.backend = o.backend;
  auto drafter = spec::MakeDrafter(drafting, *model->window);
  if (!drafter.ok()) return Fail(kCmd, drafter.status());
  if (*drafter != nullptr) stats.drafter = (*drafter)->name();
  stats.load_ms = load_clock.Millis();

  const std::vector<int32_t> prompt =
      model->tokenizer->Encode(prompt_text, /*add_special=*/true, /*parse_special=*/true);
  const int n_ctx = model->window->n_ctx();
  stats.n_prompt = static_cast<int>(prompt.size());
  if (prompt.empty()) return Fail(kCmd, "the prompt is empty (no tokens)");
  if (stats.n_prompt > n_ctx) {
    return Fail(kCmd, fmt::format("prompt has {} tokens but the context is {} tokens; raise -c or "
                                  "shorten the prompt",
                                  stats.n_prompt, n_ctx));
  }
  // The last token is never fed back, so n tokens need prompt + n - 1 positions.
  if (stats.n_prompt + o.n_predict - 1 > n_ctx) {
    KV_LOG_WARN(
        "prompt has {} tokens; with -n {} it needs {} positions but the context is {}: "
        "generation stops at the end of the context",
        stats.n_prompt, o.n_predict, stats.n_prompt + o.n_predict - 1, n_ctx);
  }

  const Status generated = o.grammar.empty()
                               ? Generate(o, *model, drafter->get(), prompt, &stats)
                               : GenerateConstrained(o, *model, prompt, &stats);
  if (Status st = generated; !st.ok()) {
    return Fail(kCmd, WithPath(st, o.model_path));
  }
  if (stats.stop_reason == "context") {
    KV_LOG_WARN("the context of {} tokens is full: stopped after {} generated tokens", n_ctx,
                stats.n_generated);
  }
  std::fprintf(stderr,
               "prompt:    %d tokens, %.1f ms, %.2f tok/s; time to first token %.1f ms\n"
               "generated: %d tokens, %.2f tok/s (%s, %d threads, %s); stop: %s\n",
               stats.n_prompt, stats.prefill_ms, PerSecond(stats.n_prompt, stats.prefill_ms),
               stats.ttft_ms, stats.n_generated, PerSecond(stats.n_decode_tokens, stats.decode_ms),
               model->window->device().address.c_str(), o.n_threads, SimdTargetName().c_str(),
               stats.stop_reason.c_str());
  if (!stats.drafter.empty()) {
    std::fprintf(stderr, "drafts:    %s, %lld drafted, %lld accepted (%.1f %%) in %lld steps\n",
                 stats.drafter.c_str(), static_cast<long long>(stats.draft.drafted),
                 static_cast<long long>(stats.draft.accepted), 100.0 * stats.draft.acceptance(),
                 static_cast<long long>(stats.draft.steps));
  }
  if (!o.stats_path.empty()) {
    if (Status st = WriteJsonFile(o.stats_path, StatsJson(o, stats)); !st.ok()) {
      return Fail(kCmd, st);
    }
  }
  return kExitOk;
}

}  // namespace

int GenerateMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{"Generate text from a prompt with a local GGUF model.", "kvasir generate"};
    GenerateOptions o;
    o.n_threads = DefaultThreads();
    o.sampling.temperature = 0.8f;
    app.add_option("-m,--model", o.model_path,
                   "GGUF model file (with --market: the name of a model the market lists)");
    app.add_option("--market", o.market,
                   "http[s]://HOST[:PORT] of a market: generate on a ready ring of --model there");
    app.add_option("--ca", o.market_ca, "(with --market) PEM certificates to trust for https://")
        ->check(CLI::ExistingFile);
    app.add_option("--market-wait", o.market_wait_s,
                   "(with --market) seconds to wait for a ring to be ready")
        ->capture_default_str();
    app.add_option("--ring", o.ring, "generate on a running ring: HOST:PORT of its head stage");
    app.add_option("--stop", o.stops, "(with --ring) stop when the text contains this");
    app.add_option("--manifest", o.manifest_path,
                   "(with --ring) the ring's manifest: rank 0's node_key authenticates the head");
    AddClientTrustFlags(app, &o.trust);
    app.add_option("-p,--prompt", o.prompt, "prompt text (with --chat: the user's message)")
        ->required();
    AddChatFlags(app, &o.chat);
    AddGrammarFlags(app, &o.grammar_flags);
    app.add_option("-n,--n-predict", o.n_predict, "tokens to generate")->capture_default_str();
    AddSamplingOptions(app, &o.sampling, &o.seed);
    app.add_option("-t,--threads", o.n_threads, "threads")->capture_default_str();
    AddBackendFlag(app, &o.backend);
    AddAttnTypeFlag(app, &o.attn_type);
    app.add_option("-c,--ctx-size", o.n_ctx, "context size; 0 = the model's, at most 4096")
        ->capture_default_str();
    app.add_option("--stats", o.stats_path, "write timing statistics as JSON to this file");
    app.add_flag("--ignore-eos", o.ignore_eos, "keep generating after end-of-generation tokens");
    app.add_option(
           "--draft", o.draft,
           "speculative decoding: mtp (the model's own multi-token-prediction block), ngram "
           "(prompt lookup), model (--draft-model), auto (model when --draft-model is given, "
           "else mtp when the model has a nextn block, else ngram) or none")
        ->capture_default_str();
    app.add_option("--draft-model", o.drafting.model_path,
                   "a small GGUF sharing the model's vocabulary that drafts tokens")
        ->check(CLI::ExistingFile);
    app.add_option("--draft-max", o.drafting.max_tokens,
                   "tokens drafted per step (K; each step runs K + 1 rows)")
        ->capture_default_str();
    std::vector<char*> args = SpellChatAliases(argc, argv);
    if (auto code = ParseArgs(app, kCmd, argc, args.data())) return *code;
    return RunGenerate(std::move(o));
  });
}

}  // namespace kvasir::cli
