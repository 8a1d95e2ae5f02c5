#include "audit/recompute.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

#include "kernels/kernels.h"
#include "model/arch/registry.h"

namespace kvasir::audit {
namespace {

using ring::RowKind;
using ring::RowSide;

// The revealed output row widened to f32; false when it is no hidden row of n_embd values.
bool WidenRow(const RowSide& side, size_t n_embd, std::vector<float>* out) {
  out->resize(n_embd);
  if (side.kind == RowKind::kF32 && side.bytes.size() == 4 * n_embd) {
    std::memcpy(out->data(), side.bytes.data(), 4 * n_embd);
    return true;
  }
  if ((side.kind != RowKind::kF16 && side.kind != RowKind::kBF16) ||
      side.bytes.size() != 2 * n_embd) {
    return false;
  }
  for (size_t i = 0; i < n_embd; ++i) {
    uint16_t h;
    std::memcpy(&h, side.bytes.data() + 2 * i, 2);
    (*out)[i] = side.kind == RowKind::kF16 ? F16ToF32(h) : BF16ToF32(h);
  }
  return true;
}

// ||got - ours|| / ||ours||, in double; NaN when got holds a NaN or an infinity.
double RelativeL2(std::span<const float> got, std::span<const float> ours) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ours[i];
    diff += d * d;
    norm += static_cast<double>(ours[i]) * ours[i];
  }
  if (!std::isfinite(diff)) return std::nan("");
  if (norm == 0) return diff == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / norm);
}

}  // namespace

Result<std::unique_ptr<Recomputer>> Recomputer::Load(std::shared_ptr<const GgufFile> file,
                                                     int first, int last, int n_threads) {
  WindowSpec spec;
  spec.first = first;
  spec.last = last;
  spec.has_embed = first == 0;
  // The output head is loaded only to know the window is the last one; its outputs are not
  // compared (see Check).
  KV_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(*file));
  spec.has_head = last == config.n_layer;
  WindowOptions options;
  options.n_threads = n_threads;
  options.max_sequences = 1;
  options.backend = "cpu";
  KV_ASSIGN_OR_RETURN(auto window, LayerWindow::Load(std::move(file), spec, options));
  return std::unique_ptr<Recomputer>(new Recomputer(std::move(window)));
}

Result<RecomputeReport> Recomputer::Check(const ring::RowReveal& reveal, double tolerance) {
  const WindowSpec& spec = window_->spec();
  const size_t n_embd = static_cast<size_t>(window_->config().n_embd);
  std::map<uint64_t, const ring::PositionRows*> by_index;
  for (const ring::RevealedPosition& p : reveal.positions) by_index[p.index] = &p.rows;
  // The prefix 0, 1, ... k-1.
  std::vector<const ring::PositionRows*> prefix;
  for (auto it = by_index.begin(); it != by_index.end() && it->first == prefix.size(); ++it) {
    prefix.push_back(it->second);
  }
  if (prefix.empty()) return Error("the reveal holds no position 0: nothing can be recomputed");
  RecomputeReport report;
  std::vector<int32_t> tokens;
  std::vector<float> hidden;  // [k, n_embd] f32: the revealed inputs
  for (size_t i = 0; i < prefix.size(); ++i) {
    const ring::PositionRows& rows = *prefix[i];
    if (rows.pos != i) {
      return Error(
          "leaf {} is position {}: the session began from a cached prompt, whose state is not "
          "revealed",
          i, rows.pos);
    }
    if (spec.has_embed) {
      if (rows.in.kind != RowKind::kToken || rows.in.bytes.size() != 4) {
        report.failure = fmt::format("position {}: the head's input is not a token id", i);
        return report;
      }
      int32_t id;
      std::memcpy(&id, rows.in.bytes.data(), 4);
      if (id < 0 || id >= window_->config().n_vocab) {
        report.failure = fmt::format("position {}: token {} is outside the vocabulary", i, id);
        return report;
      }
      tokens.push_back(id);
    } else {
      if (rows.in.kind != RowKind::kF32 || rows.in.bytes.size() != 4 * n_embd) {
        report.failure = fmt::format("position {}: the input is not a row of {} f32", i, n_embd);
        return report;
      }
      const size_t at = hidden.size();
      hidden.resize(at + n_embd);
      std::memcpy(hidden.data() + at, rows.in.bytes.data(), 4 * n_embd);
    }
    if (spec.has_head && rows.out.kind != RowKind::kToken && rows.out.kind != RowKind::kNone) {
      report.failure = fmt::format("position {}: the last window gave out no token", i);
      return report;
    }
  }
  if (spec.has_head) return report;  // sampled tokens: nothing to compare

  KV_RETURN_IF_ERROR(window_->OpenSequence(0));
  ForwardInput in;
  in.chunks.push_back(SeqChunk{0, 0, static_cast<int>(prefix.size()), false, 0});
  in.tokens = tokens;
  in.hidden = hidden;
  ForwardOutput out;
  Status s = window_->Forward(in, &out);
  window_->CloseSequence(0);
  KV_RETURN_IF_ERROR(s);
  if (out.hidden.size() != prefix.size() * n_embd) {
    return Error("the window gave {} values for {} rows of {}", out.hidden.size(), prefix.size(),
                 n_embd);
  }
  std::vector<float> got;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (!WidenRow(prefix[i]->out, n_embd, &got)) {
      report.failure = fmt::format("position {}: the output is not a row of {} values", i, n_embd);
      return report;
    }
    const double rel =
        RelativeL2(got, std::span<const float>(out.hidden).subspan(i * n_embd, n_embd));
    ++report.compared;
    if (!(rel <= report.worst)) {  // NaN too
      report.worst = rel;
      report.worst_index = i;
    }
    if (!(rel <= tolerance)) {
      report.failure = fmt::format(
          "position {}: the revealed output differs from the recomputed one by {:.4g} (relative "
          "L2), more than the tolerance {:.4g}",
          i, rel, tolerance);
      return report;
    }
  }
  return report;
}

}  // namespace kvasir::audit
