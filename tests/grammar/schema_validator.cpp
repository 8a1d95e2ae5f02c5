#include "schema_validator.h"

#include <cmath>
#include <regex>

namespace kvasir::grammar::testing {
namespace {

using J = nlohmann::ordered_json;

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool IsType(const J& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "string") return v.is_string();
  if (t == "array") return v.is_array();
  if (t == "object") return v.is_object();
  if (t == "number") return v.is_number();
  if (t == "integer") {
    return v.is_number_integer() ||
           (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  }
  return false;
}

bool LeapYear(int y) { return y % 4 == 0 && (y % 100 != 0 || y % 400 == 0); }

bool ValidDate(const std::string& s) {
  static const std::regex re(R"(^(\d{4})-(\d{2})-(\d{2})$)");
  std::smatch m;
  if (!std::regex_match(s, m, re)) return false;
  const int y = std::stoi(m[1]), mo = std::stoi(m[2]), d = std::stoi(m[3]);
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (mo < 1 || mo > 12 || d < 1) return false;
  return d <= kDays[mo - 1] + (mo == 2 && LeapYear(y) ? 1 : 0);
}

bool ValidTime(const std::string& s) {
  static const std::regex re(
      R"(^([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$)");
  return std::regex_match(s, re);
}

bool ValidFormat(const std::string& format, const std::string& s) {
  if (format == "date") return ValidDate(s);
  if (format == "time") return ValidTime(s);
  if (format == "date-time") {
    const size_t t = s.find('T');
    return t != std::string::npos && ValidDate(s.substr(0, t)) && ValidTime(s.substr(t + 1));
  }
  if (format == "uuid") {
    static const std::regex re(R"(^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$)");
    return std::regex_match(s, re);
  }
  if (format == "email") {
    static const std::regex re(
        R"(^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$)");
    return std::regex_match(s, re);
  }
  if (format == "ipv4") {
    static const std::regex re(
        R"(^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$)");
    return std::regex_match(s, re);
  }
  return false;
}

const J& Resolve(const std::string& ref, const J& root) {
  if (ref == "#") return root;
  const std::string defs = ref.rfind("#/$defs/", 0) == 0 ? "$defs" : "definitions";
  return root[defs][ref.substr(defs.size() + 3)];
}

}  // namespace

std::string Validate(const J& v, const J& s, const J& root) {
  if (s.is_boolean()) return s.get<bool>() ? "" : "schema false";
  if (s.contains("$ref")) return Validate(v, Resolve(s["$ref"], root), root);
  if (s.contains("anyOf")) {
    for (const J& sub : s["anyOf"]) {
      if (Validate(v, sub, root).empty()) return "";
    }
    return "no anyOf branch matches " + v.dump();
  }
  if (s.contains("oneOf")) {
    int n = 0;
    for (const J& sub : s["oneOf"]) n += Validate(v, sub, root).empty();
    return n == 1 ? "" : std::to_string(n) + " oneOf branches match " + v.dump();
  }
  if (s.contains("allOf")) {
    for (const J& sub : s["allOf"]) {
      if (std::string e = Validate(v, sub, root); !e.empty()) return e;
    }
  }
  if (s.contains("const") && v != s["const"]) return v.dump() + " is not the const";
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) {
    return v.dump() + " is not in the enum";
  }
  if (s.contains("type")) {
    const J types = s["type"].is_array() ? s["type"] : J::array({s["type"]});
    bool any = false;
    for (const J& t : types) any = any || IsType(v, t.get<std::string>());
    if (!any) return v.dump() + " is not of type " + s["type"].dump();
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return v.dump() + " < minimum";
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return v.dump() + " > maximum";
    if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) {
      return v.dump() + " <= exclusiveMinimum";
    }
    if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) {
      return v.dump() + " >= exclusiveMaximum";
    }
  }
  if (v.is_string()) {
    const std::string& str = v.get_ref<const std::string&>();
    if (s.contains("minLength") && CodePoints(str) < s["minLength"].get<size_t>())
      return "too short";
    if (s.contains("maxLength") && CodePoints(str) > s["maxLength"].get<size_t>())
      return "too long";
    if (s.contains("pattern") && !std::regex_search(str, std::regex(s["pattern"].get<std::string>(),
                                                                    std::regex::ECMAScript))) {
      return v.dump() + " does not match the pattern";
    }
    if (s.contains("format") && !ValidFormat(s["format"], str)) {
      return v.dump() + " is not a valid " + s["format"].get<std::string>();
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return "too few items";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return "too many items";
    if (s.contains("items")) {
      for (const J& item : v) {
        if (std::string e = Validate(item, s["items"], root); !e.empty()) return "item: " + e;
      }
    }
  }
  if (v.is_object()) {
    const J props = s.value("properties", J::object());
    if (s.contains("required")) {
      for (const J& name : s["required"]) {
        if (!v.contains(name.get<std::string>())) return "missing " + name.dump();
      }
    }
    for (const auto& [k, item] : v.items()) {
      if (props.contains(k)) {
        if (std::string e = Validate(item, props[k], root); !e.empty()) return k + ": " + e;
      } else if (s.contains("additionalProperties")) {
        if (std::string e = Validate(item, s["additionalProperties"], root); !e.empty()) {
          return "additional " + k + ": " + e;
        }
      }
    }
  }
  return "";
}

}  // namespace kvasir::grammar::testing
