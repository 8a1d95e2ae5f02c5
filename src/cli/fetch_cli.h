// The fetch flags shared by `kvasir fetch` and `kvasir stage --fetch` (the fetch itself, with its
// progress, and the reuse of a slice fetched before are in node/slice_cache.h).
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
}  // namespace kvasir::cli
