// The ring state a heartbeat answers with, kept between changes of the database (store.h,
// Store::RingFromCache; docs/MARKET.md, "The store").
#include <utility>

#include "market/store.h"

namespace kvasir::market {
namespace {

// Long enough for the heartbeats of a busy ring to share a read, short enough that the counts
// of recent demand (which move with the clock, not only with writes) stay current.
constexpr double kRingCacheSeconds = 1;

}  // namespace

bool Store::RingFromCache(const std::string& model, int ring, uint64_t mark, double now,
                          std::vector<ModelState>* out) {
  if (mark == 0) return false;
  if (mark != ring_cache_mark_) {
    ring_cache_.clear();
    ring_cache_mark_ = mark;
    return false;
  }
  auto it = ring_cache_.find({model, ring});
  if (it == ring_cache_.end()) return false;
  const double age = now - it->second.filled_at;
  if (!(age >= 0 && age < kRingCacheSeconds)) return false;
  out->assign(1, it->second.state);
  OverlayAll(out);
  return true;
}

void Store::CacheRing(const std::string& model, int ring, uint64_t mark, double now,
                      std::vector<ModelState> fresh) {
  if (mark == 0 || fresh.size() != 1) return;
  if (mark != ring_cache_mark_) {
    ring_cache_.clear();
    ring_cache_mark_ = mark;
  }
  ring_cache_[{model, ring}] = CachedRing{now, std::move(fresh[0])};
}

void Store::OverlayAll(std::vector<ModelState>* models) const {
  for (ModelState& m : *models) {
    for (RingState& r : m.rings) {
      for (WindowState& w : r.windows) {
        if (w.claim) Overlay(&*w.claim);
        for (ClaimInfo& s : w.standbys) Overlay(&s);
      }
    }
  }
}

}  // namespace kvasir::market
