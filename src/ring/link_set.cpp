#include "ring/link_set.h"

namespace kvasir::ring {

bool LinkSet::Add(const std::shared_ptr<Link>& link) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  std::erase_if(links_, [](const auto& l) { return l.expired(); });
  links_.push_back(link);
  return true;
}

void LinkSet::CloseAll() {
  std::vector<std::shared_ptr<Link>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    for (auto& weak : links_) {
      if (auto l = weak.lock()) open.push_back(std::move(l));
    }
    links_.clear();
  }
  for (auto& l : open) l->Close();
}

}  // namespace kvasir::ring
