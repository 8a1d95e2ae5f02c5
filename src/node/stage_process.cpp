#include "node/stage_process.h"

#include <fmt/format.h>

namespace kvasir::node {

void AppendStageProcessArgs(const StageProcessFlags& f, std::vector<std::string>* args) {
  args->insert(args->end(), {"--listen-fd",
                             std::to_string(f.listen_fd),
                             "--name",
                             f.name,
                             "-t",
                             std::to_string(f.threads),
                             "--backend",
                             f.backend,
                             "--boundary",
                             f.boundary,
                             "-c",
                             std::to_string(f.n_ctx),
                             "--log-level",
                             f.log_level,
                             "--ring-secret-file",
                             f.secret_path,
                             "--key",
                             f.key_path,
                             "--replay-mb",
                             std::to_string(f.replay_mb)});
  if (f.attn_type != AttnType::kF32)
    args->insert(args->end(), {"--attn-type", AttnTypeName(f.attn_type)});
}

const char* AttnTypeName(AttnType type) { return type == AttnType::kBf16 ? "bf16" : "f32"; }

Result<std::vector<std::unique_ptr<net::DelayProxy>>> StartHopProxies(
    const std::vector<uint16_t>& ports, const net::LinkShape& shape) {
  std::vector<std::unique_ptr<net::DelayProxy>> proxies;
  const size_t n = ports.size();
  for (size_t i = 0; i < n; ++i) {
    net::DelayProxyOptions o;
    o.target = fmt::format("127.0.0.1:{}", ports[(i + 1) % n]);
    o.shape = shape;
    o.shape.seed = i + 1;
    KV_ASSIGN_OR_RETURN(auto p, net::DelayProxy::Start(o));
    proxies.push_back(std::move(p));
  }
  return proxies;
}

}  // namespace kvasir::node
