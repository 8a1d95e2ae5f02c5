// kvasir fetch: builds a stage slice (see slice.h) from a GGUF file on an HTTP(S) server without
// downloading the model. The header and tensor index come first, through range requests that grow
// until they fit; then only the bytes of the window's tensors, as a few parallel range requests
// that coalesce neighbouring tensors. Bytes land directly at their place in `OUT.part`, which is
// renamed to OUT once everything is there and verified, so no half-written model ever sits under
// the final name. `OUT.part.state` records the pieces already on disk: an interrupted fetch
// (killed, network gone) continues where it stopped when run again with the same arguments.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "net/http_client.h"

namespace kvasir {

struct FetchProgress {
  uint64_t done_bytes = 0;   // window bytes on disk (resumed + downloaded)
  uint64_t total_bytes = 0;  // window bytes
  uint64_t resumed_bytes = 0;
  double seconds = 0;  // since the transfer of tensor bytes started
};

// How often a request is tried again after a failure that may pass (network errors, timeouts,
// truncated bodies, 408/429/5xx): at most `retries` more times, that is retries + 1 attempts in
// all, waiting delay_ms, then twice that, ... (at most 8 s) in between. Every request counts
// alone: each header read and each piece.
struct RetryPolicy {
  int retries = 4;
  int delay_ms = 500;
};

struct FetchOptions {
  std::string url;
  int first = 0, last = 0;  // layers [first, last)
  std::string out_path;
  net::HttpOptions http;
  int connections = 4;
  // A run of neighbouring tensors is cut into requests of at most this many bytes (also the unit
  // of resumption).
  uint64_t max_request_bytes = uint64_t{16} << 20;
  // Tensors closer than this in the parent are fetched in one request, gap included.
  uint64_t max_gap_bytes = uint64_t{64} << 10;
  RetryPolicy retry;
  // From a manifest: the parent's identity and per-tensor SHA-256 (64 hex digits) to verify.
  std::optional<std::string> expected_model_id;
  std::map<std::string, std::string> sha256;
  // Called from a reporting thread about 5 times a second while tensor bytes arrive, and once at
  // the end.
  std::function<void(const FetchProgress&)> progress;
};

struct FetchSummary {
  std::string url;                // after redirects
  uint64_t file_bytes = 0;        // the whole parent file on the server
  uint64_t header_bytes = 0;      // bytes read to get its header and tensor index
  int n_tensors = 0;              // in the window
  uint64_t window_bytes = 0;      // their bytes
  uint64_t downloaded_bytes = 0;  // body bytes received by this run (header and gaps included)
  uint64_t resumed_bytes = 0;     // window bytes found on disk from an earlier run
  uint64_t requests = 0;          // HTTP requests made (redirects and retries included)
  int digests = 0;                // tensors with a SHA-256 in the manifest
  int verified_tensors = 0;       // tensors whose SHA-256 matched the manifest
  // What pinned the file for the whole download (If-Range): 'ETag "..."' or 'Last-Modified ...';
  // empty when the server sent neither (or only a weak ETag): then a file replaced between two
  // requests goes unnoticed unless digests catch it.
  std::string pinned_by;
  uint64_t out_bytes = 0;  // size of the written slice
  double seconds = 0;
};

// Fetches layers [first, last) of the model at `url` into `out_path`. Every range request after
// the first is pinned with If-Range to the version of the file the first reply came from (its
// strong ETag, else its Last-Modified date). Errors name the URL (or the file) and what is wrong:
// a server that ignores Range, a body shorter than promised (after retries), a file that changed
// on the server mid-way, a SHA-256 mismatch, a full disk. On an error that a rerun cannot fix (a
// changed file included), the temporary files are removed; when the network failed after some
// pieces arrived, they are kept for the rerun (the message says so).
Status FetchSlice(const FetchOptions& options, FetchSummary* summary);

// What the summary can honestly claim: "verified: 9 tensors SHA-256" with digests, else
// "not verified: no digests (...)" saying whether the file was at least pinned to one version.
std::string DescribeVerification(const FetchSummary& summary);

// Reads the header and tensor index of a remote GGUF file (growing range requests). Returns the
// header bytes; `file_size` gets the whole file's size. Used by fetch and by `plan -m URL`.
struct RemoteHeader {
  std::string url;  // after redirects
  uint64_t file_size = 0;
  uint64_t bytes_read = 0;
  uint64_t requests = 0;
  std::string etag, last_modified;
  std::string if_range;        // the validator that pins this version (IfRangeValidator), or ""
  std::vector<uint8_t> bytes;  // a prefix of the file holding the whole header
};
Result<RemoteHeader> ReadRemoteHeader(const std::string& url, const net::HttpOptions& http,
                                      const RetryPolicy& retry = {});

// Checks that `path` is a complete slice of the model `model_id` (32 hex digits) holding exactly
// layers [first, last), and that its tensors match `sha256` where given. Used to reuse a slice
// fetched earlier instead of downloading it again.
Status VerifySlice(const std::string& path, const std::string& model_id, int first, int last,
                   const std::map<std::string, std::string>& sha256);

}  // namespace kvasir
