#include "backend/op_cases.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>

#include "base/check.h"
#include "kernels/kernels_test_util.h"

namespace kvasir::testing {
namespace {

// Tolerances, as max normalised squared error against the judge. Copies must be exact; element-
// wise ops allow for another exp; products allow for other activation rounding (a GPU may round
// activations to 8 or 16 bits its own way), as llama.cpp's test-backend-ops does for mul_mat.
struct Tolerance {
  Op op;
  double max_nmse;
};
constexpr Tolerance kTolerances[] = {
    {Op::kGetRows, 1e-10},       {Op::kMatMul, 5e-4},     {Op::kRmsNorm, 1e-7},
    {Op::kRopeAngles, 1e-6},     {Op::kRope, 1e-7},       {Op::kSplitQGate, 0},
    {Op::kAppendKv, 0},          {Op::kAttention, 1e-5},  {Op::kSiluMul, 1e-7},
    {Op::kAdd, 1e-12},           {Op::kAddBias, 1e-12},   {Op::kSigmoidMul, 1e-7},
    {Op::kSigmoid, 1e-7},        {Op::kScaleRows, 1e-12}, {Op::kCausalConvSilu, 1e-7},
    {Op::kGatedDeltaRule, 1e-6}, {Op::kMoeRoute, 1e-7},   {Op::kMoeFfn, 5e-4},
};
static_assert(sizeof(kTolerances) / sizeof(kTolerances[0]) == static_cast<size_t>(Op::kCount));

constexpr int kTokens[] = {1, 37};

// Inputs and outputs of one case in one backend; frees them at the end of the case.
class Device {
 public:
  explicit Device(Backend& be) : be_(be) {}

  DevPtr In(const std::vector<float>& v) {
    const DevPtr p = Alloc(static_cast<int64_t>(v.size()));
    be_.Upload(p, v.data(), static_cast<int64_t>(v.size()));
    return p;
  }
  DevPtr Ids(const std::vector<int32_t>& v) {
    const DevPtr p = Alloc(static_cast<int64_t>(v.size()));
    be_.Upload(p, v.data(), static_cast<int64_t>(v.size()));
    return p;
  }
  // An output, filled with NaN so that an element the op does not write fails the comparison.
  DevPtr Out(int64_t n) {
    const DevPtr p = Alloc(n);
    be_.Fill(p, n, std::numeric_limits<float>::quiet_NaN());
    return p;
  }
  // `count` matrices [rows, cols] of `type`, one after the other.
  const DeviceMatrix& Weights(const TestMatrix& m, int64_t count) {
    HostMatrix h{"test.weight", m.view, count, 0};
    h.view.rows = m.view.rows / count;
    h.stride = static_cast<size_t>(h.view.rows) * m.view.row_bytes;
    auto up = be_.UploadMatrix(h);
    KV_CHECK(up.ok(), "{}", up.status().message());
    mats_.push_back(std::move(up).value());
    return *mats_.back();
  }
  OpOutput Get(const std::string& what, DevPtr p, int64_t n, bool exact = false) {
    OpOutput o{what, std::vector<float>(static_cast<size_t>(n)), exact};
    const Status s = be_.Download(o.values.data(), p, n);
    EXPECT_TRUE(s.ok()) << s.message();
    return o;
  }
  OpOutput GetIds(const std::string& what, DevPtr p, int64_t n) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    const Status s = be_.Download(ids.data(), p, n);
    EXPECT_TRUE(s.ok()) << s.message();
    return {what, std::vector<float>(ids.begin(), ids.end()), true};
  }

 private:
  DevPtr Alloc(int64_t n) {
    auto b = be_.Alloc(n, "an op test tensor");
    KV_CHECK(b.ok(), "{}", b.status().message());
    bufs_.push_back(std::move(b).value());
    return DevPtr{bufs_.back().get(), 0};
  }
  Backend& be_;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs_;
  std::vector<std::unique_ptr<DeviceMatrix>> mats_;
};

using Outs = std::vector<OpOutput>;

// Columns for a type: prime for float types; three blocks (no multiple of 64, 128 or 512) else.
int64_t OddCols(TensorType t) { return IsQuantized(t) ? 3 * BlockValues(t) : 83; }

std::string TypeName(TensorType t) { return TensorTypeName(static_cast<uint32_t>(t)); }

std::vector<int32_t> RandomIds(int n, int below, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % below);
  return ids;
}

std::vector<float> Uniform(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

void WeightCases(std::vector<OpCase>& out) {
  for (TensorType t : kAllTypes) {
    const int64_t rows = 67, cols = OddCols(t);
    auto m = std::make_shared<TestMatrix>(MakeMatrix(t, rows, cols, 11));
    for (int n : kTokens) {
      const std::vector<int32_t> ids = RandomIds(n, rows, 5 + n);
      out.push_back({Op::kGetRows,
                     fmt::format("get_rows {} [{}, {}] x {} ids", TypeName(t), rows, cols, n), t,
                     [=](Backend& be) {
                       Device d(be);
                       const DevPtr o = d.Out(n * cols);
                       be.GetRows(d.Weights(*m, 1), d.Ids(ids), n, o);
                       return Outs{d.Get("out", o, n * cols)};
                     }});
      const std::vector<float> x = RandomFloats(n * cols, 17 + n);
      out.push_back({Op::kMatMul,
                     fmt::format("mat_mul {} [{}, {}] x {} tokens", TypeName(t), rows, cols, n), t,
                     [=](Backend& be) {
                       Device d(be);
                       const DevPtr y = d.Out(n * rows);
                       be.MatMul(d.Weights(*m, 1), d.In(x), n, y);
                       return Outs{d.Get("y", y, n * rows)};
                     }});
    }
  }
  // One row (a router's shared-expert gate is a [1, n_embd] matrix).
  auto one = std::make_shared<TestMatrix>(MakeMatrix(TensorType::kF32, 1, 83, 3));
  const std::vector<float> x = RandomFloats(37 * 83, 4);
  out.push_back(
      {Op::kMatMul, "mat_mul f32 [1, 83] x 37 tokens", TensorType::kF32, [=](Backend& be) {
         Device d(be);
         const DevPtr y = d.Out(37);
         be.MatMul(d.Weights(*one, 1), d.In(x), 37, y);
         return Outs{d.Get("y", y, 37)};
       }});
}

void NormAndRopeCases(std::vector<OpCase>& out) {
  for (int n : kTokens) {
    for (bool in_place : {false, true}) {
      const int width = 83;
      const std::vector<float> x = RandomFloats(n * width, 21 + n, 3.0f);
      const std::vector<float> w = RandomFloats(width, 22);
      out.push_back({Op::kRmsNorm,
                     fmt::format("rms_norm {} rows of {}{}", n, width, in_place ? " in place" : ""),
                     TensorType::kF32, [=](Backend& be) {
                       Device d(be);
                       const DevPtr xp = d.In(x);
                       const DevPtr y = in_place ? xp : d.Out(n * width);
                       be.RmsNorm(xp, d.In(w), n, width, 1e-5f, y);
                       return Outs{d.Get("y", y, n * width)};
                     }});
    }
  }
  // Angles: plain, linear scaling, YaRN, frequency factors, IMROPE.
  for (int variant = 0; variant < 5; ++variant) {
    for (int n : kTokens) {
      auto factors = std::make_shared<std::vector<float>>(Uniform(32, 1.0f, 8.0f, 31));
      RopeAngleParams p;
      p.n_rot = 64;
      const char* name = "plain";
      if (variant == 1) name = "linear", p.freq_scale = 0.25f;
      if (variant == 2) {
        name = "yarn", p.freq_scale = 0.25f, p.ext_factor = 1.0f, p.attn_factor = 0.9f;
        p.corr_dims[0] = 5.0f, p.corr_dims[1] = 21.0f;
      }
      if (variant == 3) name = "freq factors";
      if (variant == 4) {
        // Sections covering 15 of every 15 pairs in turn, so some pairs stay at position 0.
        name = "imrope", p.imrope = true, p.base = 1e7f;
        p.sections[0] = 6, p.sections[1] = 5, p.sections[2] = 4;
      }
      std::vector<int32_t> pos = RandomIds(n, 5000, 33 + n);
      out.push_back({Op::kRopeAngles, fmt::format("rope_angles {} x {} positions", name, n),
                     TensorType::kF32, [=](Backend& be) {
                       RopeAngleParams q = p;
                       if (variant == 3) q.freq_factors = *factors;
                       Device d(be);
                       const DevPtr o = d.Out(n * 64);
                       be.RopeAngles(q, pos, o);
                       return Outs{d.Get("cos_sin", o, n * 64)};
                     }});
    }
  }
  for (RopeType type : {RopeType::kNormal, RopeType::kNeox}) {
    for (int n_rot : {40, 24}) {
      for (int n : kTokens) {
        const int heads = 3, hd = 40;
        const std::vector<float> x = RandomFloats(n * heads * hd, 41 + n);
        std::vector<float> cs(static_cast<size_t>(n) * n_rot);
        const std::vector<float> theta = Uniform(n * n_rot / 2, -3.0f, 3.0f, 42);
        for (size_t i = 0; i < theta.size(); ++i) {
          cs[2 * i] = std::cos(theta[i]);
          cs[2 * i + 1] = std::sin(theta[i]);
        }
        out.push_back(
            {Op::kRope,
             fmt::format("rope {} n_rot {} of {}, {} heads x {} rows",
                         type == RopeType::kNormal ? "normal" : "neox", n_rot, hd, heads, n),
             TensorType::kF32, [=](Backend& be) {
               Device d(be);
               const DevPtr xp = d.In(x);
               be.Rope(xp, n, heads, hd, n_rot, type, d.In(cs));
               return Outs{d.Get("x", xp, n * heads * hd)};
             }});
      }
    }
  }
}

void AttentionCases(std::vector<OpCase>& out) {
  struct Shape {
    int n_head, n_head_kv, head_dim;
  };
  // Heads narrower and wider than a GPU work-group (130 > 2 x 64), caches longer than a tile of
  // scores (300 + 37 > 256 keys).
  for (Shape sh : {Shape{4, 2, 40}, Shape{3, 1, 17}, Shape{2, 1, 130}}) {
    for (int n : kTokens) {
      const int n_head = sh.n_head, kvh = sh.n_head_kv, hd = sh.head_dim;
      const int qd = n_head * hd, kvd = kvh * hd;
      const std::vector<float> qkv = RandomFloats(n * (qd + 2 * kvd), 51 + n);
      const std::vector<float> q(qkv.begin(), qkv.begin() + n * qd);
      const std::vector<float> k(qkv.begin() + n * qd, qkv.begin() + n * (qd + kvd));
      const std::vector<float> v(qkv.begin() + n * (qd + kvd), qkv.end());
      const std::vector<float> q_full = RandomFloats(n * 2 * qd, 50 + n);
      out.push_back({Op::kSplitQGate,
                     fmt::format("split_q_gate {} heads of {} x {} rows", n_head, hd, n),
                     TensorType::kF32, [=](Backend& be) {
                       Device d(be);
                       const DevPtr qo = d.Out(n * qd), go = d.Out(n * qd);
                       be.SplitQGate(d.In(q_full), n, n_head, hd, qo, go);
                       return Outs{d.Get("q", qo, n * qd, true), d.Get("gate", go, n * qd, true)};
                     }});
      for (int pos0 : {0, 11, 300}) {
        const int cap = pos0 + n + 3;
        std::vector<float> cache = RandomFloats(int64_t{cap} * kvd * 2, 52 + pos0);
        // Rows past the sequence's end hold NaN: reading them poisons the output.
        for (int64_t i = int64_t{pos0 + n} * kvd; i < int64_t{cap} * kvd; ++i) {
          cache[i] = cache[int64_t{cap} * kvd + i] = std::numeric_limits<float>::quiet_NaN();
        }
        const std::vector<float> kc(cache.begin(), cache.begin() + int64_t{cap} * kvd);
        const std::vector<float> vc(cache.begin() + int64_t{cap} * kvd, cache.end());
        out.push_back({Op::kAppendKv, fmt::format("append_kv {} rows of {} at {}", n, kvd, pos0),
                       TensorType::kF32, [=](Backend& be) {
                         Device d(be);
                         const DevPtr kp = d.In(kc), vp = d.In(vc);
                         be.AppendKv(d.In(k), d.In(v), n, kvd, kp, vp, pos0);
                         return Outs{d.Get("k_cache", kp, int64_t{pos0 + n} * kvd, true),
                                     d.Get("v_cache", vp, int64_t{pos0 + n} * kvd, true)};
                       }});
        for (int variant = 0; variant < 3; ++variant) {
          AttentionParams p{n_head, kvh, hd, 1.0f / std::sqrt(static_cast<float>(hd)), 0, 0};
          const char* name = "";
          if (variant == 1) p.softcap = 1.5f, name = ", soft-cap 1.5";
          if (variant == 2) p.window = 7, p.scale = 0.3f, name = ", window 7, scale 0.3";
          out.push_back({Op::kAttention,
                         fmt::format("attention {}/{} heads of {}, {} rows at {}{}", n_head, kvh,
                                     hd, n, pos0, name),
                         TensorType::kF32, [=](Backend& be) {
                           Device d(be);
                           const DevPtr kp = d.In(kc), vp = d.In(vc), o = d.Out(n * qd);
                           be.AppendKv(d.In(k), d.In(v), n, kvd, kp, vp, pos0);
                           be.Attention(d.In(q), n, pos0, kp, vp, p, o);
                           return Outs{d.Get("out", o, n * qd)};
                         }});
        }
      }
    }
  }
}

void ElementCases(std::vector<OpCase>& out) {
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{1001}}) {
    const std::vector<float> a = RandomFloats(n, 61, 4.0f), b = RandomFloats(n, 62, 2.0f);
    out.push_back({Op::kSiluMul, fmt::format("silu_mul {}", n), TensorType::kF32, [=](Backend& be) {
                     Device d(be);
                     const DevPtr g = d.In(a), o = d.Out(n);
                     be.SiluMul(g, d.In(b), n, o);
                     be.SiluMul(g, d.In(b), n, g);  // in place, as the layers run it
                     return Outs{d.Get("out", o, n), d.Get("gate", g, n)};
                   }});
    out.push_back({Op::kAdd, fmt::format("add {}", n), TensorType::kF32, [=](Backend& be) {
                     Device d(be);
                     const DevPtr y = d.In(a);
                     be.Add(y, d.In(b), n);
                     return Outs{d.Get("y", y, n)};
                   }});
    out.push_back(
        {Op::kSigmoidMul, fmt::format("sigmoid_mul {}", n), TensorType::kF32, [=](Backend& be) {
           Device d(be);
           const DevPtr y = d.In(a);
           be.SigmoidMul(y, d.In(b), n);
           return Outs{d.Get("y", y, n)};
         }});
    out.push_back({Op::kSigmoid, fmt::format("sigmoid {}", n), TensorType::kF32, [=](Backend& be) {
                     Device d(be);
                     const DevPtr x = d.In(a);
                     be.Sigmoid(x, n);
                     return Outs{d.Get("x", x, n)};
                   }});
  }
  for (int n : kTokens) {
    const int width = 83;
    const std::vector<float> y = RandomFloats(n * width, 63), b = RandomFloats(width, 64);
    const std::vector<float> s = RandomFloats(n, 65);
    out.push_back({Op::kAddBias, fmt::format("add_bias {} rows of {}", n, width), TensorType::kF32,
                   [=](Backend& be) {
                     Device d(be);
                     const DevPtr yp = d.In(y);
                     be.AddBias(yp, d.In(b), n, width);
                     return Outs{d.Get("y", yp, n * width)};
                   }});
    out.push_back({Op::kScaleRows, fmt::format("scale_rows {} rows of {}", n, width),
                   TensorType::kF32, [=](Backend& be) {
                     Device d(be);
                     const DevPtr yp = d.In(y);
                     be.ScaleRows(yp, d.In(s), n, width);
                     return Outs{d.Get("y", yp, n * width)};
                   }});
  }
}

void DeltaNetCases(std::vector<OpCase>& out) {
  for (int n : kTokens) {
    const int channels = 37, kernel = 4;
    const std::vector<float> x = RandomFloats(n * channels, 71 + n);
    const std::vector<float> w = RandomFloats(channels * kernel, 72, 0.5f);
    const std::vector<float> st = RandomFloats((kernel - 1) * channels, 73);
    out.push_back(
        {Op::kCausalConvSilu,
         fmt::format("causal_conv_silu {} channels, {} taps, {} rows", channels, kernel, n),
         TensorType::kF32, [=](Backend& be) {
           Device d(be);
           const DevPtr s = d.In(st), o = d.Out(n * channels);
           be.CausalConvSilu(d.In(x), n, channels, kernel, d.In(w), s, o);
           return Outs{d.Get("out", o, n * channels), d.Get("state", s, (kernel - 1) * channels)};
         }});
    // Heads narrower and wider than a GPU work-group (72 > 64).
    struct Heads {
      int nk, nv, dim;
    };
    for (Heads hs : {Heads{2, 4, 24}, Heads{1, 2, 72}}) {
      const int nk = hs.nk, nv = hs.nv, dim = hs.dim;
      const int64_t stride = 2 * nk * dim + nv * dim + 5;  // rows with a gap after v
      const std::vector<float> qkv = RandomFloats(n * stride, 74 + n);
      const std::vector<float> alpha = RandomFloats(n * nv, 75), beta = RandomFloats(n * nv, 76);
      const std::vector<float> dt = RandomFloats(nv, 77), a = Uniform(nv, -2.0f, -0.1f, 78);
      const std::vector<float> state = RandomFloats(int64_t{nv} * dim * dim, 79, 0.1f);
      out.push_back({Op::kGatedDeltaRule,
                     fmt::format("gated_delta_rule {}/{} heads of {}, {} rows", nk, nv, dim, n),
                     TensorType::kF32, [=](Backend& be) {
                       Device d(be);
                       const DevPtr s = d.In(state), o = d.Out(int64_t{n} * nv * dim);
                       be.GatedDeltaRule(d.In(qkv), stride, d.In(alpha), d.In(beta), d.In(dt),
                                         d.In(a), n, nk, nv, dim, 1e-6f, s, o);
                       return Outs{d.Get("out", o, int64_t{n} * nv * dim),
                                   d.Get("state", s, int64_t{nv} * dim * dim)};
                     }});
    }
  }
}

void MoeCases(std::vector<OpCase>& out) {
  for (int n : kTokens) {
    const int n_exp = 11, k = 3;
    const std::vector<float> logits = RandomFloats(n * n_exp, 81 + n, 2.0f);
    out.push_back({Op::kMoeRoute, fmt::format("moe_route top {} of {}, {} rows", k, n_exp, n),
                   TensorType::kF32, [=](Backend& be) {
                     Device d(be);
                     const DevPtr ids = d.Out(n * k), w = d.Out(n * k);
                     be.MoeRoute(d.In(logits), n, n_exp, k, ids, w);
                     return Outs{d.GetIds("ids", ids, n * k), d.Get("weights", w, n * k)};
                   }});
  }
  for (TensorType t : kAllTypes) {
    const int n_exp = 5, k = 2;
    const int64_t e = IsQuantized(t) ? 2 * BlockValues(t) : 45;
    const int64_t ff = IsQuantized(t) ? BlockValues(t) : 29;
    auto gate = std::make_shared<TestMatrix>(MakeMatrix(t, ff * n_exp, e, 91));
    auto up = std::make_shared<TestMatrix>(MakeMatrix(t, ff * n_exp, e, 92));
    auto down = std::make_shared<TestMatrix>(MakeMatrix(t, e * n_exp, ff, 93));
    for (int n : kTokens) {
      const std::vector<float> x = RandomFloats(n * e, 94 + n, 0.01f);  // no f16 overflow
      std::vector<int32_t> ids;
      std::mt19937 rng(95 + n);
      for (int r = 0; r < n; ++r) {
        std::vector<int32_t> all(n_exp);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        ids.insert(ids.end(), all.begin(), all.begin() + k);
      }
      const std::vector<float> w = Uniform(n * k, 0.05f, 1.0f, 96);
      out.push_back({Op::kMoeFfn,
                     fmt::format("moe_ffn {} top {} of {}, [{}, {}] x {} rows", TypeName(t), k,
                                 n_exp, ff, e, n),
                     t, [=](Backend& be) {
                       Device d(be);
                       const DevPtr o = d.Out(n * e);
                       be.MoeFfn(d.Weights(*gate, n_exp), d.Weights(*up, n_exp),
                                 d.Weights(*down, n_exp), d.In(x), n, d.Ids(ids), d.In(w), k, o);
                       return Outs{d.Get("out", o, n * e)};
                     }});
    }
  }
}

}  // namespace

std::vector<OpCase> CasesOf(Op op) {
  // Made once: the weight matrices of every type take a while to quantize.
  static const std::vector<OpCase> all = [] {
    std::vector<OpCase> v;
    WeightCases(v);
    NormAndRopeCases(v);
    AttentionCases(v);
    ElementCases(v);
    DeltaNetCases(v);
    MoeCases(v);
    return v;
  }();
  std::vector<OpCase> out;
  for (const OpCase& c : all) {
    if (c.op == op) out.push_back(c);
  }
  return out;
}

double MaxError(Op op) {
  for (const Tolerance& t : kTolerances) {
    if (t.op == op) return t.max_nmse;
  }
  KV_CHECK(false, "no tolerance for op {}", OpName(op));
  return 0;
}

}  // namespace kvasir::testing
