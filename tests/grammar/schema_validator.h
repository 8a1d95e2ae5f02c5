// A small JSON Schema validator for the tests, written from the specification's wording for the
// keywords the compiler supports (it shares no code with it). Returns "" when `value` is valid,
// else why not. Patterns are checked with std::regex (ECMAScript), so tests give it ASCII ones.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kvasir::grammar::testing {

std::string Validate(const nlohmann::ordered_json& value, const nlohmann::ordered_json& schema,
                     const nlohmann::ordered_json& root);

}  // namespace kvasir::grammar::testing
