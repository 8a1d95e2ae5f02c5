// Sizes for people: "512 B", "1.13 KiB", "4.00 MiB", "1.25 GiB".
#pragma once

#include <cstdint>
#include <string>

namespace kvasir {

std::string HumanBytes(uint64_t bytes);

}  // namespace kvasir
