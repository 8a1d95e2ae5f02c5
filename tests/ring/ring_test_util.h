// Helpers for ring tests: an in-process ring of Stage objects on loopback, and the single-process
// generation it must reproduce.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "model/sampler.h"
#include "net/stream.h"
#include "ring/client.h"
#include "ring/frame.h"
#include "ring/link.h"
#include "ring/secure_stream.h"
#include "ring/stage.h"

namespace kvasir::testing {

// The ring secret of LocalRing (and of clients that talk to it).
inline const std::string kTestRingSecret = "local-ring-test-secret-0123456789";

// Flags for a `kvasir stage` process of a test ring: --ring-secret-file (kTestRingSecret, in a
// private file made once per test process) and --key (a node key file for `name`, created by the
// stage on first use in the same directory).
std::vector<std::string> StageTrustArgs(const std::string& name);

// The arguments of a `kvasir stage` process (KVASIR_BINARY) of a test ring on 127.0.0.1: its
// weights (`source`: {"-m", MODEL} or {"--fetch", URL, ...}), window, listening socket
// (`listen_fd`, inherited: pass it to ChildProcess; -1: --listen 127.0.0.1:0), successor port,
// name, one thread, the log level, and StageTrustArgs(name).
std::vector<std::string> StageProcessArgs(const std::vector<std::string>& source,
                                          const std::string& layers, int listen_fd, uint16_t next,
                                          const std::string& name,
                                          const std::string& log_level = "warn");

// Stages [i*L/N, (i+1)*L/N) on 127.0.0.1, each running in its own thread, each with a fresh node
// key, authenticated by kTestRingSecret. `configure(i, options)` may change stage i's options.
class LocalRing {
 public:
  static std::unique_ptr<LocalRing> Start(
      const std::string& model, int n_stages, wire::Dtype boundary = wire::Dtype::kF32,
      int n_ctx = 256, int chunk = 64, int max_batch_rows = 256,
      const std::function<void(int, ring::StageOptions&)>& configure = nullptr);
  ~LocalRing();
  const std::string& head() const { return head_; }
  ring::Stage& stage(int i) { return *stages_[i]; }

 private:
  std::vector<std::unique_ptr<ring::Stage>> stages_;
  std::vector<std::thread> threads_;
  std::string head_;
};

// Loopback listeners on free ports, bound once and held for the test: a stage process inherits
// its socket (--listen-fd), an in-process stage takes it over (StageOptions::listen_fd), so a port
// is never free for another process to take in between.
class BoundPorts {
 public:
  explicit BoundPorts(int n);
  uint16_t operator[](size_t i) const { return ports_.at(i); }
  size_t size() const { return ports_.size(); }
  // The listening socket of port i, still held here (a child process inherits it).
  int fd(size_t i) const { return fds_.at(i); }
  // Gives socket i up, for an in-process Stage to take over.
  int Take(size_t i);
  ~BoundPorts();

 private:
  std::vector<uint16_t> ports_;
  std::vector<int> fds_;
};

// Loopback ports reserved for the test by sockets bound with SO_REUSEADDR but not listening: a
// stage process binds its port (net::Listener sets SO_REUSEADDR too) and listens while it runs;
// while it is down, connections to the port are refused at once, and no other process's bind to
// port 0 or outgoing connection can take the port before the stage comes back on it.
class ReservedPorts {
 public:
  explicit ReservedPorts(int n);
  uint16_t operator[](size_t i) const { return ports_.at(i); }
  size_t size() const { return ports_.size(); }
  ~ReservedPorts();
  ReservedPorts(const ReservedPorts&) = delete;
  ReservedPorts& operator=(const ReservedPorts&) = delete;

 private:
  std::vector<uint16_t> ports_;
  std::vector<int> fds_;
};

// What a link receives, read on its own thread so a test waits with a deadline instead of hanging.
class Inbox {
 public:
  explicit Inbox(ring::Link* link);
  ~Inbox();  // the owner closes the link first
  // The next message within `ms`, or nothing.
  std::optional<ring::Message> Next(int ms);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ring::Message> messages_;
  bool ended_ = false;
  std::thread reader_;
};

// HELLO of a fake stage of `model` holding layers [first, last).
wire::Hello FakeStageHello(const std::string& model, int first, int last);

// One real stage between neighbours played by the test: the test dials the stage as its
// predecessor (pred()) and takes the stage's dial as its successor (what the stage sends on
// arrives in inbox()). Both fake ends say `me` in HELLO and prove kTestRingSecret with key().
class FakeNeighbours {
 public:
  // Starts a stage with `options` (listen and next are set here; key and ring_secret when
  // unset) and links to it both ways. nullptr, with a failed expectation, when that fails.
  static std::unique_ptr<FakeNeighbours> Start(ring::StageOptions options, const wire::Hello& me);
  // The same, saying `as_pred` to the stage as its predecessor and `as_succ` as its successor
  // (for a stage in the middle, whose neighbours hold different windows).
  static std::unique_ptr<FakeNeighbours> Start(ring::StageOptions options,
                                               const wire::Hello& as_pred,
                                               const wire::Hello& as_succ);
  // Sends STATS until one comes through to the successor side: from then on, what the stage
  // sends on arrives in inbox(). False if none did within `ms`.
  bool WaitForwarding(int ms = 10000);
  ~FakeNeighbours();  // closes both links, then stops the stage

  ring::Stage& stage() { return *stage_; }
  ring::Link& pred() { return *pred_; }
  Inbox& inbox() { return *inbox_; }
  // Closes the successor's side: the stage sees its successor gone (and dials again).
  void CloseSuccessor() { succ_->Close(); }
  const ring::NodeKey& key() const { return *key_; }

 private:
  FakeNeighbours() = default;
  std::shared_ptr<const ring::NodeKey> key_;
  std::unique_ptr<ring::Stage> stage_;
  std::thread runner_;
  std::unique_ptr<ring::Link> pred_, succ_;
  std::unique_ptr<Inbox> inbox_;
};

// A TCP connection to 127.0.0.1:`port` from the loopback address `source` (127.0.0.2, ...: each
// is another address to the stage's per-address limits). The file descriptor, or an error.
Result<int> DialFrom(uint16_t port, const std::string& source, int timeout_ms = 2000);

// Whether the loopback connection from `client_port` to `server_port` has nothing waiting in the
// server's receive queue (/proc/net/tcp): the server has read every byte the client sent, or has
// closed the connection.
bool ServerHasRead(uint16_t server_port, uint16_t client_port);

// A net::Stream over a connected socket it owns; reads wait at most `read_timeout_ms` (then
// fail with kTimeout), 0 for no limit.
class FdStream final : public net::Stream {
 public:
  explicit FdStream(int fd) : fd_(fd) {}
  ~FdStream() override;
  Status WriteAll(std::span<const uint8_t> bytes) override;
  Result<size_t> ReadSome(std::span<uint8_t> buffer) override;
  void Shutdown() override;
  std::string peer() const override { return "test peer"; }
  void SetReadTimeout(int ms);
  int fd() const { return fd_; }

 private:
  int fd_;
};

// A client of a head under the test's control, byte by byte: it dials from a loopback address of
// its choice, authenticates the head by kTestRingSecret, and sends HELLO; then it sends whole
// messages or raw bytes on the encrypted stream's socket (a record that never completes, a
// length that lies), and reads what the head answers with a deadline.
class RawRingClient {
 public:
  static Result<std::unique_ptr<RawRingClient>> Connect(uint16_t port,
                                                        const std::string& source = "127.0.0.1");
  // One message as one encrypted record.
  Status Send(const ring::Message& m);
  // `n` copies of `m`, one record each, in one write (a client that pipelines requests).
  Status SendBatch(const ring::Message& m, int n);
  // Bytes as they are, after the encrypted records sent so far.
  Status SendRaw(std::span<const uint8_t> bytes);
  // The next message within `ms`; an error when the head closed the link or nothing came.
  Result<ring::Message> Receive(int ms);
  void Close() { tcp_->Shutdown(); }
  // This end's port (the stage sees the connection come from it).
  uint16_t local_port() const;

 private:
  RawRingClient() = default;
  std::unique_ptr<FdStream> tcp_;
  std::vector<uint8_t> batch_;  // what SendBatch seals before writing it
  bool batching_ = false;
  std::unique_ptr<ring::SecureStream> secure_;  // over tcp_ (or batch_), not owning it
  ring::FrameDecoder decoder_;
};

// Greedy sampling (temperature 0): the sampling every exactness test compares under.
inline SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

struct Generation {
  std::vector<int32_t> ids;   // generated ids, without a final end-of-generation token
  std::vector<float> logits;  // the raw logit of each id where it was sampled
  std::string text;
};

// Greedy or sampled generation in one process with the whole model, as `kvasir generate` does
// (with `ignore_eog`, as `--ignore-eos`: an end-of-generation token is kept and generation goes
// on). The raw logit of each of `ids` after `prompt` and the ids before it, from one forward pass
// of the whole model over the sequence (rows of a batch give the bits of single rows).
std::vector<float> TeacherForcedLogits(const std::string& model, const std::string& prompt,
                                       const std::vector<int32_t>& ids);

Generation GenerateLocally(const std::string& model, const std::string& prompt,
                           const SamplingParams& params, int n_predict, int n_ctx = 256,
                           bool ignore_eog = false);

// The same request through a ring's head (authenticated with kTestRingSecret).
Generation GenerateOnRing(const std::string& head, const std::string& prompt,
                          const SamplingParams& params, int n_predict);

// A request on a ring whose head reports the prompt tokens it took from its cache: `n` tokens
// (end-of-generation ignored) with the given temperature and seed.
struct CachedAnswer {
  std::string text;
  std::vector<int32_t> ids;
  int n_cached = -1;  // -1: the request failed
};
CachedAnswer AskReportingCache(const std::string& head, const std::string& prompt, int n,
                               uint64_t seed = 0, float temperature = 0);

}  // namespace kvasir::testing
