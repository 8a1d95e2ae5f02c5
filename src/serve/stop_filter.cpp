#include "serve/stop_filter.h"

#include <algorithm>

namespace kvasir::serve {

StopFilter::StopFilter(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopFilter::Push(std::string_view text) {
  if (stopped_) return "";
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, std::string());
  // A stop string can only begin in the held text: whatever was shown ended with no prefix of one.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Keep the longest tail that some stop string starts with.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(held_.size(), s.size() - 1); k > keep; --k) {
      if (std::string_view(held_).substr(held_.size() - k) == std::string_view(s).substr(0, k)) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopFilter::Flush() {
  if (stopped_) return "";
  return std::exchange(held_, std::string());
}

std::string GeneratedText::Push(std::string_view piece) { return stops_.Push(utf8_.Push(piece)); }

std::string GeneratedText::Finish() {
  std::string out = stops_.Push(utf8_.Flush());
  return out + stops_.Flush();
}

}  // namespace kvasir::serve
