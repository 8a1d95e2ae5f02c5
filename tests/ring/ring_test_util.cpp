#include "ring_test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "model/model_id.h"
#include "net/stream.h"
#include "ring/handshake.h"
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
                                          const std::string& layers, int listen_fd,
                                          uint16_t next, const std::string& name,
                                          const std::string& log_level) {
  std::vector<std::string> args = {KVASIR_BINARY, "stage"};
  args.insert(args.end(), source.begin(), source.end());
  for (const std::string& a :
       {std::string("--layers"), layers,
        std::string(listen_fd >= 0 ? "--listen-fd" : "--listen"),
        listen_fd >= 0 ? std::to_string(listen_fd) : std::string("127.0.0.1:0"),
        std::string("--next"),
        fmt::format("127.0.0.1:{}", next), std::string("--name"), name, std::string("-t"),
        std::string("1"), std::string("--log-level"), log_level}) {
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
  std::memcpy(me.model_id, id->data(), 16);
  me.n_layer = static_cast<uint32_t>(cfg->n_layer);
  me.n_embd = static_cast<uint32_t>(cfg->n_embd);
  me.window_first = first;
  me.window_last = last;
  me.flags = (first == 0 ? wire::kHelloHasEmbed : 0) |
             (last == cfg->n_layer ? wire::kHelloHasHead : 0);
  std::snprintf(me.name, sizeof(me.name), "fake %d-%d", first, last);
  return me;
}

std::unique_ptr<FakeNeighbours> FakeNeighbours::Start(ring::StageOptions options,
                                                      const wire::Hello& me) {
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
      return fake->succ_->Send(ring::HelloMsg{me});
    }();
  });
  Status pred_status = [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto raw, net::DialTcp("127.0.0.1", fake->stage_->port(), 5000));
    KV_ASSIGN_OR_RETURN(auto hs, ring::HandshakeInitiate(*raw, wire::Role::kStage, auth));
    fake->pred_ = std::make_unique<ring::Link>(
        std::make_unique<ring::SecureStream>(std::move(raw), hs.tx, hs.rx, 80 << 20),
        "fake predecessor");
    KV_RETURN_IF_ERROR(fake->pred_->Send(ring::HelloMsg{me}));
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

Generation GenerateLocally(const std::string& model, const std::string& prompt,
                           const SamplingParams& params, int n_predict, int n_ctx) {
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
    if ((*tok)->IsEog(id)) break;
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

}  // namespace kvasir::testing
