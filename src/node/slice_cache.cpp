#include "node/slice_cache.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>

#include "base/human.h"
#include "base/log.h"
#include "gguf/gguf_file.h"
#include "model/model_id.h"
#include "net/url.h"
#include "node/progress.h"

namespace kvasir::node {

Status FetchWithProgress(FetchOptions o, FetchSummary* summary) {
  ProgressBar bar(fmt::format("fetch layers {}:{}", o.first, o.last), StderrIsTty());
  o.progress = [&bar](const FetchProgress& p) {
    bar.Update(p.done_bytes, p.total_bytes, p.done_bytes - p.resumed_bytes, p.seconds);
  };
  Status s = FetchSlice(o, summary);
  bar.Finish();
  return s;
}

std::string DefaultSliceDir() {
  if (const char* d = std::getenv("KVASIR_CACHE_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d != nullptr && *d != '\0') {
    return std::string(d) + "/kvasir";
  }
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    return std::string(h) + "/.cache/kvasir";
  }
  return ".";
}

std::string SlicePathFor(const std::string& dir, const std::string& url, int first, int last) {
  std::string name = "model";
  if (auto u = net::ParseUrl(url); u.ok()) {
    std::string path = u->target.substr(0, u->target.find('?'));
    std::string base = path.substr(path.rfind('/') + 1);
    if (base.size() > 5 && base.substr(base.size() - 5) == ".gguf") base.resize(base.size() - 5);
    if (!base.empty()) name = base;
  }
  return fmt::format("{}/{}.layers-{}-{}.gguf", dir, name, first, last);
}

Status EnsureSlice(const FetchOptions& o) {
  const std::filesystem::path dir = std::filesystem::path(o.out_path).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Error("{}: cannot create directory: {}", dir.string(), ec.message());
  }
  if (std::filesystem::exists(o.out_path)) {
    std::string model_id;
    if (o.expected_model_id) {
      model_id = *o.expected_model_id;
    } else {
      auto rh = ReadRemoteHeader(o.url, o.http, o.retry);
      if (!rh.ok()) {
        // Offline: the local slice is all there is. It must at least hold the window.
        auto file = GgufFile::Open(o.out_path);
        if (!file.ok()) return rh.status();
        auto f = file->GetUint("kvasir.window.first");
        auto l = file->GetUint("kvasir.window.last");
        if (f.ok() && l.ok() && *f == static_cast<uint64_t>(o.first) &&
            *l == static_cast<uint64_t>(o.last)) {
          KV_LOG_WARN("fetch: cannot check {} against {} ({}); using it as it is", o.out_path,
                      o.url, rh.status().message());
          return Status::Ok();
        }
        return rh.status();
      }
      auto header = ParseGgufHeader(rh->bytes, rh->file_size, rh->url);
      if (!header.ok()) return header.status();
      auto id = ComputeModelId(*header, rh->url);
      if (!id.ok()) return id.status();
      model_id = ModelIdHex(*id);
    }
    Status same = VerifySlice(o.out_path, model_id, o.first, o.last, o.sha256);
    if (same.ok()) {
      KV_LOG_INFO("fetch: {} already holds layers {}:{} of model {}{}; not downloading", o.out_path,
                  o.first, o.last, model_id, o.sha256.empty() ? "" : " (SHA-256 verified)");
      return Status::Ok();
    }
    KV_LOG_WARN("fetch: not reusing {}: {}; fetching it again", o.out_path, same.message());
  }
  FetchSummary summary;
  KV_RETURN_IF_ERROR(FetchWithProgress(o, &summary));
  KV_LOG_INFO("fetched {}; wrote {}", DescribeFetch(o, summary), o.out_path);
  return Status::Ok();
}

std::string DescribeFetch(const FetchOptions& o, const FetchSummary& s) {
  const double pct = s.file_bytes > 0 ? 100.0 * static_cast<double>(s.window_bytes) /
                                            static_cast<double>(s.file_bytes)
                                      : 0.0;
  const double rate = s.seconds > 0 ? static_cast<double>(s.downloaded_bytes) / s.seconds : 0.0;
  std::string out = fmt::format(
      "layers {}:{} of {}: {} tensors, {} of {} ({:.2f}% of the file); downloaded {} in {:.1f} s "
      "({}/s, {} requests, {} connections)",
      o.first, o.last, s.url, s.n_tensors, HumanBytes(s.window_bytes), HumanBytes(s.file_bytes),
      pct, HumanBytes(s.downloaded_bytes), s.seconds, HumanBytes(static_cast<uint64_t>(rate)),
      s.requests, o.connections);
  if (s.resumed_bytes > 0) {
    out += fmt::format("; {} resumed from an earlier run", HumanBytes(s.resumed_bytes));
  }
  out += "; " + DescribeVerification(s);
  return out;
}

}  // namespace kvasir::node
