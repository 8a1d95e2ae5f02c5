// kvasir id: prints this node's public key, the name its neighbours, manifests and the market know
// it by. Creates the key on first use.
#include <cstdio>

#include "base/log.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "ring/node_key.h"

namespace kvasir::cli {

int IdMain(int argc, char** argv) {
  constexpr const char* kCmd = "id";
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{"Print this node's public key (Ed25519, 64 hex digits). The key file is created "
                 "(mode 0600) when it does not exist.",
                 "kvasir id"};
    std::string key_file;
    app.add_option("--key", key_file, "key file (default " + ring::DefaultKeyPath() + ")");
    bool no_create = false;
    app.add_flag("--no-create", no_create, "fail instead of creating a missing key file");
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    const std::string path = key_file.empty() ? ring::DefaultKeyPath() : key_file;
    bool created = false;
    auto key = no_create ? ring::NodeKey::Load(path) : ring::NodeKey::LoadOrCreate(path, &created);
    if (!key.ok()) return Fail(kCmd, key.status());
    if (created) KV_LOG_INFO("id: created the node key {}", path);
    std::printf("%s\n", ring::PublicKeyHex(key->public_key()).c_str());
    return kExitOk;
  });
}

}  // namespace kvasir::cli
