// An error as the OpenAI API reports it: an HTTP status and the body
// {"error": {"message", "type", "code", "param"}}. Every refusal of `kvasir serve` is one of these,
// so clients written for OpenAI (or llama-server) read it as they read theirs.
#pragma once

#include <string>

namespace kvasir::serve {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";  // "server_error", "rate_limit_error", ...
  std::string code;   // "invalid_type", "model_not_found", ...; "" becomes null
  std::string param;  // the field at fault ("messages[1].content"); "" becomes null
  std::string message;
  int retry_after_s = 0;  // > 0: a Retry-After header (429, 503)
};

// 400 invalid_request_error with `code`, naming `param`.
ApiError BadRequest(std::string code, std::string param, std::string message);

// The JSON body of `e`: {"error": {"message": ..., "type": ..., "code": ..., "param": ...}}.
std::string ErrorBody(const ApiError& e);

}  // namespace kvasir::serve
