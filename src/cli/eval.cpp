// kvasir eval: teacher-forced logits of a token sequence. One Forward over all ids with every
// row's logits; writes them as raw little-endian float32 rows and prints the sequence's perplexity.
#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/backend_flag.h"
#include "cli/cli_util.h"
#include "cli/commands.h"

namespace kvasir::cli {
namespace {

static_assert(std::endian::native == std::endian::little,
              "logits files are written in host order and must be little-endian");

constexpr const char* kCmd = "eval";

struct EvalOptions {
  std::string model_path;
  std::string ids_text;
  std::string prompt;
  std::string logits_path;
  int n_threads = 1;
  std::string backend = "cpu";
  AttnType attn_type = AttnType::kF32;
  int n_ctx = 0;
};

// "1, 403,407" -> {1, 403, 407}. Errors name the offending item.
Result<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    const size_t b = item.find_first_not_of(" \t");
    const size_t e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    if (item.empty()) {
      return Error("--ids: empty item at position {} (expected comma-separated integers)",
                   ids.size());
    }
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used, 10);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size()) return Error("--ids: '{}' is not an integer", item);
    if (v < 0 || v > INT32_MAX) return Error("--ids: {} is not a valid token id", item);
    ids.push_back(static_cast<int32_t>(v));
    pos = comma + 1;
  }
  return ids;
}

// exp(mean(-log p(ids[i+1] | ids[0..i]))) over rows [0, n-1), from `logits` [n, n_vocab].
double Perplexity(const std::vector<float>& logits, const std::vector<int32_t>& ids, int n_vocab) {
  double nll = 0.0;
  const size_t n = ids.size();
  for (size_t i = 0; i + 1 < n; ++i) {
    const float* row = logits.data() + i * static_cast<size_t>(n_vocab);
    double max_logit = row[0];
    for (int j = 1; j < n_vocab; ++j) max_logit = std::max<double>(max_logit, row[j]);
    double sum = 0.0;
    for (int j = 0; j < n_vocab; ++j) sum += std::exp(row[j] - max_logit);
    nll += -(row[ids[i + 1]] - max_logit - std::log(sum));
  }
  return std::exp(nll / static_cast<double>(n - 1));
}

int RunEval(const EvalOptions& o) {
  if (o.n_threads < 1)
    return UsageError(kCmd, fmt::format("-t must be >= 1 (got {})", o.n_threads));
  if (o.n_ctx < 0) return UsageError(kCmd, fmt::format("-c must be >= 0 (got {})", o.n_ctx));
  if (auto code = CheckBackendFlag(kCmd, "--backend", o.backend)) return *code;
  if (auto code = CheckAttnTypeFlag(kCmd, o.attn_type, {o.backend})) return *code;
  if (Status st = CheckWritable(o.logits_path); !st.ok()) return Fail(kCmd, st);
  std::vector<int32_t> ids;
  if (!o.ids_text.empty()) {
    auto parsed = ParseIds(o.ids_text);
    if (!parsed.ok()) return UsageError(kCmd, parsed.status().message());
    ids = std::move(parsed).value();
  }

  // Without -c the context is exactly the sequence (known up front for --ids only).
  const int n_ctx = o.n_ctx > 0 ? o.n_ctx : static_cast<int>(ids.size());
  auto model =
      LoadModel(o.model_path, n_ctx, o.n_threads, /*with_tokenizer=*/ids.empty(), o.backend,
                /*max_checkpoints=*/8, o.attn_type);
  if (!model.ok()) return Fail(kCmd, model.status());
  if (ids.empty()) {
    ids = model->tokenizer->Encode(o.prompt, /*add_special=*/true, /*parse_special=*/true);
    if (ids.empty()) return Fail(kCmd, "--prompt gives no tokens");
  }
  const int n_vocab = model->window->config().n_vocab;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= n_vocab) {
      return Fail(kCmd, fmt::format("--ids: id {} at position {} is out of range (the vocabulary "
                                    "of {} has {} tokens)",
                                    ids[i], i, o.model_path, n_vocab));
    }
  }
  const int n = static_cast<int>(ids.size());
  if (n > model->window->n_ctx()) {
    return Fail(kCmd, fmt::format("{} tokens exceed the context of {}; raise -c", n,
                                  model->window->n_ctx()));
  }

  LayerWindow& window = *model->window;
  if (Status st = window.OpenSequence(0); !st.ok()) return Fail(kCmd, st);
  ForwardInput in;
  in.chunks = {SeqChunk{0, 0, n}};
  in.tokens = ids;
  in.all_logits = true;
  ForwardOutput out;
  Stopwatch clock;
  if (Status st = window.Forward(in, &out); !st.ok()) return Fail(kCmd, WithPath(st, o.model_path));
  const double ms = clock.Millis();
  // [n, n_vocab] f32: row i holds the logits after ids[0..i].
  if (out.logits.size() != static_cast<size_t>(n) * n_vocab) {
    return Fail(kCmd, fmt::format("model returned {} logits, expected {} x {}", out.logits.size(),
                                  n, n_vocab));
  }
  if (Status st =
          WriteBinaryFile(o.logits_path, out.logits.data(), out.logits.size() * sizeof(float));
      !st.ok()) {
    return Fail(kCmd, st);
  }
  std::string text = fmt::format("n_tokens {}\n", n);
  if (n >= 2) {
    text += fmt::format("perplexity {:.6f}\n", Perplexity(out.logits, ids, n_vocab));
  } else {
    text += "perplexity n/a (needs at least 2 tokens)\n";
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fprintf(stderr, "eval: %d tokens in %.1f ms (%.2f tok/s); logits [%d, %d] f32 -> %s\n", n,
               ms, ms > 0 ? n * 1e3 / ms : 0.0, n, n_vocab, o.logits_path.c_str());
  return kExitOk;
}

}  // namespace

int EvalMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{"Teacher-forced logits and perplexity of a token sequence.", "kvasir eval"};
    EvalOptions o;
    o.n_threads = DefaultThreads();
    app.add_option("-m,--model", o.model_path, "GGUF model file")->required();
    auto* ids = app.add_option("--ids", o.ids_text, "comma-separated token ids, e.g. 1,403,407");
    auto* prompt = app.add_option("--prompt", o.prompt,
                                  "text to tokenize (BOS added as the "
                                  "vocabulary asks)");
    ids->excludes(prompt);
    app.add_option("--logits", o.logits_path, "output file: [n, n_vocab] float32 little-endian")
        ->required();
    app.add_option("-t,--threads", o.n_threads, "threads")->capture_default_str();
    AddBackendFlag(app, &o.backend);
    AddAttnTypeFlag(app, &o.attn_type);
    app.add_option("-c,--ctx-size", o.n_ctx, "context size; 0 = the sequence length")
        ->capture_default_str();
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (ids->count() == 0 && prompt->count() == 0) {
      return UsageError(kCmd, "one of --ids or --prompt is required");
    }
    if (ids->count() > 0 && o.ids_text.empty()) return UsageError(kCmd, "--ids is empty");
    return RunEval(o);
  });
}

}  // namespace kvasir::cli
