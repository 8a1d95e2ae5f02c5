// The model's own multi-token-prediction block as a drafter, on synthetic Qwen3.5 models written
// by `kvasir synth --nextn 1` in the test's temp dir: the block's logits against a float64
// computation written out here, greedy output with --draft mtp equal to plain decoding token for
// token, a drafter that went through rejections equal to a fresh one, and the tail's slice
// carrying the block.
#include "spec/mtp_drafter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "kvasir_process.h"
#include "model/arch/registry.h"
#include "planner/model_cost.h"
#include "shard/slice.h"
#include "spec/chi_square.h"
#include "spec/decoder.h"
#include "test_assets.h"

namespace kvasir::spec {
namespace {

using testing::AssetPath;
using testing::RunKvasir;
using testing::TempDir;

constexpr char kStories[] = "models/stories260K.gguf";

// `kvasir synth` of a small Qwen3.5 model (qwen35: dense FFN; qwen35moe: experts) with one nextn
// block, f32 weights so the float64 reference reads them as they are.
std::string Synth(const TempDir& dir, const std::string& arch, const std::string& type = "f32") {
  const std::string out = dir.File(arch + ".gguf");
  std::vector<std::string> args = testing::HybridSynthArgs(out, arch, type, "11");
  args.insert(args.end(), {"--nextn", "1"});
  const testing::RunResult r = RunKvasir(args);
  EXPECT_EQ(r.code, 0) << r.err;
  return out;
}

std::unique_ptr<LayerWindow> LoadWhole(const std::string& path, WindowSpec spec = {0, 0}) {
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().message();
  if (!file.ok()) return nullptr;
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  auto cfg = LoadModelConfig(*shared);
  EXPECT_TRUE(cfg.ok()) << cfg.status().message();
  if (!cfg.ok()) return nullptr;
  if (spec.last == 0) spec = {0, cfg->n_layer, true, true};
  WindowOptions opt;
  opt.n_ctx = 256;
  opt.n_threads = 2;
  auto w = LayerWindow::Load(shared, spec, opt);
  EXPECT_TRUE(w.ok()) << w.status().message();
  return w.ok() ? std::move(w).value() : nullptr;
}

std::vector<int32_t> Prompt() { return {1, 403, 73, 9, 250, 403, 73, 9, 31}; }

// ---- float64 reference of the nextn block --------------------------------------------------

using Vec = std::vector<double>;

// An f32 tensor as doubles, and its [rows, cols] shape (GGUF ne[1], ne[0]).
struct Tensor {
  Vec v;
  int64_t rows = 1, cols = 0;
  Vec Row(int64_t r) const { return Vec(v.begin() + r * cols, v.begin() + (r + 1) * cols); }
  Vec Mul(const Vec& x) const {  // this · x
    Vec y(rows, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) y[r] += v[r * cols + c] * x[c];
    }
    return y;
  }
};

Tensor Read(const GgufFile& f, const std::string& name) {
  Tensor t;
  const GgufTensorInfo* info = f.FindTensor(name);
  EXPECT_NE(info, nullptr) << name;
  if (info == nullptr) return t;
  EXPECT_EQ(info->type, static_cast<uint32_t>(TensorType::kF32)) << name;
  t.cols = static_cast<int64_t>(info->ne[0]);
  t.rows = info->n_dims > 1 ? static_cast<int64_t>(info->ne[1]) : 1;
  std::vector<float> raw(t.rows * t.cols);
  std::memcpy(raw.data(), f.TensorData(*info).data(), raw.size() * sizeof(float));
  t.v.assign(raw.begin(), raw.end());
  return t;
}

Vec RmsNorm(const Vec& x, const Vec& w, double eps) {
  double ss = 0;
  for (double a : x) ss += a * a;
  const double s = 1.0 / std::sqrt(ss / x.size() + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
  return y;
}

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The nextn block of a qwen35 (dense) file, row by row, with its own KV cache.
class NextnReference {
 public:
  NextnReference(const GgufFile& f, const ModelConfig& cfg) : cfg_(cfg) {
    const std::string p = "blk." + std::to_string(cfg.n_layer) + ".";
    embd_ = Read(f, "token_embd.weight");
    out_ = Read(f, "output.weight");
    for (const char* n : {"nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm",
                          "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
                          "attn_k_norm", "post_attention_norm", "ffn_gate", "ffn_up", "ffn_down"}) {
      w_[n] = Read(f, p + n + ".weight");
    }
  }

  // One row at the next position: hidden h (normed, as the window gives it), token id; returns
  // the logits and sets *hidden_out to the block's normed output.
  Vec Row(const Vec& h, int32_t token, Vec* hidden_out) {
    const double eps = cfg_.rms_eps;
    const int e = cfg_.n_embd, hd = cfg_.head_dim, nh = cfg_.n_head, nkv = cfg_.n_head_kv;
    const int pos = static_cast<int>(keys_.size());
    Vec cat = RmsNorm(embd_.Row(token), w_["nextn.enorm"].v, eps);
    const Vec hn = RmsNorm(h, w_["nextn.hnorm"].v, eps);
    cat.insert(cat.end(), hn.begin(), hn.end());
    Vec x = w_["nextn.eh_proj"].Mul(cat);

    const Vec a = RmsNorm(x, w_["attn_norm"].v, eps);
    const Vec qg = w_["attn_q"].Mul(a);
    Vec k = w_["attn_k"].Mul(a), v = w_["attn_v"].Mul(a);
    std::vector<Vec> q(nh), gate(nh);
    for (int hh = 0; hh < nh; ++hh) {
      q[hh] = RmsNorm(Vec(qg.begin() + hh * 2 * hd, qg.begin() + hh * 2 * hd + hd),
                      w_["attn_q_norm"].v, eps);
      gate[hh] = Vec(qg.begin() + hh * 2 * hd + hd, qg.begin() + (hh + 1) * 2 * hd);
      Rope(&q[hh], pos);
    }
    std::vector<Vec> kh(nkv);
    for (int g = 0; g < nkv; ++g) {
      kh[g] = RmsNorm(Vec(k.begin() + g * hd, k.begin() + (g + 1) * hd), w_["attn_k_norm"].v, eps);
      Rope(&kh[g], pos);
    }
    keys_.push_back(kh);
    values_.push_back(v);
    Vec attn(nh * hd, 0.0);
    for (int hh = 0; hh < nh; ++hh) {
      const int g = hh / (nh / nkv);
      Vec s(pos + 1);
      double mx = -1e300;
      for (int j = 0; j <= pos; ++j) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += q[hh][i] * keys_[j][g][i];
        s[j] = d / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& sj : s) sum += (sj = std::exp(sj - mx));
      for (int j = 0; j <= pos; ++j) {
        for (int i = 0; i < hd; ++i) attn[hh * hd + i] += s[j] / sum * values_[j][g * hd + i];
      }
      for (int i = 0; i < hd; ++i) attn[hh * hd + i] *= Sigmoid(gate[hh][i]);
    }
    const Vec o = w_["attn_output"].Mul(attn);
    for (int i = 0; i < e; ++i) x[i] += o[i];

    const Vec f = RmsNorm(x, w_["post_attention_norm"].v, eps);
    Vec gt = w_["ffn_gate"].Mul(f);
    const Vec up = w_["ffn_up"].Mul(f);
    for (size_t i = 0; i < gt.size(); ++i) gt[i] = gt[i] * Sigmoid(gt[i]) * up[i];
    const Vec d = w_["ffn_down"].Mul(gt);
    for (int i = 0; i < e; ++i) x[i] += d[i];

    *hidden_out = RmsNorm(x, w_["nextn.shared_head_norm"].v, eps);
    return out_.Mul(*hidden_out);
  }

  const Tensor& output() const { return out_; }

 private:
  // NEOX rotation of the first n_rot dims; every pair of a text token takes its position.
  void Rope(Vec* x, int pos) const {
    const int half = cfg_.n_rot / 2;
    for (int i = 0; i < half; ++i) {
      const double theta =
          pos * std::pow(static_cast<double>(cfg_.rope_base), -2.0 * i / cfg_.n_rot);
      const double a = (*x)[i], b = (*x)[i + half];
      (*x)[i] = a * std::cos(theta) - b * std::sin(theta);
      (*x)[i + half] = a * std::sin(theta) + b * std::cos(theta);
    }
  }

  ModelConfig cfg_;
  Tensor embd_, out_;
  std::map<std::string, Tensor> w_;
  std::vector<std::vector<Vec>> keys_;  // [pos][kv head][head_dim], normed and rotated
  std::vector<Vec> values_;             // [pos][kv_dim]
};

// Largest |a - b| over the largest |b|: the error relative to the values' scale.
template <typename A>
double RelError(const A& a, const Vec& b) {
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return err / scale;
}

// The block's logits and chained hidden rows equal the float64 computation: a run over the
// prompt's rows, then two chained drafts; a rolled-back chained row, run again, gives the same.
TEST(MtpDrafterTest, NextnLogitsMatchFloat64Reference) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string path = Synth(dir, "qwen35");
  auto w = LoadWhole(path);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->has_nextn());
  const ModelConfig& cfg = w->config();
  ASSERT_TRUE(cfg.nextn_normed_hidden);
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  NextnReference ref(*file, cfg);
  const int e = cfg.n_embd, nv = cfg.n_vocab;

  const std::vector<int32_t> ids = Prompt();
  const int m = static_cast<int>(ids.size()) - 1;
  ASSERT_TRUE(w->OpenSequence(0).ok());
  EXPECT_EQ(w->NextnLength(0), 0);
  ForwardInput in;
  in.chunks = {{0, 0, m + 1}};
  in.tokens = ids;
  in.all_logits = true;
  in.want_hidden = true;
  ForwardOutput fo;
  ASSERT_TRUE(w->Forward(in, &fo).ok());
  ASSERT_EQ(fo.hidden.size(), static_cast<size_t>(m + 1) * e);
  // The hidden rows are the normed rows the head reads: output · hidden is the model's logits.
  for (int r = 0; r <= m; ++r) {
    const Vec h(fo.hidden.begin() + r * e, fo.hidden.begin() + (r + 1) * e);
    EXPECT_LT(RelError(fo.logits.data() + static_cast<size_t>(r) * nv, ref.output().Mul(h)), 1e-4)
        << "row " << r;
  }

  NextnInput ni;
  ni.seq_id = 0;
  ni.pos0 = 0;
  ni.tokens = std::span<const int32_t>(ids).subspan(1);
  ni.hidden = std::span<const float>(fo.hidden).first(static_cast<size_t>(m) * e);
  ni.all_logits = true;
  NextnOutput no;
  ASSERT_TRUE(w->ForwardNextn(ni, &no).ok());
  ASSERT_EQ(no.logits.size(), static_cast<size_t>(m) * nv);
  ASSERT_EQ(no.hidden.size(), static_cast<size_t>(m) * e);
  EXPECT_EQ(w->NextnLength(0), m);
  Vec ref_hidden;
  for (int r = 0; r < m; ++r) {
    const Vec h(fo.hidden.begin() + r * e, fo.hidden.begin() + (r + 1) * e);
    const Vec logits = ref.Row(h, ids[r + 1], &ref_hidden);
    EXPECT_LT(RelError(no.logits.data() + static_cast<size_t>(r) * nv, logits), 1e-4)
        << "row " << r;
    EXPECT_LT(RelError(no.hidden.data() + static_cast<size_t>(r) * e, ref_hidden), 1e-4)
        << "row " << r;
  }

  // Chained drafts: the block's own output row as the hidden state, its argmax as the token.
  std::vector<float> chain(no.hidden.end() - e, no.hidden.end());
  int32_t token = ArgMax(std::span<const float>(no.logits).last(nv));
  std::vector<float> first_chained;
  for (int step = 0; step < 2; ++step) {
    NextnInput ci;
    ci.seq_id = 0;
    ci.pos0 = m + step;
    ci.tokens = std::span<const int32_t>(&token, 1);
    ci.hidden = chain;
    NextnOutput co;
    ASSERT_TRUE(w->ForwardNextn(ci, &co).ok());
    const Vec logits = ref.Row(Vec(chain.begin(), chain.end()), token, &ref_hidden);
    EXPECT_LT(RelError(co.logits, logits), 1e-4) << "chained " << step;
    if (step == 0) first_chained = co.logits;
    chain = co.hidden;
    token = ArgMax(co.logits);
  }
  // Roll the chained rows back and run the first again: the same bits.
  ASSERT_TRUE(w->TruncateNextn(0, m).ok());
  EXPECT_EQ(w->NextnLength(0), m);
  NextnInput again;
  again.seq_id = 0;
  again.pos0 = m;
  const int32_t first_token = ArgMax(std::span<const float>(no.logits).last(nv));
  again.tokens = std::span<const int32_t>(&first_token, 1);
  again.hidden = std::span<const float>(no.hidden).last(e);
  NextnOutput ao;
  ASSERT_TRUE(w->ForwardNextn(again, &ao).ok());
  EXPECT_EQ(ao.logits, first_chained);

  // What it refuses, by name.
  NextnInput bad = again;
  bad.pos0 = 3;
  EXPECT_NE(w->ForwardNextn(bad, &ao).message().find("starts at position 3"), std::string::npos);
  bad = again;
  bad.pos0 = m + 1;
  bad.hidden = bad.hidden.first(e - 1);
  EXPECT_NE(w->ForwardNextn(bad, &ao).message().find("hidden values"), std::string::npos);
  EXPECT_FALSE(w->TruncateNextn(0, m + 5).ok());
  w->CloseSequence(0);
  EXPECT_EQ(w->NextnLength(0), -1);
}

// Decodes `n` tokens greedily after the prompt, with `drafter` (may be null) at K = k, fixed.
std::vector<int32_t> Decode(LayerWindow& w, Drafter* drafter, int k, int n, DraftStats* stats,
                            const SamplingParams& params = SamplingParams{}) {
  Sampler sampler(params);
  Decoder d(w, 0, sampler, drafter, k, /*adapt_k=*/false);
  EXPECT_TRUE(d.Start(Prompt()).ok());
  std::vector<int32_t> out;
  while (static_cast<int>(out.size()) < n) {
    auto step = d.Step(n - static_cast<int>(out.size()));
    EXPECT_TRUE(step.ok()) << step.status().message();
    if (!step.ok()) break;
    out.insert(out.end(), step->begin(), step->end());
  }
  if (stats != nullptr) *stats = d.stats();
  return out;
}

// Greedy output with the nextn block drafting equals plain decoding, token for token, at several K.
TEST(MtpDrafterTest, GreedyOutputEqualsPlainDecoding) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string path = Synth(dir, "qwen35moe", "q8_0");
  auto w = LoadWhole(path);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->has_nextn());
  const std::vector<int32_t> plain = Decode(*w, nullptr, 0, 40, nullptr);
  ASSERT_EQ(plain.size(), 40u);
  for (int k : {1, 3, 6}) {
    MtpDrafter mtp(*w, 0);
    DraftStats stats;
    EXPECT_EQ(Decode(*w, &mtp, k, 40, &stats), plain) << "K = " << k;
    EXPECT_GT(stats.drafted, 0) << "K = " << k;
    EXPECT_GT(mtp.rows_run(), 0);
  }
}

// With temperature, drafting with the block keeps the model's distribution: over many seeds the
// token at each step is distributed as without speculation. With random weights the block's
// argmax is rarely what the model samples, so this is mostly the rejecting path of the rule (the
// resampled token), with the block's cache rolled back at every step.
TEST(MtpDrafterTest, SampledStepsFollowThePlainDistribution) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string path = Synth(dir, "qwen35moe", "q8_0");
  auto w = LoadWhole(path);
  ASSERT_NE(w, nullptr);
  constexpr int kRuns = 1200, kSteps = 5;
  StepHistograms histograms(kSteps);
  DraftStats total;
  for (int r = 0; r < kRuns; ++r) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 8;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 5000 + r;
    const auto a = Decode(*w, nullptr, 0, kSteps, nullptr, p);
    p.seed = 700000 + r;
    MtpDrafter mtp(*w, 0);
    DraftStats st;
    const auto b = Decode(*w, &mtp, 3, kSteps, &st, p);
    ASSERT_EQ(a.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(b.size(), static_cast<size_t>(kSteps));
    histograms.Add(a, b);
    total.drafted += st.drafted;
    total.accepted += st.accepted;
  }
  EXPECT_GT(total.drafted - total.accepted, kRuns);
  histograms.ExpectSameDistributions(kRuns);
}

// A drafter that has been through verify steps (rejections, rolled-back chained rows) drafts the
// same as a fresh one that sees the whole history at once: nothing rejected stays in its cache.
TEST(MtpDrafterTest, RollbackLeavesNoTrace) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string path = Synth(dir, "qwen35moe", "q8_0");
  auto w = LoadWhole(path);
  ASSERT_NE(w, nullptr);
  // Incremental: decode with drafts; then ask for the drafts after the decided history.
  MtpDrafter used(*w, 0);
  Sampler sampler(SamplingParams{.temperature = 0});
  Decoder d(*w, 0, sampler, &used, 4, /*adapt_k=*/false);
  ASSERT_TRUE(d.Start(Prompt()).ok());
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(d.Step(8).ok());
  const std::vector<int32_t> history = d.history();
  auto drafts = used.Propose(history, 4);
  ASSERT_TRUE(drafts.ok()) << drafts.status().message();
  EXPECT_EQ(drafts->size(), 4u);

  // Fresh: a second sequence prefilled with the history but its last token, in one batch.
  ASSERT_TRUE(w->OpenSequence(1).ok());
  ForwardInput in;
  in.chunks = {{1, 0, static_cast<int>(history.size()) - 1}};
  in.tokens = std::span<const int32_t>(history).first(history.size() - 1);
  in.want_hidden = true;
  ForwardOutput out;
  ASSERT_TRUE(w->Forward(in, &out).ok());
  MtpDrafter fresh(*w, 1);
  fresh.ObserveHidden(0, out.hidden);
  auto expect = fresh.Propose(history, 4);
  ASSERT_TRUE(expect.ok()) << expect.status().message();
  EXPECT_EQ(*drafts, *expect);
  // A repeated call gives the same drafts again.
  auto repeat = used.Propose(history, 4);
  ASSERT_TRUE(repeat.ok());
  EXPECT_EQ(*repeat, *drafts);
}

// Accepted drafts hand over several hidden rows at once; the block's cache then matches a fresh
// drafter's too.
TEST(MtpDrafterTest, SeveralAcceptedRowsAtOnce) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string path = Synth(dir, "qwen35");
  auto w = LoadWhole(path);
  ASSERT_NE(w, nullptr);
  std::vector<int32_t> history = Prompt();
  ASSERT_TRUE(w->OpenSequence(0).ok());
  MtpDrafter used(*w, 0);
  ForwardInput in;
  in.chunks = {{0, 0, static_cast<int>(history.size())}};
  in.tokens = history;
  in.want_hidden = true;
  ForwardOutput out;
  ASSERT_TRUE(w->Forward(in, &out).ok());
  used.ObserveHidden(0, out.hidden);
  history.push_back(17);
  ASSERT_TRUE(used.Propose(history, 3).ok());
  // A verify batch of [17, 40, 41] whose two drafts are taken, then the sampler's own 42.
  const int pos = static_cast<int>(history.size()) - 1;
  const std::vector<int32_t> rows = {17, 40, 41};
  in.chunks = {{0, pos, 3}};
  in.tokens = rows;
  ASSERT_TRUE(w->Forward(in, &out).ok());
  used.ObserveHidden(pos, out.hidden);
  history.insert(history.end(), {40, 41, 42});
  auto drafts = used.Propose(history, 3);
  ASSERT_TRUE(drafts.ok()) << drafts.status().message();

  ASSERT_TRUE(w->OpenSequence(1).ok());
  in.chunks = {{1, 0, static_cast<int>(history.size()) - 1}};
  in.tokens = std::span<const int32_t>(history).first(history.size() - 1);
  ASSERT_TRUE(w->Forward(in, &out).ok());
  MtpDrafter fresh(*w, 1);
  fresh.ObserveHidden(0, out.hidden);
  auto expect = fresh.Propose(history, 3);
  ASSERT_TRUE(expect.ok());
  EXPECT_EQ(*drafts, *expect);
  EXPECT_EQ(w->NextnLength(0), w->NextnLength(1));
}

// --draft mtp (and auto, on a model with a nextn block) in `kvasir generate`: the same text as
// without speculation, the drafter and its acceptance in --stats; refused on a model without one.
TEST(MtpDrafterTest, GenerateDraftMtp) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string path = Synth(dir, "qwen35moe", "q8_0");
  auto generate = [&](const std::string& draft, const std::string& stats) {
    return RunKvasir({"generate", "-m", path, "-p", "Once upon a time", "-n", "24", "--temp", "0",
                      "--ignore-eos", "--draft", draft, "--stats", stats});
  };
  const testing::RunResult plain = generate("none", dir.File("none.json"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  for (const std::string draft : {"mtp", "auto"}) {
    const testing::RunResult r = generate(draft, dir.File(draft + ".json"));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, plain.out) << draft;
    EXPECT_NE(r.err.find("drafts:    mtp"), std::string::npos) << r.err;
    const std::string json = testing::ReadFileToString(dir.File(draft + ".json"));
    EXPECT_NE(json.find("\"drafter\": \"mtp\""), std::string::npos) << json;
    EXPECT_NE(json.find("\"acceptance\""), std::string::npos) << json;
  }
  const testing::RunResult none =
      RunKvasir({"generate", "-m", AssetPath(kStories), "-p", "hi", "--draft", "mtp"});
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.err.find("multi-token-prediction block"), std::string::npos) << none.err;
}

// The tail's slice carries the nextn block and the embeddings it reads; the other slices do not,
// and the planner's weight bytes per stage say so.
// A tail window from its slice drafts exactly as the whole model's.
TEST(MtpDrafterTest, TailSliceCarriesTheBlock) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string path = Synth(dir, "qwen35");
  auto parent = GgufFile::Open(path);
  ASSERT_TRUE(parent.ok());
  SliceSummary head_sum, tail_sum;
  ASSERT_TRUE(WriteSlice(*parent, 0, 2, dir.File("head.gguf"), &head_sum).ok());
  ASSERT_TRUE(WriteSlice(*parent, 2, 4, dir.File("tail.gguf"), &tail_sum).ok());
  // The planner counts for each stage what its slice holds.
  auto cost = ComputeModelCost(*parent);
  ASSERT_TRUE(cost.ok()) << cost.status().message();
  EXPECT_EQ(cost->WindowWeightBytes(0, 2), head_sum.bytes);
  EXPECT_EQ(cost->WindowWeightBytes(2, 4), tail_sum.bytes);
  auto head = GgufFile::Open(dir.File("head.gguf"));
  auto tail = GgufFile::Open(dir.File("tail.gguf"));
  ASSERT_TRUE(head.ok() && tail.ok());
  EXPECT_EQ(head->FindTensor("blk.4.nextn.eh_proj.weight"), nullptr);
  EXPECT_EQ(head->FindTensor("blk.4.attn_q.weight"), nullptr);
  EXPECT_NE(tail->FindTensor("blk.4.nextn.eh_proj.weight"), nullptr);
  EXPECT_NE(tail->FindTensor("blk.4.ffn_up.weight"), nullptr);
  EXPECT_NE(tail->FindTensor("token_embd.weight"), nullptr);

  // The whole model's hidden rows drive both blocks.
  auto whole = LoadWhole(path);
  auto tail_w = LoadWhole(dir.File("tail.gguf"), {2, 4, false, true});
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(tail_w, nullptr);
  ASSERT_TRUE(tail_w->has_nextn());
  const std::vector<int32_t> ids = Prompt();
  ForwardInput in;
  in.chunks = {{0, 0, static_cast<int>(ids.size())}};
  in.tokens = ids;
  in.want_hidden = true;
  ForwardOutput out;
  ASSERT_TRUE(whole->OpenSequence(0).ok());
  ASSERT_TRUE(whole->Forward(in, &out).ok());
  std::vector<int32_t> history = ids;
  history.push_back(5);
  ASSERT_TRUE(tail_w->OpenSequence(0).ok());
  MtpDrafter a(*whole, 0), b(*tail_w, 0);
  a.ObserveHidden(0, out.hidden);
  b.ObserveHidden(0, out.hidden);
  auto da = a.Propose(history, 3), db = b.Propose(history, 3);
  ASSERT_TRUE(da.ok() && db.ok());
  EXPECT_EQ(*da, *db);
}

}  // namespace
}  // namespace kvasir::spec
