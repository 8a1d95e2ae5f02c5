#include "timing_trace_util.h"

#include <sstream>

namespace kvasir::testing {

std::vector<TraceEvent> ParseTrace(const std::string& text) {
  std::vector<TraceEvent> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string tag;
    TraceEvent e;
    if (!(words >> tag >> e.us >> e.who >> e.event) || tag != "[timing]") continue;
    for (std::string kv; words >> kv;) {
      const size_t eq = kv.find('=');
      if (eq != std::string::npos) e.fields[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    out.push_back(std::move(e));
  }
  return out;
}

const TraceEvent* FindTrace(const std::vector<TraceEvent>& events, const std::string& who,
                            const std::string& event, const std::string& pos0) {
  for (const TraceEvent& e : events) {
    if (e.who != who || e.event != event) continue;
    if (!pos0.empty() && (!e.fields.count("pos0") || e.fields.at("pos0") != pos0)) continue;
    return &e;
  }
  return nullptr;
}

}  // namespace kvasir::testing
