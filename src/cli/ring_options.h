// Parsing of the ring-related flags shared by `stage`, `run` and `generate --ring`.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "base/status.h"
#include "planner/manifest.h"
#include "ring/client.h"
#include "ring/stage.h"
#include "ring/wire.h"

namespace kvasir::cli {

// "A:B" with 0 <= A < B. The model's layer count is checked when the model is loaded.
Status ParseLayers(const std::string& text, int* first, int* last);
// Loads a rank manifest and checks that `model_path` (or, when empty, the manifest's own model) is
// the model it was planned for. Sets *model_path to the file to use.
Result<Manifest> LoadManifestFor(const std::string& manifest_path, std::string* model_path);

// Loads and validates a manifest and picks rank `rank` (a usage error when it has no such rank; the
// message names the flag and the valid range). *manifest gets the manifest.
Result<ManifestRank> ManifestRankFor(const std::string& manifest_path, int rank, Manifest* manifest,
                                     bool* usage_error);

// The trust flags of stages and clients (docs/PROTOCOL.md, "Handshake").
struct TrustFlags {
  std::string key_file;          // --key (stages): the node key, created on first use
  std::string ring_secret_file;  // --ring-secret-file
  std::string client_key_file;   // --client-key-file: the bearer secret clients must prove
  std::string head_key;          // --head-key (clients): the head's node key, 64 hex digits
  bool insecure = false;         // --insecure
  double link_timeout_s = 10;    // --link-timeout
  double token_timeout_s = 60;   // --token-timeout (clients)
  std::string vouch_key_file;    // --vouch-key (clients): sign each session's count with it
};
// --key, --ring-secret-file, --client-key-file, --insecure, --link-timeout.
void AddStageTrustFlags(CLI::App& app, TrustFlags* flags);
// --ring-secret-file, --head-key, --client-key-file, --insecure, --link-timeout, --token-timeout,
// --vouch-key.
void AddClientTrustFlags(CLI::App& app, TrustFlags* flags);
// Loads the key and secrets into `opt`. With a manifest, the neighbours' node keys of rank
// `rank` (when the manifest lists them) become the only nodes accepted on the links.
// *usage_error tells a bad flag from a file that cannot be read.
Status ApplyStageTrust(const TrustFlags& flags, const Manifest* manifest, int rank,
                       ring::StageOptions* opt, bool* usage_error);
// The same for a client: --head-key, else rank 0's node_key of a manifest, else the ring secret.
Status ApplyClientTrust(const TrustFlags& flags, const Manifest* manifest, ring::ClientOptions* opt,
                        bool* usage_error);

// The row store's budget (docs/PROTOCOL.md, "Row commitments"): --reveal-mib, --reveal-seconds.
struct RevealFlags {
  double mib = 256;
  double seconds = 600;
  double test_fault_noise = 0;  // --test-fault-noise (test builds only, ring/test_fault.h)
};
void AddRevealFlags(CLI::App& app, RevealFlags* flags);
// Checks the flags (a usage error names the flag) and gives the store's options.
Result<ring::RowStoreOptions> ApplyRevealFlags(const RevealFlags& flags);

// --replay-mb of the stages a command starts (as `kvasir stage --replay-mb`): MiB of the rows
// sent on for live sessions that each stage keeps, so that a replay after a repair sends them
// again instead of recomputing them (docs/PROTOCOL.md, "Repair").
inline constexpr int64_t kDefaultReplayMb = 64;
// Returns the option, whose help a command that is one stage rewords.
CLI::Option* AddReplayFlag(CLI::App& app, int64_t* replay_mb);
// A usage error naming the flag unless 0 <= replay_mb <= 2^20.
Status CheckReplayMb(int64_t replay_mb);

// "debug", "info", "warn" or "error".
Status ApplyLogLevel(const std::string& text);

}  // namespace kvasir::cli
