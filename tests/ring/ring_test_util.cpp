#include "ring_test_util.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gguf/gguf_file.h"
#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "model/model_id.h"
#include "net/stream.h"
#include "ring/handshake.h"
#include "ring/repair.h"
#include "ring/sampling_wire.h"
#include "ring/secure_stream.h"
#include "test_assets.h"
#include "tokenizer/tokenizer.h"

namespace kvasir::testing {

std::vector<std::string> StageTrustArgs(const std::string& name) {
  static const TempDir dir;  // removed when the test process exits
  static const std::string secret = [] {
    const std::string path = dir.File("ring.secret");
    std::FILE* f = std::fopen(path.c_str(), "w");
    EXPECT_NE(f, nullptr);
    std::fputs(kTestRingSecret.c_str(), f);
    std::fclose(f);
    chmod(path.c_str(), 0600);
    return path;
  }();
  return {"--ring-secret-file", secret, "--key", dir.File(name + ".key")};
}

std::vector<std::string> StageProcessArgs(const std::vector<std::string>& source,
                                          const std::string& layers, int listen_fd, uint16_t next,
                                          const std::string& name, const std::string& log_level) {
  std::vector<std::string> args = {KVASIR_BINARY, "stage"};
  args.insert(args.end(), source.begin(), source.end());
  for (const std::string& a :
       {std::string("--layers"), layers, std::string(listen_fd >= 0 ? "--listen-fd" : "--listen"),
        listen_fd >= 0 ? std::to_string(listen_fd) : std::string("127.0.0.1:0"),
        std::string("--next"), fmt::format("127.0.0.1:{}", next), std::string("--name"), name,
        std::string("-t"), std::string("1"), std::string("--log-level"), log_level}) {
    args.push_back(a);
  }
  for (std::string& a : StageTrustArgs(name)) args.push_back(std::move(a));
  return args;
}

BoundPorts::BoundPorts(int n) {
  for (int i = 0; i < n; ++i) {
    auto l = net::Listener::Bind("127.0.0.1", 0);
    EXPECT_TRUE(l.ok()) << l.status().message();
    if (!l.ok()) continue;
    ports_.push_back(l->port());
    fds_.push_back(l->Release());
  }
}

int BoundPorts::Take(size_t i) {
  const int fd = fds_.at(i);
  fds_.at(i) = -1;
  return fd;
}

BoundPorts::~BoundPorts() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

ReservedPorts::ReservedPorts(int n) {
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    if (fd < 0) return;
    fds_.push_back(fd);
    int one = 1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    const bool ok = ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
                    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    EXPECT_TRUE(ok) << "reserving a loopback port: " << std::strerror(errno);
    if (!ok) return;
    ports_.push_back(ntohs(a.sin_port));
  }
}

ReservedPorts::~ReservedPorts() {
  for (int fd : fds_) ::close(fd);
}

std::unique_ptr<LocalRing> LocalRing::Start(
    const std::string& model, int n_stages, wire::Dtype boundary, int n_ctx, int chunk,
    int max_batch_rows, const std::function<void(int, ring::StageOptions&)>& configure) {
  auto file = GgufFile::Open(model);
  EXPECT_TRUE(file.ok()) << file.status().message();
  auto cfg = LoadModelConfig(*file);
  EXPECT_TRUE(cfg.ok()) << cfg.status().message();
  const int n_layer = cfg->n_layer;
  auto ring = std::unique_ptr<LocalRing>(new LocalRing());
  BoundPorts ports(n_stages);
  for (int i = 0; i < n_stages; ++i) {
    ring::StageOptions o;
    o.model_path = model;
    o.first = i * n_layer / n_stages;
    o.last = (i + 1) * n_layer / n_stages;
    o.listen_fd = ports.Take(i);
    o.next = fmt::format("127.0.0.1:{}", ports[(i + 1) % n_stages]);
    o.name = fmt::format("s{}", i);
    o.boundary = boundary;
    o.n_ctx = n_ctx;
    o.chunk = chunk;
    o.max_batch_rows = max_batch_rows;
    o.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
    o.ring_secret = kTestRingSecret;
    if (configure) configure(i, o);
    auto stage = ring::Stage::Create(o);
    EXPECT_TRUE(stage.ok()) << stage.status().message();
    if (!stage.ok()) return nullptr;
    ring->stages_.push_back(std::move(stage).value());
  }
  for (auto& s : ring->stages_) {
    ring->threads_.emplace_back([st = s.get()] { (void)st->Run(); });
  }
  ring->head_ = fmt::format("127.0.0.1:{}", ports[0]);
  return ring;
}

LocalRing::~LocalRing() {
  for (auto& s : stages_) s->Stop();
  for (auto& t : threads_) t.join();
}

Inbox::Inbox(ring::Link* link)
    : reader_([this, link] {
        for (;;) {
          auto m = link->Receive();
          std::lock_guard lock(mu_);
          if (!m.ok()) {
            ended_ = true;
            cv_.notify_all();
            return;
          }
          messages_.push_back(std::move(m).value());
          cv_.notify_all();
        }
      }) {}

Inbox::~Inbox() { reader_.join(); }

std::optional<ring::Message> Inbox::Next(int ms) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return ended_ || !messages_.empty(); });
  if (messages_.empty()) return std::nullopt;
  ring::Message m = std::move(messages_.front());
  messages_.pop_front();
  return m;
}

wire::Hello FakeStageHello(const std::string& model, int first, int last) {
  wire::Hello me{};
  auto file = GgufFile::Open(model);
  EXPECT_TRUE(file.ok()) << file.status().message();
  if (!file.ok()) return me;
  auto cfg = LoadModelConfig(*file);
  auto id = ComputeModelId(file->header(), model);
  EXPECT_TRUE(cfg.ok() && id.ok());
  if (!cfg.ok() || !id.ok()) return me;
  me.protocol_version = wire::kProtocolVersion;
  me.role = static_cast<uint32_t>(wire::Role::kStage);
  me.generation = ring::NewGeneration();  // started now: newer than the neighbours it replaces
  std::memcpy(me.model_id, id->data(), 16);
  me.n_layer = static_cast<uint32_t>(cfg->n_layer);
  me.n_embd = static_cast<uint32_t>(cfg->n_embd);
  me.window_first = first;
  me.window_last = last;
  me.flags =
      (first == 0 ? wire::kHelloHasEmbed : 0) | (last == cfg->n_layer ? wire::kHelloHasHead : 0);
  std::snprintf(me.name, sizeof(me.name), "fake %d-%d", first, last);
  return me;
}

std::unique_ptr<FakeNeighbours> FakeNeighbours::Start(ring::StageOptions options,
                                                      const wire::Hello& me) {
  return Start(std::move(options), me, me);
}

bool FakeNeighbours::WaitForwarding(int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (!pred_->Send(ring::StatsMsg{}).ok()) return false;
    for (auto m = inbox_->Next(100); m; m = inbox_->Next(0)) {
      if (std::holds_alternative<ring::StatsMsg>(*m)) return true;
    }
  }
  return false;
}

std::unique_ptr<FakeNeighbours> FakeNeighbours::Start(ring::StageOptions options,
                                                      const wire::Hello& as_pred,
                                                      const wire::Hello& as_succ) {
  auto fake = std::unique_ptr<FakeNeighbours>(new FakeNeighbours());
  fake->key_ = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
  auto listener = net::Listener::Bind("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok()) << listener.status().message();
  if (!listener.ok()) return nullptr;
  options.listen = "127.0.0.1:0";
  options.next = fmt::format("127.0.0.1:{}", listener->port());
  if (options.key == nullptr) {
    options.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
  }
  if (options.ring_secret.empty()) options.ring_secret = kTestRingSecret;
  auto stage = ring::Stage::Create(options);
  EXPECT_TRUE(stage.ok()) << stage.status().message();
  if (!stage.ok()) return nullptr;
  fake->stage_ = std::move(stage).value();
  fake->runner_ = std::thread([st = fake->stage_.get()] { (void)st->Run(); });
  ring::LinkAuth auth;
  auth.key = fake->key_;
  auth.ring_secret = kTestRingSecret;

  // The stage dials us as its successor, while we dial it as its predecessor.
  Status succ_status;
  std::thread acceptor([&] {
    succ_status = [&]() -> Status {
      KV_ASSIGN_OR_RETURN(auto s, listener->Accept());
      KV_ASSIGN_OR_RETURN(auto hs, ring::HandshakeRespond(*s, auth, auth));
      fake->succ_ = std::make_unique<ring::Link>(
          std::make_unique<ring::SecureStream>(std::move(s), hs.tx, hs.rx, 80 << 20),
          "fake successor");
      KV_ASSIGN_OR_RETURN(auto hello, fake->succ_->Receive());
      if (!std::holds_alternative<ring::HelloMsg>(hello)) return Error("expected HELLO");
      return fake->succ_->Send(ring::HelloMsg{as_succ});
    }();
  });
  Status pred_status = [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto raw, net::DialTcp("127.0.0.1", fake->stage_->port(), 5000));
    KV_ASSIGN_OR_RETURN(auto hs, ring::HandshakeInitiate(*raw, wire::Role::kStage, auth));
    fake->pred_ = std::make_unique<ring::Link>(
        std::make_unique<ring::SecureStream>(std::move(raw), hs.tx, hs.rx, 80 << 20),
        "fake predecessor");
    KV_RETURN_IF_ERROR(fake->pred_->Send(ring::HelloMsg{as_pred}));
    KV_ASSIGN_OR_RETURN(auto hello, fake->pred_->Receive());
    if (!std::holds_alternative<ring::HelloMsg>(hello)) return Error("expected HELLO back");
    return Status::Ok();
  }();
  if (!pred_status.ok()) listener->Close();  // wakes an Accept() that never gets its connection
  acceptor.join();
  EXPECT_TRUE(pred_status.ok()) << pred_status.message();
  EXPECT_TRUE(succ_status.ok()) << succ_status.message();
  if (!pred_status.ok() || !succ_status.ok()) return nullptr;
  fake->inbox_ = std::make_unique<Inbox>(fake->succ_.get());
  return fake;
}

FakeNeighbours::~FakeNeighbours() {
  if (pred_) pred_->Close();
  if (succ_) succ_->Close();
  inbox_.reset();
  if (stage_) stage_->Stop();
  if (runner_.joinable()) runner_.join();
}

std::vector<float> TeacherForcedLogits(const std::string& model, const std::string& prompt,
                                       const std::vector<int32_t>& ids) {
  auto file = GgufFile::Open(model);
  EXPECT_TRUE(file.ok());
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  auto cfg = LoadModelConfig(*shared);
  WindowOptions opt;
  opt.n_ctx = 256;
  auto w = LayerWindow::Load(shared, {0, cfg->n_layer, true, true}, opt);
  EXPECT_TRUE(w.ok()) << w.status().message();
  auto tok = Tokenizer::FromGguf(shared->header(), model);
  std::vector<int32_t> seq = (*tok)->Encode(prompt, true, true);
  const size_t n_prompt = seq.size();
  seq.insert(seq.end(), ids.begin(), ids.end());
  EXPECT_TRUE((*w)->OpenSequence(0).ok());
  ForwardInput in;
  in.chunks = {{0, 0, static_cast<int>(seq.size())}};
  in.tokens = seq;
  in.all_logits = true;
  ForwardOutput out;
  EXPECT_TRUE((*w)->Forward(in, &out).ok());
  const size_t n_vocab = static_cast<size_t>(cfg->n_vocab);
  std::vector<float> logits;
  for (size_t i = 0; i < ids.size(); ++i) {
    logits.push_back(out.logits[(n_prompt - 1 + i) * n_vocab + static_cast<size_t>(ids[i])]);
  }
  return logits;
}

Generation GenerateLocally(const std::string& model, const std::string& prompt,
                           const SamplingParams& params, int n_predict, int n_ctx,
                           bool ignore_eog) {
  Generation g;
  auto file = GgufFile::Open(model);
  EXPECT_TRUE(file.ok());
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  auto cfg = LoadModelConfig(*shared);
  WindowOptions opt;
  opt.n_ctx = n_ctx;
  auto w = LayerWindow::Load(shared, {0, cfg->n_layer, true, true}, opt);
  EXPECT_TRUE(w.ok()) << w.status().message();
  auto tok = Tokenizer::FromGguf(shared->header(), model);
  EXPECT_TRUE(tok.ok());
  std::vector<int32_t> history = (*tok)->Encode(prompt, true, true);
  EXPECT_TRUE((*w)->OpenSequence(0).ok());
  ForwardInput in;
  in.chunks = {{0, 0, static_cast<int>(history.size())}};
  in.tokens = history;
  ForwardOutput out;
  Sampler sampler(params);
  for (int i = 0; i < n_predict; ++i) {
    EXPECT_TRUE((*w)->Forward(in, &out).ok());
    const int32_t id = sampler.Sample(out.logits, history);
    if (!ignore_eog && (*tok)->IsEog(id)) break;
    history.push_back(id);
    g.ids.push_back(id);
    g.logits.push_back(out.logits[static_cast<size_t>(id)]);
    g.text += (*tok)->TokenToPiece(id);
    if ((*w)->SequenceLength(0) >= (*w)->n_ctx()) break;
    in.chunks = {{0, (*w)->SequenceLength(0), 1}};
    in.tokens = std::span<const int32_t>(&history.back(), 1);
  }
  return g;
}

Generation GenerateOnRing(const std::string& head, const std::string& prompt,
                          const SamplingParams& params, int n_predict) {
  Generation g;
  auto client = ring::RingClient::Connect(head, 20000, kTestRingSecret);
  EXPECT_TRUE(client.ok()) << client.status().message();
  if (!client.ok()) return g;
  ring::GenerateMsg req;
  req.prompt = prompt;
  req.sampling = ring::SamplingToWire(params, static_cast<uint32_t>(n_predict), false);
  auto r = (*client)->Generate(req, [&](const ring::TokenMsg& t) {
    if (t.token.finished && t.token.reason == static_cast<uint8_t>(wire::FinishReason::kEog)) {
      return;
    }
    g.ids.push_back(t.token.id);
    g.logits.push_back(t.token.logit);
    g.text += t.piece;
  });
  EXPECT_TRUE(r.ok()) << r.status().message();
  return g;
}

CachedAnswer AskReportingCache(const std::string& head, const std::string& prompt, int n,
                               uint64_t seed, float temperature) {
  CachedAnswer a;
  auto client = ring::RingClient::Connect(head, 20000, kTestRingSecret);
  EXPECT_TRUE(client.ok()) << client.status().message();
  if (!client.ok()) return a;
  EXPECT_TRUE((*client)->WaitReady(20000).ok());
  ring::GenerateMsg g;
  g.prompt = prompt;
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  g.sampling = ring::SamplingToWire(p, static_cast<uint32_t>(n), /*ignore_eog=*/true);
  g.report_cached = true;
  auto r = (*client)->Generate(
      g,
      [&](const ring::TokenMsg& t) {
        a.text += t.piece;
        a.ids.push_back(t.token.id);
        return true;
      },
      nullptr);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (r.ok()) a.n_cached = r->n_cached;
  return a;
}

Result<int> DialFrom(uint16_t port, const std::string& source, int timeout_ms) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error("socket: {}", std::strerror(errno));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source.c_str(), &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    const int err = errno;
    ::close(fd);
    return Error(StatusCode::kUnavailable, "connect from {} to port {}: {}", source, port,
                 std::strerror(err));
  }
  timeval none{0, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
  return fd;
}

FdStream::~FdStream() { ::close(fd_); }

Status FdStream::WriteAll(std::span<const uint8_t> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(StatusCode::kUnavailable, "send: {}", std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<size_t> FdStream::ReadSome(std::span<uint8_t> buffer) {
  while (true) {
    const ssize_t n = ::recv(fd_, buffer.data(), buffer.size(), 0);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Error(StatusCode::kTimeout, "no answer");
    return Error(StatusCode::kUnavailable, "recv: {}", std::strerror(errno));
  }
}

void FdStream::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

void FdStream::SetReadTimeout(int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

namespace {

// A net::Stream that forwards to one it does not own; while *batching, writes go to *batch.
class Borrowed final : public net::Stream {
 public:
  Borrowed(net::Stream* s, bool* batching, std::vector<uint8_t>* batch)
      : s_(s), batching_(batching), batch_(batch) {}
  Status WriteAll(std::span<const uint8_t> b) override {
    if (*batching_) {
      batch_->insert(batch_->end(), b.begin(), b.end());
      return Status::Ok();
    }
    return s_->WriteAll(b);
  }
  Result<size_t> ReadSome(std::span<uint8_t> b) override { return s_->ReadSome(b); }
  void Shutdown() override { s_->Shutdown(); }
  std::string peer() const override { return s_->peer(); }

 private:
  net::Stream* s_;
  bool* batching_;
  std::vector<uint8_t>* batch_;
};

}  // namespace

Result<std::unique_ptr<RawRingClient>> RawRingClient::Connect(uint16_t port,
                                                              const std::string& source) {
  KV_ASSIGN_OR_RETURN(int fd, DialFrom(port, source));
  auto c = std::unique_ptr<RawRingClient>(new RawRingClient());
  c->tcp_ = std::make_unique<FdStream>(fd);
  c->tcp_->SetReadTimeout(10000);
  // A write the head never takes fails after a while instead of hanging the test.
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  ring::LinkAuth auth;
  auth.ring_secret = kTestRingSecret;
  KV_ASSIGN_OR_RETURN(auto hs, ring::HandshakeInitiate(*c->tcp_, wire::Role::kClient, auth));
  auto borrowed = std::make_unique<Borrowed>(c->tcp_.get(), &c->batching_, &c->batch_);
  c->secure_ = std::make_unique<ring::SecureStream>(std::move(borrowed), hs.tx, hs.rx, 80 << 20);
  wire::Hello h{};
  h.protocol_version = wire::kProtocolVersion;
  h.role = static_cast<uint32_t>(wire::Role::kClient);
  KV_RETURN_IF_ERROR(c->Send(ring::HelloMsg{h}));
  KV_ASSIGN_OR_RETURN(ring::Message reply, c->Receive(10000));
  if (!std::holds_alternative<ring::HelloMsg>(reply)) {
    return Error("the head answered HELLO with {}", ring::MessageName(reply));
  }
  return c;
}

Status RawRingClient::Send(const ring::Message& m) {
  return secure_->WriteAll(ring::EncodeMessage(m));
}

Status RawRingClient::SendBatch(const ring::Message& m, int n) {
  const std::vector<uint8_t> frame = ring::EncodeMessage(m);
  batch_.clear();
  batching_ = true;
  Status s;
  for (int i = 0; i < n && s.ok(); ++i) s = secure_->WriteAll(frame);
  batching_ = false;
  KV_RETURN_IF_ERROR(s);
  return tcp_->WriteAll(batch_);
}

Status RawRingClient::SendRaw(std::span<const uint8_t> bytes) { return tcp_->WriteAll(bytes); }

Result<ring::Message> RawRingClient::Receive(int ms) {
  tcp_->SetReadTimeout(ms);
  uint8_t buf[16 * 1024];
  while (true) {
    KV_ASSIGN_OR_RETURN(auto next, decoder_.Next());
    if (next.has_value()) {
      KV_ASSIGN_OR_RETURN(ring::Message m, ring::DecodeMessage(*next));
      if (std::holds_alternative<ring::KeepaliveMsg>(m)) continue;
      return m;
    }
    KV_ASSIGN_OR_RETURN(size_t n, secure_->ReadSome(buf));
    if (n == 0) return Error(StatusCode::kEndOfStream, "the head closed the link");
    decoder_.Feed(std::span<const uint8_t>(buf, n));
  }
}

uint16_t RawRingClient::local_port() const {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  getsockname(tcp_->fd(), reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

bool ServerHasRead(uint16_t server_port, uint16_t client_port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    // "  12: 0100007F:1F90 0100007F:D431 01 00000000:00000000 ..."
    unsigned local_port = 0, remote_port = 0, tx = 0, rx = 0;
    char local_ip[16], remote_ip[16];
    if (std::sscanf(line.c_str(), " %*d: %8[0-9A-F]:%X %8[0-9A-F]:%X %*X %X:%X", local_ip,
                    &local_port, remote_ip, &remote_port, &tx, &rx) != 6) {
      continue;
    }
    if (local_port == server_port && remote_port == client_port) return rx == 0;
  }
  return true;  // the server closed it: nothing waits there either
}

}  // namespace kvasir::testing
