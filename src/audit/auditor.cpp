#include "audit/auditor.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/log.h"
#include "model/model_id.h"

namespace kvasir::audit {

Result<std::unique_ptr<Auditor>> Auditor::Create(market::Store* store,
                                                 std::shared_ptr<const GgufFile> file,
                                                 const AuditorOptions& options, double now) {
  KV_ASSIGN_OR_RETURN(auto models, store->Map(now));
  auto it = std::find_if(models.begin(), models.end(),
                         [&](const market::ModelState& m) { return m.name == options.model; });
  if (it == models.end()) {
    return Error(StatusCode::kNotFound, "{}: no model '{}' is registered", store->db_name(),
                 options.model);
  }
  KV_ASSIGN_OR_RETURN(ModelId id, ComputeModelId(file->header(), file->path()));
  if (ModelIdHex(id) != it->model_id) {
    return Error("{}: model identity {} is not that of '{}' in {} ({})", file->path(),
                 ModelIdHex(id), options.model, store->db_name(), it->model_id);
  }
  if (!(options.tolerance > 0)) return Error("the tolerance must be above 0");
  return std::unique_ptr<Auditor>(new Auditor(store, std::move(file), options));
}

Result<Recomputer*> Auditor::WindowOf(int first, int last) {
  auto& slot = windows_[{first, last}];
  if (slot == nullptr) {
    KV_ASSIGN_OR_RETURN(slot, Recomputer::Load(file_, first, last, options_.n_threads));
  }
  return slot.get();
}

Result<int> Auditor::RunOnce(double now) {
  KV_ASSIGN_OR_RETURN(auto jobs, store_->PendingRecomputes(options_.model, options_.batch));
  for (const market::RecomputeJob& job : jobs) {
    std::string note, failure;
    auto window = WindowOf(job.first, job.last);
    if (!window.ok()) {
      // Receipts name windows the market tiled itself, so this is the auditor's own trouble
      // (memory, a slice without the layers): judge nothing.
      return Error("audit {}: layers [{}, {}): {}", job.audit, job.first, job.last,
                   window.status().message());
    }
    auto report = (*window)->Check(job.reveal, options_.tolerance);
    if (!report.ok()) {
      note = "skipped: " + report.status().message();
      ++stats_.skipped;
    } else if (!report->failure.empty()) {
      failure = report->failure;
      ++stats_.failed;
    } else {
      note = fmt::format("ok: {} row(s), worst {:.3g} at position {} (tolerance {:.3g})",
                         report->compared, report->worst, report->worst_index, options_.tolerance);
      stats_.worst_passed = std::max(stats_.worst_passed, report->worst);
      ++stats_.passed;
    }
    KV_RETURN_IF_ERROR(store_->RecordRecompute(job.audit, note, failure, now));
    if (failure.empty()) {
      KV_LOG_DEBUG("audit {} of node {} (layers [{}, {})): {}", job.audit, job.node.substr(0, 8),
                   job.first, job.last, note);
    } else {
      KV_LOG_WARN("audit {} of node {} (layers [{}, {})) failed: {}", job.audit,
                  job.node.substr(0, 8), job.first, job.last, failure);
    }
  }
  return static_cast<int>(jobs.size());
}

}  // namespace kvasir::audit
