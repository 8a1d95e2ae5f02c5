// A node's slices: where fetched windows are kept, and making sure the slice of a window is there
// (reused when verified, else fetched with progress on stderr). One function for `kvasir stage
// --fetch`, `kvasir fetch` and the market's joiner (`kvasir join`).
#pragma once

#include <string>

#include "base/status.h"
#include "shard/fetch.h"

namespace kvasir::node {

// Fetches with a progress bar (terminal) or progress log lines on stderr.
Status FetchWithProgress(FetchOptions o, FetchSummary* summary);
// Where `stage --fetch` and `join` keep slices by default: $KVASIR_CACHE_DIR, else
// $XDG_CACHE_HOME/kvasir, else ~/.cache/kvasir.
std::string DefaultSliceDir();
// "DIR/<file name of the URL without .gguf>.layers-A-B.gguf".
std::string SlicePathFor(const std::string& dir, const std::string& url, int first, int last);

// Makes sure o.out_path holds layers [o.first, o.last) of the model at o.url: reuses it when it is
// a verified slice of that model and window (identity from o.expected_model_id, else from the
// remote header), otherwise fetches it. When the server cannot be reached, a local slice of the
// right window is used with a warning.
Status EnsureSlice(const FetchOptions& o);

// "layers 3:4 of URL: 26 tensors, 254.0 MiB of 77.6 GiB (0.3% of the file) ...; verified: 26
// tensors SHA-256" (or "not verified: no digests (...)", see DescribeVerification).
std::string DescribeFetch(const FetchOptions& o, const FetchSummary& s);

}  // namespace kvasir::node
