#include "shard/slice.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "gguf/gguf_writer.h"
#include "model/arch/registry.h"
#include "model/model_id.h"

namespace kvasir {
namespace {

// Bytes handed to the stream writer per Append, so a huge tensor is copied in bounded pieces.
constexpr uint64_t kCopyChunk = uint64_t{8} << 20;

// Layer index of "blk.N.something", or nullopt for a non-layer tensor.
// Whether the slice [first, last) of a model with n_layer layers keeps tensor `name`. The nextn
// (multi-token-prediction) blocks after the stack go with the head, and so do the embeddings they
// read.
bool KeepTensor(const std::string& name, int first, int last, const ModelConfig& cfg) {
  const int n_layer = cfg.n_layer;
  const bool head = last == n_layer;
  if (const int layer = LayerOfTensorName(name); layer >= 0) {
    return layer >= n_layer ? head : layer >= first && layer < last;
  }
  if (name == "token_embd.weight") {
    return first == 0 || (head && (cfg.tied_output || cfg.n_layer_nextn > 0));
  }
  if (name == "output_norm.weight" || name == "output.weight") return head;
  return true;  // e.g. rope_freqs.weight: small, and any stage may need it
}

bool SamePath(const std::string& a, const std::string& b) {
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec) && !ec;
}

}  // namespace

Result<SlicePlan> PlanSlice(const GgufFile& parent, int first, int last) {
  KV_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(parent));
  const int n_layer = cfg.n_layer;
  if (first < 0 || last > n_layer || first >= last) {
    return Error(
        "{}: layers {}:{} are not a window of the model's {} layers (need 0 <= A < B <= {})",
        parent.path(), first, last, n_layer, n_layer);
  }
  // A parent that is itself a slice only holds its own window.
  if (parent.Find("kvasir.window.first") != nullptr ||
      parent.Find("kvasir.window.last") != nullptr) {
    KV_ASSIGN_OR_RETURN(uint64_t pf, parent.GetUint("kvasir.window.first"));
    KV_ASSIGN_OR_RETURN(uint64_t pl, parent.GetUint("kvasir.window.last"));
    if (static_cast<uint64_t>(first) < pf || static_cast<uint64_t>(last) > pl) {
      return Error("{}: holds layers {}:{} (a stage slice); layers {}:{} are not in it",
                   parent.path(), pf, pl, first, last);
    }
  }
  KV_ASSIGN_OR_RETURN(ModelId parent_id, ComputeModelId(parent.header(), parent.path()));

  SlicePlan plan;
  plan.parent_model_id = ModelIdHex(parent_id);
  GgufWriter& layout = plan.layout;
  layout.CopyKvs(parent.header());
  layout.SetKv("kvasir.window.first", GgufValue::Uint32(static_cast<uint32_t>(first)));
  layout.SetKv("kvasir.window.last", GgufValue::Uint32(static_cast<uint32_t>(last)));
  layout.SetKv("kvasir.window.tied_output", GgufValue::Bool(cfg.tied_output));
  layout.SetKv("kvasir.model_id", GgufValue::String(plan.parent_model_id));

  SliceSummary& s = plan.summary;
  for (const GgufTensorInfo& t : parent.tensors()) {
    s.parent_bytes += t.n_bytes;
    if (!KeepTensor(t.name, first, last, cfg)) continue;
    KV_RETURN_IF_ERROR(layout.DeclareTensor(t.name, static_cast<TensorType>(t.type),
                                            std::span<const uint64_t>(t.ne.data(), t.n_dims)));
    plan.source.push_back(t);
    s.bytes += t.n_bytes;
  }
  s.n_tensors = static_cast<int>(plan.source.size());
  return plan;
}

Status WriteSlice(const GgufFile& parent, int first, int last, const std::string& out_path,
                  SliceSummary* summary) {
  if (out_path.empty()) return Error("empty output path");
  KV_ASSIGN_OR_RETURN(SlicePlan plan, PlanSlice(parent, first, last));
  const std::filesystem::path dir = std::filesystem::path(out_path).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(dir)) {
    return Error("{}: directory {} does not exist", out_path, dir.string());
  }
  if (SamePath(out_path, parent.path())) {
    return Error("{}: is the model being sliced; choose another output path", out_path);
  }
  const GgufWriter& layout = plan.layout;
  const SliceSummary& s = plan.summary;
  std::vector<const GgufTensorInfo*> kept;
  for (const GgufTensorInfo& t : plan.source) kept.push_back(&t);

  KV_ASSIGN_OR_RETURN(std::unique_ptr<GgufStreamWriter> out,
                      GgufStreamWriter::Create(layout, out_path));
  for (const GgufTensorInfo* t : kept) {
    std::span<const uint8_t> data = parent.TensorData(*t);
    for (uint64_t off = 0; off < data.size(); off += kCopyChunk) {
      const uint64_t n = std::min<uint64_t>(kCopyChunk, data.size() - off);
      KV_RETURN_IF_ERROR(out->Append(data.subspan(off, n)));
    }
  }
  KV_RETURN_IF_ERROR(out->Finish());
  if (summary != nullptr) *summary = s;
  return Status::Ok();
}

}  // namespace kvasir
