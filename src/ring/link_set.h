// The links a part of a stage opened, held weakly (a link that ends is freed at once), so that
// stopping can close every one still open: the successor links of a stage, the predecessor and
// client links of its predecessor side. Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "ring/link.h"

namespace kvasir::ring {

class LinkSet {
 public:
  // Registers `link` for CloseAll(); false (and not registered) once CloseAll() ran: the caller
  // drops it.
  bool Add(const std::shared_ptr<Link>& link);
  // Closes every registered link that is still open, and refuses later ones. Links are closed,
  // and released, outside the set's lock: the last reference may be the one taken here, and a
  // Link's destructor waits for the watchdog, whose housekeeping may wait for its owner's locks.
  // Idempotent.
  void CloseAll();

 private:
  std::mutex mu_;
  std::vector<std::weak_ptr<Link>> links_;  // guarded by mu_
  bool closed_ = false;                     // guarded by mu_
};

}  // namespace kvasir::ring
