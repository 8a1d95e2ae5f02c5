#include "cli/fetch_cli.h"

#include <algorithm>

namespace kvasir::cli {

void AddFetchFlags(CLI::App& app, FetchFlags* f) {
  app.add_option("--ca", f->ca_file,
                 "PEM file of CA certificates to trust for https:// (and a relay's wss://)")
      ->check(CLI::ExistingFile);
  app.add_option("-j,--connections", f->connections, "parallel connections")->capture_default_str();
  app.add_option("--timeout", f->timeout_s,
                 "seconds one request may take in all (connect, send and the whole reply, however "
                 "slowly it arrives); a request that runs over counts as failed and is retried")
      ->capture_default_str();
  app.add_option("--retries", f->retries,
                 "times a failed request (network error, timeout, cut-off body, 5xx) is tried "
                 "again, with backoff from 0.5 s: at most N+1 attempts of each request, header "
                 "reads included")
      ->capture_default_str();
  app.add_option("--request-size", f->request_mib,
                 "MiB per range request (also the unit an interrupted fetch resumes from)")
      ->capture_default_str();
}

Status ApplyFetchFlags(const FetchFlags& f, FetchOptions* o) {
  if (f.connections < 1 || f.connections > 64) {
    return Error("-j/--connections must be in 1..64 (got {})", f.connections);
  }
  if (f.timeout_s < 1 || f.timeout_s > 3600) {
    return Error("--timeout must be in 1..3600 seconds (got {})", f.timeout_s);
  }
  if (f.retries < 0 || f.retries > 100) {
    return Error("--retries must be in 0..100 (got {})", f.retries);
  }
  if (!(f.request_mib >= 1.0 / 16 && f.request_mib <= 1024)) {
    return Error("--request-size must be in 0.0625..1024 MiB (got {})", f.request_mib);
  }
  o->max_request_bytes = static_cast<uint64_t>(f.request_mib * 1024 * 1024);
  o->connections = f.connections;
  o->retry.retries = f.retries;
  o->http.ca_file = f.ca_file;
  o->http.request_timeout_ms = f.timeout_s * 1000;
  o->http.connect_timeout_ms = std::min(f.timeout_s, 15) * 1000;
  return Status::Ok();
}

void ApplyManifestRank(const Manifest& m, const ManifestRank& rank, FetchOptions* o) {
  o->expected_model_id = m.model_id;
  o->first = rank.first;
  o->last = rank.last;
  o->sha256.clear();
  for (const ManifestTensor& t : rank.tensors) {
    if (t.sha256) o->sha256[t.name] = *t.sha256;
  }
}

}  // namespace kvasir::cli
