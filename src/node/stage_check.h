// The checks of a stage's options that need no model: run by `kvasir stage` and `kvasir join`
// before anything is fetched, so that a typo never costs a download (the stage runs them again
// when it starts).
#pragma once

#include "base/status.h"
#include "ring/stage.h"

namespace kvasir::node {

// Addresses (--listen unless a listening fd is given, --next unless a dial hook is set,
// --standby-peers), --chunk, --max-sessions, --max-clients, -t, --link-timeout, --repair-timeout,
// --standby on the head's window, --insecure off loopback, and something to authenticate both
// neighbours with (a node key must already be set). Errors name the flag and what is wrong.
Status CheckStageOptions(const ring::StageOptions& opt);

}  // namespace kvasir::node
