// One JSON string escaper for every place that writes JSON or grammar text by hand.
#pragma once

#include <string>
#include <string_view>

namespace kvasir {

// The contents of a JSON string holding `bytes` (what goes between the quotes; the quotes are not
// written): '"' and '\' escaped, \n \r \t by name, other bytes below 0x20 as \u00xx, and every
// other byte as it is. UTF-8 is kept as written, so pieces escaped apart join into the escape of
// the whole (a character split across pieces stays whole). The output is also a valid body of a
// grammar literal (the grammar reads the same escapes).
std::string JsonEscape(std::string_view bytes);

// `bytes` escaped as above and appended to `*out`.
void AppendJsonEscaped(std::string_view bytes, std::string* out);

}  // namespace kvasir
