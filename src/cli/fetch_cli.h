// The fetch flags and the progress-reporting fetch shared by `kvasir fetch` and `kvasir stage
// --fetch`.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "base/status.h"
#include "planner/manifest.h"
#include "shard/fetch.h"

namespace kvasir::cli {

struct FetchFlags {
  std::string ca_file;
  int connections = 4;
  int timeout_s = 30;
  int retries = 4;  // at most 5 attempts of each request
  double request_mib = 16;
};

// --ca, -j/--connections, --timeout, --retries, --request-size.
void AddFetchFlags(CLI::App& app, FetchFlags* flags);
// Range checks (a usage error names the flag) and copies the flags into `o`.
Status ApplyFetchFlags(const FetchFlags& flags, FetchOptions* o);
// The manifest's identity for the model and the SHA-256 of each tensor of `rank`, where given.
void ApplyManifestRank(const Manifest& m, const ManifestRank& rank, FetchOptions* o);
// Fetches with a progress bar (terminal) or progress log lines on stderr.
Status FetchWithProgress(FetchOptions o, FetchSummary* summary);
// Where `stage --fetch` keeps slices by default: $KVASIR_CACHE_DIR, else $XDG_CACHE_HOME/kvasir,
// else ~/.cache/kvasir.
std::string DefaultSliceDir();
// "DIR/<file name of the URL without .gguf>.layers-A-B.gguf".
std::string SlicePathFor(const std::string& dir, const std::string& url, int first, int last);

// Makes sure `dest` holds layers [o.first, o.last) of the model at o.url: reuses it when it is a
// verified slice of that model and window (identity from o.expected_model_id, else from the
// remote header), otherwise fetches it. When the server cannot be reached, a local slice of the
// right window is used with a warning.
Status EnsureSlice(const FetchOptions& o);

// "layers 3:4 of URL: 26 tensors, 254.0 MiB of 77.6 GiB (0.3% of the file) ...; verified: 26
// tensors SHA-256" (or "not verified: no digests (...)", see DescribeVerification).
std::string DescribeFetch(const FetchOptions& o, const FetchSummary& s);

}  // namespace kvasir::cli
