#include "cli/ring_options.h"

#include <cstdlib>

#include "base/log.h"
#include "base/secret_file.h"
#include "gguf/gguf_file.h"
#include "model/model_id.h"
#include "ring/node_key.h"
#include "ring/test_fault.h"

namespace kvasir::cli {

Status ParseLayers(const std::string& text, int* first, int* last) {
  const size_t colon = text.find(':');
  auto parse = [](const std::string& s, int* out) {
    if (s.empty() || s.size() > 6) return false;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
    }
    *out = std::atoi(s.c_str());
    return true;
  };
  if (colon == std::string::npos || !parse(text.substr(0, colon), first) ||
      !parse(text.substr(colon + 1), last)) {
    return Error("--layers '{}' is not A:B (for example 0:4)", text);
  }
  if (*first >= *last) return Error("--layers {}: the window is empty (need A < B)", text);
  return Status::Ok();
}

Result<Manifest> LoadManifestFor(const std::string& manifest_path, std::string* model_path) {
  KV_ASSIGN_OR_RETURN(Manifest m, LoadManifest(manifest_path));
  if (model_path->empty()) *model_path = m.model;
  KV_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(*model_path));
  KV_ASSIGN_OR_RETURN(ModelId id, ComputeModelId(file.header(), *model_path));
  if (ModelIdHex(id) != m.model_id) {
    return Error("{}: model {} is not the model {} was planned for ({})", *model_path,
                 ModelIdHex(id), manifest_path, m.model_id);
  }
  return m;
}

Result<ManifestRank> ManifestRankFor(const std::string& manifest_path, int rank, Manifest* manifest,
                                     bool* usage_error) {
  *usage_error = false;
  KV_ASSIGN_OR_RETURN(*manifest, LoadManifest(manifest_path));
  if (rank < 0 || rank >= static_cast<int>(manifest->ranks.size())) {
    *usage_error = true;
    return Error("--rank {} is not a rank of {} (0..{})", rank, manifest_path,
                 manifest->ranks.size() - 1);
  }
  return manifest->ranks[rank];
}

void AddRevealFlags(CLI::App& app, RevealFlags* flags) {
  app.add_option("--reveal-mib", flags->mib,
                 "MiB of recent sessions' boundary rows kept to reveal to audits (0: none)")
      ->capture_default_str();
  app.add_option("--reveal-seconds", flags->seconds,
                 "how long a session's rows are kept after it closed")
      ->capture_default_str();
  app.add_option("--test-fault-noise", flags->test_fault_noise,
                 "tests of the audits only: perturb each row sent on with this probability "
                 "(refused by builds without the tests)");
}

Result<ring::RowStoreOptions> ApplyRevealFlags(const RevealFlags& flags) {
  if (!(flags.mib >= 0 && flags.mib <= 1 << 20)) {
    return Error("--reveal-mib {} must be from 0 to 1048576", flags.mib);
  }
  if (!(flags.seconds >= 1 && flags.seconds <= 86400)) {
    return Error("--reveal-seconds {} must be from 1 to 86400", flags.seconds);
  }
  KV_RETURN_IF_ERROR(ring::CheckTestFaultNoise(flags.test_fault_noise));
  ring::RowStoreOptions o;
  o.max_bytes = static_cast<size_t>(flags.mib * 1048576.0);
  o.max_age_s = flags.seconds;
  return o;
}

CLI::Option* AddReplayFlag(CLI::App& app, int64_t* replay_mb) {
  return app
      .add_option("--replay-mb", *replay_mb,
                  "each stage's MiB of the rows sent on for live sessions, kept so that a replay "
                  "after a repair sends them again instead of recomputing them (0: a replay "
                  "recomputes every position)")
      ->capture_default_str();
}

Status CheckReplayMb(int64_t replay_mb) {
  if (replay_mb < 0 || replay_mb > (int64_t{1} << 20)) {
    return Error("--replay-mb {} must be from 0 to {}", replay_mb, int64_t{1} << 20);
  }
  return Status::Ok();
}

Status ApplyLogLevel(const std::string& text) {
  if (text == "debug") {
    SetLogLevel(LogLevel::kDebug);
  } else if (text == "info") {
    SetLogLevel(LogLevel::kInfo);
  } else if (text == "warn") {
    SetLogLevel(LogLevel::kWarn);
  } else if (text == "error") {
    SetLogLevel(LogLevel::kError);
  } else {
    return Error("--log-level '{}' is not one of debug, info, warn, error", text);
  }
  return Status::Ok();
}

namespace {

void AddCommonTrustFlags(CLI::App& app, TrustFlags* f) {
  app.add_option("--ring-secret-file", f->ring_secret_file,
                 "the ring's shared secret (at least 16 bytes; the same file on every stage, and "
                 "the relay's): links prove it in their handshake")
      ->check(CLI::ExistingFile);
  app.add_option("--client-key-file", f->client_key_file,
                 "a bearer secret (at least 16 bytes) clients prove to the head");
  app.add_flag("--insecure", f->insecure,
               "accept peers without any proof (links are still encrypted); loopback only");
  app.add_option("--link-timeout", f->link_timeout_s,
                 "seconds without a byte from a peer before its link is declared down")
      ->capture_default_str();
}

Status CheckTimeouts(const TrustFlags& f) {
  if (!(f.link_timeout_s >= 0.1 && f.link_timeout_s <= 3600)) {
    return Error("--link-timeout {} must be between 0.1 and 3600 seconds", f.link_timeout_s);
  }
  if (!(f.token_timeout_s >= 0.1 && f.token_timeout_s <= 86400)) {
    return Error("--token-timeout {} must be between 0.1 and 86400 seconds", f.token_timeout_s);
  }
  return Status::Ok();
}

Result<std::optional<ring::PublicKey>> RankKey(const Manifest& m, int rank) {
  const auto& r = m.ranks[static_cast<size_t>(rank)];
  if (!r.node_key) return std::optional<ring::PublicKey>();
  KV_ASSIGN_OR_RETURN(ring::PublicKey k, ring::ParsePublicKey(*r.node_key));
  return std::optional<ring::PublicKey>(k);
}

}  // namespace

void AddStageTrustFlags(CLI::App& app, TrustFlags* f) {
  app.add_option("--key", f->key_file,
                 "this node's key file (Ed25519), created on first use (default " +
                     ring::DefaultKeyPath() + ")");
  AddCommonTrustFlags(app, f);
}

void AddClientTrustFlags(CLI::App& app, TrustFlags* f) {
  app.add_option("--head-key", f->head_key,
                 "the head stage's node key (64 hex digits, `kvasir id` on the head): the "
                 "client talks only to that node");
  AddCommonTrustFlags(app, f);
  app.add_option("--token-timeout", f->token_timeout_s,
                 "seconds to wait for each token before giving up on the ring")
      ->capture_default_str();
  app.add_option("--vouch-key", f->vouch_key_file,
                 "a node key file (created on first use): sign the count of each session's "
                 "tokens with it, for the ring's receipt (docs/PROTOCOL.md, \"Client counts\")");
}

Status ApplyStageTrust(const TrustFlags& f, const Manifest* manifest, int rank,
                       ring::StageOptions* opt, bool* usage_error) {
  *usage_error = true;
  KV_RETURN_IF_ERROR(CheckTimeouts(f));
  opt->insecure = f.insecure;
  opt->link_timeout_ms = static_cast<int>(f.link_timeout_s * 1000);
  *usage_error = false;
  const std::string key_path = f.key_file.empty() ? ring::DefaultKeyPath() : f.key_file;
  bool created = false;
  KV_ASSIGN_OR_RETURN(ring::NodeKey key, ring::NodeKey::LoadOrCreate(key_path, &created));
  if (created) KV_LOG_INFO("created the node key {}", key_path);
  opt->key = std::make_shared<const ring::NodeKey>(std::move(key));
  if (!f.ring_secret_file.empty()) {
    KV_ASSIGN_OR_RETURN(opt->ring_secret, ReadSecretFile(f.ring_secret_file, "ring secret"));
  }
  if (!f.client_key_file.empty()) {
    KV_ASSIGN_OR_RETURN(opt->client_secret, ReadSecretFile(f.client_key_file, "client secret"));
  }
  if (manifest != nullptr && rank >= 0) {
    const int n = static_cast<int>(manifest->ranks.size());
    KV_ASSIGN_OR_RETURN(opt->pred_key, RankKey(*manifest, (rank + n - 1) % n));
    KV_ASSIGN_OR_RETURN(opt->succ_key, RankKey(*manifest, (rank + 1) % n));
    if (auto mine = RankKey(*manifest, rank);
        mine.ok() && mine->has_value() && **mine != opt->key->public_key()) {
      KV_LOG_WARN(
          "the manifest gives rank {} the node key {}, but this node is {} ({}): its "
          "neighbours will refuse it",
          rank, ring::ShortKey(**mine), ring::ShortKey(opt->key->public_key()), key_path);
    }
  }
  return Status::Ok();
}

Status ApplyClientTrust(const TrustFlags& f, const Manifest* manifest, ring::ClientOptions* opt,
                        bool* usage_error) {
  *usage_error = true;
  KV_RETURN_IF_ERROR(CheckTimeouts(f));
  opt->insecure = f.insecure;
  opt->link_timeout_ms = static_cast<int>(f.link_timeout_s * 1000);
  opt->token_timeout_ms = static_cast<int>(f.token_timeout_s * 1000);
  if (!f.head_key.empty()) {
    auto k = ring::ParsePublicKey(f.head_key);
    if (!k.ok()) return k.status().WithContext("--head-key");
    opt->head_key = *k;
  }
  *usage_error = false;
  if (!opt->head_key && manifest != nullptr && !manifest->ranks.empty()) {
    KV_ASSIGN_OR_RETURN(opt->head_key, RankKey(*manifest, 0));
  }
  if (!f.ring_secret_file.empty()) {
    KV_ASSIGN_OR_RETURN(opt->ring_secret, ReadSecretFile(f.ring_secret_file, "ring secret"));
  }
  if (!f.client_key_file.empty()) {
    KV_ASSIGN_OR_RETURN(opt->client_secret, ReadSecretFile(f.client_key_file, "client secret"));
  }
  if (!f.vouch_key_file.empty()) {
    bool created = false;
    auto key = ring::NodeKey::LoadOrCreate(f.vouch_key_file, &created);
    if (!key.ok()) return key.status().WithContext("--vouch-key");
    if (created) KV_LOG_INFO("created the node key {}", f.vouch_key_file);
    opt->client_key = std::make_shared<const ring::NodeKey>(std::move(key).value());
  }
  return Status::Ok();
}

}  // namespace kvasir::cli
