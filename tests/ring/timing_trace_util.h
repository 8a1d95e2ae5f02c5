// The lines of --trace-timing (base/timing_trace.h) read back, for ring tests that check which
// rows each stage ran and in what order.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvasir::testing {

// "[timing] US WHO EVENT key=value ...".
struct TraceEvent {
  int64_t us = 0;
  std::string who, event;
  std::map<std::string, std::string> fields;
};

// The trace lines of `text` (other lines are skipped), in order.
std::vector<TraceEvent> ParseTrace(const std::string& text);

// The first event of `who` named `event` for the rows at `pos0` (any when empty); nullptr if none.
const TraceEvent* FindTrace(const std::vector<TraceEvent>& events, const std::string& who,
                            const std::string& event, const std::string& pos0 = "");

}  // namespace kvasir::testing
