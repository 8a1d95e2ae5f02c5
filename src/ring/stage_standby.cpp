// Stage runtime, the neighbours' standbys (docs/PROTOCOL.md, "Repair"; docs/MARKET.md,
// "Standbys"). The successor link dials `next`, then the --standby-peers, then the standbys of the
// successor's window that the market lists (SetStandbys, from `kvasir join`'s heartbeats), each
// accepted with its own key; the standbys of the predecessor's window are accepted as
// predecessors with theirs. A standby is for a stage that died: until a successor has linked
// once, only `next` is dialed, and so it is while a stage (not the head) has no predecessor.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "base/log.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {

void StageImpl::SetStandbys(std::vector<StandbyPeer> next, std::vector<StandbyPeer> pred) {
  // The predecessor's window's: accepted as the predecessor, the relayed ones kept dialed.
  pred_side_->SetStandbys(pred);
  std::lock_guard<std::mutex> lock(standby_mu_);
  if (next.size() != next_standbys_.size() || pred.size() != n_pred_standbys_) {
    KV_LOG_INFO("{}: {} standby(s) of the successor's window, {} of the predecessor's",
                options_.name, next.size(), pred.size());
  }
  next_standbys_ = std::move(next);
  n_pred_standbys_ = pred.size();
}

bool StageImpl::AcceptsSuccessorStandby(const PublicKey& key) {
  std::lock_guard<std::mutex> lock(standby_mu_);
  return std::any_of(next_standbys_.begin(), next_standbys_.end(),
                     [&](const StandbyPeer& p) { return p.key == key; });
}

bool StageImpl::MayCallStandbys(const std::function<bool()>& cancelled) {
  // A stage other than the head whose predecessor is gone as well may be the process that froze
  // (or was cut off) and was replaced meanwhile: a standby it called would take it as its
  // predecessor and dial the head, which would take that for a newer tail and cut the healthy
  // one off. So it dials only `next`, which refuses it by generation if it was replaced and
  // tells it so; once a predecessor links again, it calls on the standbys as before. Both links
  // of such a stage drop at the same moment (one watchdog pass; or the two FINs read on waking),
  // so the predecessor's is given a moment to be seen down first.
  if (options_.first == 0) return true;
  constexpr auto kSettle = std::chrono::milliseconds(150);
  const auto until = std::chrono::steady_clock::now() + kSettle;
  while (std::chrono::steady_clock::now() < until && !cancelled()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred_side_->pred_up();
}

Result<std::unique_ptr<net::Stream>> StageImpl::DialSuccessor(
    const std::function<bool()>& cancelled) {
  // Each target in turn from succ_next_: the first that takes the connection; the next dial
  // starts after it, so one that took it and then answered no handshake (a frozen process) is
  // not the first one tried again.
  std::vector<StandbyPeer> standbys;
  {
    std::lock_guard<std::mutex> lock(standby_mu_);
    standbys = next_standbys_;
  }
  const size_t n_fixed = options_.dial_next ? 1 : succ_addrs_.size();
  const size_t total = n_fixed + standbys.size();
  const bool any = succ_linked_once_.load() && total > 1 && MayCallStandbys(cancelled);
  const size_t n = any ? total : 1;
  Status last = Error("{}: no successor to dial", options_.name);
  for (size_t k = 0; k < n && !cancelled(); ++k) {
    const size_t i = ((any ? succ_next_ : 0) + k) % total;
    Result<std::unique_ptr<net::Stream>> stream = Error("unreachable");
    if (i < n_fixed) {
      stream = options_.dial_next ? options_.dial_next(cancelled)
                                  : net::DialTcp(succ_addrs_[i].first, succ_addrs_[i].second, 2000);
    } else {
      const StandbyPeer& p = standbys[i - n_fixed];
      if (p.dial) {
        stream = p.dial(cancelled);
      } else {
        std::string host;
        uint16_t port = 0;
        if (Status st = net::ParseHostPort(p.address, &host, &port); !st.ok()) {
          last = st;
          continue;
        }
        stream = net::DialTcp(host, port, 2000);
      }
    }
    if (stream.ok()) {
      succ_next_ = (i + 1) % total;
      return stream;
    }
    last = stream.status();
  }
  return last;
}

}  // namespace kvasir::ring
