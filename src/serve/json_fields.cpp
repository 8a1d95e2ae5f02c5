#include "serve/json_fields.h"

#include <fmt/format.h>

#include <cmath>

namespace kvasir::serve {

using nlohmann::json;

ApiError BadRequest(std::string code, std::string param, std::string message) {
  ApiError e;
  e.status = 400;
  e.code = std::move(code);
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

std::string ErrorBody(const ApiError& e) {
  using ordered = nlohmann::ordered_json;
  ordered body = {{"error",
                   {{"message", e.message},
                    {"type", e.type},
                    {"code", e.code.empty() ? ordered(nullptr) : ordered(e.code)},
                    {"param", e.param.empty() ? ordered(nullptr) : ordered(e.param)}}}};
  return body.dump(-1, ' ', false, ordered::error_handler_t::replace);
}

ApiError Unsupported(const std::string& param, const std::string& what) {
  return BadRequest("unsupported_parameter", param,
                    fmt::format("'{}' is not supported yet: {}", param, what));
}

namespace {

// Deep nesting is refused before parsing, so no parser recursion or destructor can be driven by
// a body of a million '['.
bool DepthWithin(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

ApiError WrongType(const std::string& param, const char* expected, const json& v) {
  return BadRequest("invalid_type", param,
                    fmt::format("'{}' must be {}, not {}", param, expected, TypeName(v)));
}

}  // namespace

std::optional<json> ParseJsonObject(std::string_view body, int max_depth, ApiError* error) {
  if (!DepthWithin(body, max_depth)) {
    *error =
        BadRequest("invalid_json", "",
                   fmt::format("the request body nests JSON deeper than {} levels", max_depth));
    return std::nullopt;
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *error =
        BadRequest("invalid_json", "", "the request body is not valid JSON (or not valid UTF-8)");
    return std::nullopt;
  }
  if (!j.is_object()) {
    *error = BadRequest("invalid_json", "",
                        fmt::format("the request body must be a JSON object, not {}", TypeName(j)));
    return std::nullopt;
  }
  return j;
}

bool ReadBool(const json& v, const std::string& param, bool* out, ApiError* error) {
  if (!v.is_boolean()) {
    *error = WrongType(param, "true or false", v);
    return false;
  }
  *out = v.get<bool>();
  return true;
}

bool ReadString(const json& v, const std::string& param, size_t max_bytes, std::string* out,
                ApiError* error) {
  if (!v.is_string()) {
    *error = WrongType(param, "a string", v);
    return false;
  }
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() > max_bytes) {
    *error =
        BadRequest("invalid_value", param,
                   fmt::format("'{}' is {} bytes long, at most {}", param, s.size(), max_bytes));
    return false;
  }
  *out = s;
  return true;
}

bool ReadInt(const json& v, const std::string& param, int64_t lo, int64_t hi, int64_t* out,
             ApiError* error) {
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    x = u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
             v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 9e15) {
    x = static_cast<int64_t>(v.get<double>());  // 2.0 is an integer in JSON's eyes
  } else {
    *error = WrongType(param, "an integer", v);
    return false;
  }
  if (x < lo || x > hi) {
    *error = BadRequest("invalid_value", param,
                        fmt::format("'{}' must be from {} to {}, not {}", param, lo, hi, x));
    return false;
  }
  *out = x;
  return true;
}

bool ReadFloat(const json& v, const std::string& param, double lo, double hi, bool lo_open,
               float* out, ApiError* error) {
  if (!v.is_number()) {
    *error = WrongType(param, "a number", v);
    return false;
  }
  const double x = v.get<double>();
  const bool above = lo_open ? x > lo : x >= lo;
  if (!std::isfinite(x) || !above || x > hi) {
    *error = BadRequest(
        "invalid_value", param,
        fmt::format("'{}' must be in {}{}, {}], not {}", param, lo_open ? "(" : "[", lo, hi, x));
    return false;
  }
  *out = static_cast<float>(x);
  return true;
}

}  // namespace kvasir::serve
