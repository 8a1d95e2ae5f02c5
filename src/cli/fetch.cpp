// kvasir fetch --url URL --layers A:B -o stage.gguf: downloads one window of a model served over
// HTTP(S) as a stage slice, reading only the header and that window's tensors (see
// shard/fetch.h). With --manifest M --rank R the window, the model identity and the per-tensor
// SHA-256 come from the manifest.
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/fetch_cli.h"
#include "cli/ring_options.h"
#include "net/url.h"
#include "node/slice_cache.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "fetch";

}  // namespace

int FetchMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{
        "Download one window of a model's layers from an HTTP(S) server as a stage slice, "
        "using range requests (only the header and the window's tensors are transferred).",
        "kvasir fetch"};
    std::string url, layers, out_path, manifest_path, log_level = "info";
    int rank = -1;
    bool json = false;
    FetchFlags flags;
    app.add_option("--url", url, "URL of the GGUF model (http:// or https://)");
    auto* layers_opt =
        app.add_option("--layers", layers, "window of layers A:B (A included, B excluded)");
    auto* manifest_opt = app.add_option(
        "--manifest", manifest_path, "rank manifest: window, model identity and SHA-256 from it");
    app.add_option("--rank", rank, "rank of the manifest to fetch")->needs(manifest_opt);
    manifest_opt->excludes(layers_opt);
    app.add_option("-o,--output", out_path, "stage GGUF file to write")->required();
    AddFetchFlags(app, &flags);
    app.add_flag("--json", json, "print the summary as JSON");
    app.add_option("--log-level", log_level, "debug, info, warn, error")->capture_default_str();
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (Status s = ApplyLogLevel(log_level); !s.ok()) return UsageError(kCmd, s.message());

    FetchOptions o;
    o.out_path = out_path;
    if (Status s = ApplyFetchFlags(flags, &o); !s.ok()) return UsageError(kCmd, s.message());
    if (!manifest_path.empty()) {
      Manifest m;
      bool usage = false;
      auto r = ManifestRankFor(manifest_path, rank, &m, &usage);
      if (!r.ok()) return usage ? UsageError(kCmd, r.status().message()) : Fail(kCmd, r.status());
      ApplyManifestRank(m, *r, &o);
      if (url.empty()) {
        if (!net::LooksLikeUrl(m.model)) {
          return UsageError(kCmd, fmt::format("{} names the model '{}', not a URL; give --url",
                                              manifest_path, m.model));
        }
        url = m.model;
      }
    } else {
      if (layers.empty()) {
        return UsageError(kCmd, "--layers A:B (or --manifest with --rank) is required");
      }
      if (Status s = ParseLayers(layers, &o.first, &o.last); !s.ok()) {
        return UsageError(kCmd, s.message());
      }
    }
    if (url.empty()) return UsageError(kCmd, "--url is required");
    if (auto parsed = net::ParseUrl(url); !parsed.ok()) {
      return UsageError(kCmd, parsed.status().message());
    }
    o.url = url;
    if (Status s = CheckWritable(out_path); !s.ok()) return Fail(kCmd, s);

    FetchSummary summary;
    if (Status s = node::FetchWithProgress(o, &summary); !s.ok()) return Fail(kCmd, s);
    if (json) {
      nlohmann::json j = {{"url", summary.url},
                          {"output", out_path},
                          {"first", o.first},
                          {"last", o.last},
                          {"file_bytes", summary.file_bytes},
                          {"header_bytes", summary.header_bytes},
                          {"n_tensors", summary.n_tensors},
                          {"window_bytes", summary.window_bytes},
                          {"out_bytes", summary.out_bytes},
                          {"downloaded_bytes", summary.downloaded_bytes},
                          {"resumed_bytes", summary.resumed_bytes},
                          {"requests", summary.requests},
                          {"verified", summary.digests > 0},
                          {"verification", DescribeVerification(summary)},
                          {"digests", summary.digests},
                          {"verified_tensors", summary.verified_tensors},
                          {"pinned_by", summary.pinned_by},
                          {"seconds", summary.seconds}};
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("fetched %s; wrote %s (%s)\n", node::DescribeFetch(o, summary).c_str(),
                  out_path.c_str(), HumanBytes(summary.out_bytes).c_str());
    }
    return kExitOk;
  });
}

}  // namespace kvasir::cli
