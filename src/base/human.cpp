#include "base/human.h"

#include <fmt/format.h>

namespace kvasir {

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (v >= 1024.0 && unit < 3) {
    v /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", v, kUnits[unit]);
}

}  // namespace kvasir
