#include "base/status.h"

namespace kvasir {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidInput: return "invalid input";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kEndOfStream: return "end of stream";
    case StatusCode::kTooLarge: return "too large";
    case StatusCode::kUnauthenticated: return "unauthenticated";
    case StatusCode::kTimeout: return "timeout";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kConflict: return "conflict";
    case StatusCode::kForbidden: return "forbidden";
  }
  return "unknown";
}

}  // namespace kvasir
