// A ring stage: one process, one layer window, two links. It accepts its predecessor (and, on the
// head stage, clients) on its listen address and dials its successor, retrying with backoff so
// stages can start in any order. See docs/PROTOCOL.md for the session flow.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "ring/wire.h"

namespace kvasir::ring {

struct StageOptions {
  std::string model_path;
  int first = 0;             // layers [first, last)
  int last = 0;
  std::string listen;        // HOST:PORT to accept the predecessor (and clients, on the head)
  std::string next;          // HOST:PORT of the successor
  std::string name;          // for logs and stats; defaults to "stage-<first>-<last>"
  int n_threads = 1;
  int n_ctx = 0;             // KV capacity per session; 0 = the model's, capped at 4096
  wire::Dtype boundary = wire::Dtype::kF32;  // dtype of hidden states sent to the successor
  int chunk = 64;            // prompt tokens per prefill batch on the head
  int max_sessions = 64;
  int max_batch_rows = 256;  // rows per Forward when batching sessions
};

class Stage {
 public:
  // Loads the window (the head also the embeddings and tokenizer, the last stage the output head)
  // and binds the listen address. Refuses a window that is not inside the model.
  static Result<std::unique_ptr<Stage>> Create(const StageOptions& options);
  virtual ~Stage() = default;

  // The bound listen port (useful with port 0).
  virtual uint16_t port() const = 0;
  // Serves until Stop(). Returns an error only if the stage cannot continue.
  virtual Status Run() = 0;
  // Asks Run() to return; closes links and joins threads. Thread-safe.
  virtual void Stop() = 0;
  // Logs this stage's statistics (one line). Thread-safe.
  virtual void LogStats() = 0;
};

}  // namespace kvasir::ring
