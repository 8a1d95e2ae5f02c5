#include "serve/metrics.h"

#include <fmt/format.h>

#include <cstring>

namespace kvasir::serve {

std::string PrometheusLabel(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void Metrics::CountRequest(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::CountTokens(int64_t prompt, int64_t generated, int64_t cached) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += static_cast<uint64_t>(std::max<int64_t>(prompt, 0));
  cached_tokens_ += static_cast<uint64_t>(std::max<int64_t>(cached, 0));
  generated_tokens_ += static_cast<uint64_t>(std::max<int64_t>(generated, 0));
}

void Metrics::ObserveFirstToken(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < kFirstTokenBuckets.size(); ++i) {
    if (seconds <= kFirstTokenBuckets[i]) ++ttft_buckets_[i];
  }
  ++ttft_count_;
  ttft_sum_ += seconds;
}

void Metrics::ObserveDecode(int64_t tokens, double seconds) {
  if (tokens <= 0 || seconds <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  decode_tokens_ += static_cast<uint64_t>(tokens);
  decode_seconds_ += seconds;
}

namespace {

void Family(std::string* out, const char* name, const char* type, const char* help) {
  *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

std::string Text(const char* field, size_t size) {
  return std::string(field, strnlen(field, size));
}

}  // namespace

std::string Metrics::Render(const MetricsGauges& g) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string o;
  Family(&o, "kvasir_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  for (const auto& [key, n] : requests_) {
    o += fmt::format("kvasir_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n",
                     PrometheusLabel(key.first), key.second, n);
  }
  Family(&o, "kvasir_prompt_tokens_total", "counter", "Prompt tokens of the requests run.");
  o += fmt::format("kvasir_prompt_tokens_total {}\n", prompt_tokens_);
  Family(&o, "kvasir_generated_tokens_total", "counter", "Tokens generated.");
  o += fmt::format("kvasir_generated_tokens_total {}\n", generated_tokens_);
  Family(&o, "kvasir_prompt_cached_tokens_total", "counter",
         "Prompt tokens served from the ring's prompt cache.");
  o += fmt::format("kvasir_prompt_cached_tokens_total {}\n", cached_tokens_);
  Family(&o, "kvasir_time_to_first_token_seconds", "histogram",
         "From a request's arrival to its first generated token.");
  for (size_t i = 0; i < kFirstTokenBuckets.size(); ++i) {
    o += fmt::format("kvasir_time_to_first_token_seconds_bucket{{le=\"{}\"}} {}\n",
                     kFirstTokenBuckets[i], ttft_buckets_[i]);
  }
  o += fmt::format("kvasir_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}\n", ttft_count_);
  o += fmt::format("kvasir_time_to_first_token_seconds_sum {:.6f}\n", ttft_sum_);
  o += fmt::format("kvasir_time_to_first_token_seconds_count {}\n", ttft_count_);
  Family(&o, "kvasir_decode_seconds_total", "counter",
         "Time from each request's first token to its last.");
  o += fmt::format("kvasir_decode_seconds_total {:.6f}\n", decode_seconds_);
  Family(&o, "kvasir_decode_tokens_total", "counter",
         "Tokens generated after each request's first (the decode steps timed above).");
  o += fmt::format("kvasir_decode_tokens_total {}\n", decode_tokens_);
  Family(&o, "kvasir_decode_tokens_per_second", "gauge",
         "Decode tokens per second of a request, averaged over all requests so far.");
  o += fmt::format("kvasir_decode_tokens_per_second {:.3f}\n",
                   decode_seconds_ > 0 ? decode_tokens_ / decode_seconds_ : 0.0);
  Family(&o, "kvasir_sessions_busy", "gauge", "Requests running on the ring now.");
  o += fmt::format("kvasir_sessions_busy {}\n", g.sessions_busy);
  Family(&o, "kvasir_sessions_deferred", "gauge", "Requests waiting for a place now.");
  o += fmt::format("kvasir_sessions_deferred {}\n", g.sessions_deferred);
  Family(&o, "kvasir_sessions_max", "gauge", "Requests that may run at once (--max-sessions).");
  o += fmt::format("kvasir_sessions_max {}\n", g.max_sessions);
  Family(&o, "kvasir_ring_up", "gauge", "1 when the ring is closed and answering.");
  o += fmt::format("kvasir_ring_up {}\n", g.ring_up ? 1 : 0);
  if (g.stages.empty()) return o;
  auto labels = [](const wire::StageStats& s) {
    const std::string backend = Text(s.backend, sizeof(s.backend));
    return fmt::format("stage=\"{}\",layers=\"{}:{}\",backend=\"{}\"",
                       PrometheusLabel(Text(s.name, sizeof(s.name))), s.window_first, s.window_last,
                       PrometheusLabel(backend.empty() ? "unknown" : backend));
  };
  Family(&o, "kvasir_stage_decode_ms_per_token", "gauge",
         "Milliseconds a stage spends per decode token (batches of decode steps only).");
  for (const auto& s : g.stages) {
    o += fmt::format("kvasir_stage_decode_ms_per_token{{{}}} {:.4f}\n", labels(s),
                     s.decode_rows > 0 ? s.decode_busy_ns / 1e6 / s.decode_rows : 0.0);
  }
  Family(&o, "kvasir_stage_sessions_open", "gauge", "Sessions open on a stage.");
  for (const auto& s : g.stages) {
    o += fmt::format("kvasir_stage_sessions_open{{{}}} {}\n", labels(s), s.sessions_open);
  }
  Family(&o, "kvasir_stage_rows_total", "counter", "Token rows a stage has run.");
  for (const auto& s : g.stages) {
    o += fmt::format("kvasir_stage_rows_total{{{}}} {}\n", labels(s), s.rows);
  }
  return o;
}

}  // namespace kvasir::serve
