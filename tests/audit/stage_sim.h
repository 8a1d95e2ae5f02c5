// A window run as a stage runs it, for the audit tests: the prompt in one batch, then one row at a
// time (decode), each output row sent on in the boundary's type (and so committed), the next window
// taking in the sent rows widened to f32. `noise` perturbs the output rows as a faulty stage would
// (ring/test_fault.h). A window may run on OpenCL where this machine has a device.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "kernels/kernels.h"
#include "model/layer_window.h"
#include "ring/row_commit.h"
#include "ring/test_fault.h"

namespace kvasir::audit {

struct StageRun {
  std::vector<ring::PositionRows> rows;  // what the stage committed to, position by position
  std::vector<float> next_in;            // [n, n_embd] f32: what the next window takes in
};

// `tokens` (head) or `hidden` ([n, n_embd] f32) in; the first `prompt` rows in one batch.
inline StageRun RunAsStage(LayerWindow* w, const std::vector<int32_t>& tokens,
                           const std::vector<float>& hidden, int n, int prompt,
                           ring::RowKind boundary, double noise = 0) {
  StageRun run;
  const size_t n_embd = static_cast<size_t>(w->config().n_embd);
  const bool head = w->spec().has_embed, tail = w->spec().has_head;
  EXPECT_TRUE(w->OpenSequence(7).ok());
  int pos = 0;
  while (pos < n) {
    const int rows = pos == 0 ? std::min(prompt, n) : 1;
    ForwardInput in;
    in.chunks.push_back(SeqChunk{7, pos, rows, tail, 0});
    if (head) {
      in.tokens = std::span<const int32_t>(tokens).subspan(static_cast<size_t>(pos), rows);
    } else {
      in.hidden = std::span<const float>(hidden).subspan(pos * n_embd, rows * n_embd);
    }
    ForwardOutput out;
    Status s = w->Forward(in, &out);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) break;
    if (!tail && noise > 0) ring::AddTestFaultNoise(out.hidden, n_embd, noise);
    for (int i = 0; i < rows; ++i) {
      ring::PositionRows p;
      p.pos = static_cast<uint32_t>(pos + i);
      if (head) {
        p.in = {ring::RowKind::kToken, std::vector<uint8_t>(4)};
        std::memcpy(p.in.bytes.data(), &tokens[static_cast<size_t>(pos + i)], 4);
      } else {
        p.in = {ring::RowKind::kF32, std::vector<uint8_t>(4 * n_embd)};
        std::memcpy(p.in.bytes.data(), hidden.data() + (pos + i) * n_embd, 4 * n_embd);
      }
      if (tail) {
        if (i == rows - 1) p.out = {ring::RowKind::kToken, {1, 0, 0, 0}};
      } else {
        const float* row = out.hidden.data() + i * n_embd;
        p.out.kind = boundary;
        for (size_t j = 0; j < n_embd; ++j) {
          float sent = row[j];
          if (boundary == ring::RowKind::kF32) {
            p.out.bytes.resize(4 * n_embd);
            std::memcpy(p.out.bytes.data() + 4 * j, &sent, 4);
          } else {
            const uint16_t h =
                boundary == ring::RowKind::kF16 ? F32ToF16(row[j]) : F32ToBF16(row[j]);
            sent = boundary == ring::RowKind::kF16 ? F16ToF32(h) : BF16ToF32(h);
            p.out.bytes.resize(2 * n_embd);
            std::memcpy(p.out.bytes.data() + 2 * j, &h, 2);
          }
          run.next_in.push_back(sent);
        }
      }
      run.rows.push_back(std::move(p));
    }
    pos += rows;
  }
  w->CloseSequence(7);
  return run;
}

// Why this machine cannot run a window on OpenCL, or "".
inline std::string NoOpenClDevice() {
  for (const BackendDevices& b : ListAllDevices()) {
    if (b.backend != "opencl") continue;
    if (!b.built) return CheckBackendBuilt(BackendSpec{"opencl", {}}).message();
    if (!b.status.ok()) return "no OpenCL device: " + b.status.message();
    if (b.devices.empty()) return "no OpenCL device: the platforms list none";
    return "";
  }
  return "no OpenCL backend in the registry";
}

}  // namespace kvasir::audit
