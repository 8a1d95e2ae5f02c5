// What every launcher of a local ring (`kvasir run`, and the SupervisedRing of `kvasir serve -m`
// and `kvasir bench --stages`) gives its `kvasir stage` processes alike: the flags after the
// model's and the neighbours' own, and a delaying proxy on every link for the --hop-* flags.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "net/delay_proxy.h"

namespace kvasir::node {

struct StageProcessFlags {
  int listen_fd = -1;  // --listen-fd: the listener it inherits
  std::string name;    // --name
  int threads = 1;     // -t
  std::string backend = "cpu";
  std::string boundary = "f32";  // --boundary: f32, f16 or bf16
  int n_ctx = 0;                 // -c (0: the model's)
  std::string log_level = "warn";
  std::string secret_path;  // --ring-secret-file
  std::string key_path;     // --key
  int64_t replay_mb = 64;   // --replay-mb
  AttnType attn_type = AttnType::kF32;
};

// Appends `f` as flags to `args` (--attn-type only when not f32).
void AppendStageProcessArgs(const StageProcessFlags& f, std::vector<std::string>* args);

// --attn-type's text for `type`: "f32" or "bf16".
const char* AttnTypeName(AttnType type);

// One proxy per link of a ring whose stages listen on 127.0.0.1:`ports`[i] in ring order: proxy i
// forwards to stage (i + 1) % n, so stage i dials proxies[i]->address() as its successor. Each
// proxy's jitter has its own seed (i + 1).
Result<std::vector<std::unique_ptr<net::DelayProxy>>> StartHopProxies(
    const std::vector<uint16_t>& ports, const net::LinkShape& shape);

}  // namespace kvasir::node
