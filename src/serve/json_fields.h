// Typed reads of untrusted JSON for the request parsers: nesting bounded before parsing, and each
// value checked for its type and range with an ApiError that names its path ("messages[2].role").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "serve/api_error.h"

namespace kvasir::serve {

// The JSON object in `body`. Refuses (400, naming no field) nesting deeper than `max_depth`
// before any parsing, text that is not JSON, and JSON that is not an object.
std::optional<nlohmann::json> ParseJsonObject(std::string_view body, int max_depth,
                                              ApiError* error);

// Each reads `v` (the value of `param`) into *out, or sets *error (invalid_type / invalid_value)
// and returns false.
bool ReadBool(const nlohmann::json& v, const std::string& param, bool* out, ApiError* error);
bool ReadString(const nlohmann::json& v, const std::string& param, size_t max_bytes,
                std::string* out, ApiError* error);
// An integer within [lo, hi] (a number with a fraction is refused).
bool ReadInt(const nlohmann::json& v, const std::string& param, int64_t lo, int64_t hi,
             int64_t* out, ApiError* error);
// A finite number within [lo, hi], or (lo, hi] with `lo_open`.
bool ReadFloat(const nlohmann::json& v, const std::string& param, double lo, double hi,
               bool lo_open, float* out, ApiError* error);

// A known field whose only accepted value is the neutral one: 400 "unsupported_parameter" naming
// `param`, saying what is supported.
ApiError Unsupported(const std::string& param, const std::string& what);

}  // namespace kvasir::serve
