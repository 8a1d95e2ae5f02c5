// The speculation flags of the ring commands (`run`, `stage`, `serve`, `bench --stages`):
// --draft, --draft-model, --draft-max, --draft-windows. Drafting happens on the ring's last stage
// (docs/PROTOCOL.md, "Speculation"); a supervisor passes the flags to that stage only.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "spec/drafter.h"

namespace CLI {
class App;
}

namespace kvasir {
struct ModelConfig;
}

namespace kvasir::cli {

struct DraftFlags {
  std::string kind = "none";  // auto, mtp, ngram, model, none
  std::string model;          // --draft-model
  int max_tokens = 4;         // --draft-max
  int windows = 3;            // --draft-windows (docs/PERFORMANCE.md, "Overlap")
};

void AddDraftFlags(CLI::App& app, DraftFlags* flags);

// The options the flags ask for; refused (naming the flag) before any side effect: an unknown
// drafter, --draft model without --draft-model or a file that is not there, --draft-max outside
// 0..wire::kMaxDraftTokens, --draft-windows outside 1..ring::kMaxDraftWindows.
Result<spec::DraftOptions> CheckDraftFlags(const DraftFlags& flags);

// The flags against the model they will draft for, where the command reads its header before any
// stage starts: --draft mtp on a model without a nextn block (cfg.n_layer_nextn) is refused.
Status CheckDraftForModel(const DraftFlags& flags, const ModelConfig& cfg);

// The same flags for a `kvasir stage` process (the ring's last stage); none for --draft none.
std::vector<std::string> DraftStageArgs(const DraftFlags& flags);

}  // namespace kvasir::cli
