// What clients and neighbours can make a real stage hold, in one process: client records are
// limited to what a client message needs, the clients that have held bytes the longest are dropped
// when the client budget is full, the handshake slots go to fresh addresses under a flood, every
// stage checks a session's sampling values and sizes before it opens or widens anything, and
// connections that end are freed at once.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "gguf/gguf_file.h"
#include "ring/link_limits.h"
#include "ring/messages.h"
#include "ring/sampling_wire.h"
#include "ring_test_util.h"
#include "test_assets.h"
#include "tokenizer/tokenizer.h"

namespace kvasir {
namespace {

using Clock = std::chrono::steady_clock;
using testing::Greedy;
using testing::LocalRing;
using testing::RawRingClient;

constexpr const char* kStories = "models/stories260K.gguf";

std::string Model() { return testing::AssetPath(kStories); }

uint16_t PortOf(const std::string& host_port) {
  return static_cast<uint16_t>(std::stoi(host_port.substr(host_port.rfind(':') + 1)));
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int ThreadsOfThisProcess() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "Threads:") {
      int n = 0;
      in >> n;
      return n;
    }
  }
  return 0;
}

// Waits up to `ms` for `pred`, checking every few milliseconds.
template <typename Pred>
bool WaitFor(Pred pred, int ms) {
  const auto end = Clock::now() + std::chrono::milliseconds(ms);
  while (!pred()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// The u32 length of an encrypted record that announces `plain` bytes of plaintext.
std::vector<uint8_t> RecordLength(uint32_t plain) {
  const uint32_t len = plain + crypto_secretstream_xchacha20poly1305_ABYTES;
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &len, 4);
  return b;
}

// The largest record a head of `n_ctx` takes from a client.
uint32_t ClientRecordLimit(int n_ctx) {
  auto file = GgufFile::Open(Model());
  EXPECT_TRUE(file.ok());
  auto tok = Tokenizer::FromGguf(file->header(), Model());
  EXPECT_TRUE(tok.ok());
  return sizeof(wire::FrameHeader) + ring::MaxClientPayload(ring::MaxPromptBytes(**tok, n_ctx));
}

void ExpectErrorContaining(Result<ring::Message> m, wire::ErrorCode code,
                           const std::string& needle) {
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto* e = std::get_if<ring::ErrorMsg>(&*m);
  ASSERT_NE(e, nullptr) << ring::MessageName(*m);
  EXPECT_EQ(e->code, code) << e->message;
  EXPECT_NE(e->message.find(needle), std::string::npos) << e->message;
}

TEST(StageLimitsTest, AClientRecordOverTheLimitIsRefusedAtItsLength) {
  KV_REQUIRE_ASSET(kStories);
  auto ring = LocalRing::Start(Model(), 3);
  ASSERT_NE(ring, nullptr);
  auto c = RawRingClient::Connect(PortOf(ring->head()));
  ASSERT_TRUE(c.ok()) << c.status().message();
  // 64 MiB announced: refused on the length alone, before anything more arrives.
  ASSERT_TRUE((*c)->SendRaw(RecordLength(64u << 20)).ok());
  ExpectErrorContaining((*c)->Receive(10000), wire::ErrorCode::kTooLarge,
                        fmt::format("exceeds the {}-byte limit", ClientRecordLimit(256)));
  EXPECT_FALSE((*c)->Receive(10000).ok()) << "then the head closes the link";
  // A GENERATE over the limit, whole, gets the same answer.
  auto big = RawRingClient::Connect(PortOf(ring->head()));
  ASSERT_TRUE(big.ok());
  ring::GenerateMsg g;
  g.sampling = ring::SamplingToWire(Greedy(), 4, false);
  g.prompt = std::string(ClientRecordLimit(256), 'a');
  ASSERT_TRUE((*big)->Send(g).ok());
  ExpectErrorContaining((*big)->Receive(10000), wire::ErrorCode::kTooLarge, "limit");
  // Stop strings are bounded too (they live as long as the session).
  auto stops = RawRingClient::Connect(PortOf(ring->head()));
  ASSERT_TRUE(stops.ok());
  g.prompt = "Once upon a time";
  g.stops.assign(3, std::string(2000, 's'));
  ASSERT_TRUE((*stops)->Send(g).ok());
  ExpectErrorContaining((*stops)->Receive(10000), wire::ErrorCode::kBadRequest, "stop strings");
  EXPECT_EQ(testing::GenerateOnRing(ring->head(), "Once upon a time", Greedy(), 8).ids,
            testing::GenerateLocally(Model(), "Once upon a time", Greedy(), 8).ids);
}

// Clients that each hold part of a record: once the head's client budget is full, each newcomer
// takes the place of one that has held its bytes longer, and an honest client is still served.
TEST(StageLimitsTest, WhenClientBuffersAreFullTheLongestHoldersAreDropped) {
  KV_REQUIRE_ASSET(kStories);
  // Each holder announces a record at the limit and sends all of it but 100 bytes: the head holds
  // a buffer of more than half of it, and its budget holds three such records.
  const uint32_t limit = ClientRecordLimit(256);
  ASSERT_GT(limit, 4096u);
  const size_t kBudget = 3 * size_t{limit};
  auto ring = LocalRing::Start(Model(), 2, wire::Dtype::kF32, 256, 64, 256,
                               [=](int i, ring::StageOptions& o) {
                                 if (i == 0) o.client_buffer_bytes = kBudget;
                               });
  ASSERT_NE(ring, nullptr);
  const uint16_t port = PortOf(ring->head());
  const std::vector<uint8_t> part(limit - 100, 0x5a);
  auto hold = [&](std::unique_ptr<RawRingClient>& c) {
    std::vector<uint8_t> bytes = RecordLength(limit - 16);
    bytes.insert(bytes.end(), part.begin(), part.end());
    ASSERT_TRUE(c->SendRaw(bytes).ok());
  };
  std::vector<std::unique_ptr<RawRingClient>> first, second;
  const size_t per = kBudget / part.size() + 1;  // more than the budget holds
  // One holder at a time, each read (and charged) before the next one sends: the holders that
  // came first are the ones that have held their bytes longest.
  auto add = [&](std::vector<std::unique_ptr<RawRingClient>>& group) {
    auto c = RawRingClient::Connect(port);
    ASSERT_TRUE(c.ok()) << c.status().message();
    group.push_back(std::move(c).value());
    hold(group.back());
    RawRingClient& last = *group.back();
    ASSERT_TRUE(WaitFor([&] { return testing::ServerHasRead(port, last.local_port()); }, 10000));
  };
  for (size_t i = 0; i < per; ++i) add(first);
  for (size_t i = 0; i < per; ++i) add(second);
  int dropped_first = 0;
  for (auto& c : first) {
    auto m = c->Receive(5000);
    if (m.ok() && std::holds_alternative<ring::ErrorMsg>(*m)) {
      EXPECT_NE(std::get<ring::ErrorMsg>(*m).message.find("longest"), std::string::npos)
          << std::get<ring::ErrorMsg>(*m).message;
      ++dropped_first;
    }
  }
  EXPECT_EQ(dropped_first, static_cast<int>(per))
      << "the clients that held bytes longest give way first";
  // An honest client still gets its answer.
  EXPECT_EQ(testing::GenerateOnRing(ring->head(), "Once upon a time", Greedy(), 8).ids,
            testing::GenerateLocally(Model(), "Once upon a time", Greedy(), 8).ids);
}

// Silent connections from 8 addresses, renewed as they are closed, against 16 handshake slots
// (4 per address): honest clients from another address still get through in well under a second.
TEST(StageLimitsTest, HandshakeSlotsGoToFreshAddressesUnderAFlood) {
  KV_REQUIRE_ASSET(kStories);
  auto ring = LocalRing::Start(Model(), 2, wire::Dtype::kF32, 256, 64, 256,
                               [](int i, ring::StageOptions& o) {
                                 if (i != 0) return;
                                 o.max_pending = 16;
                                 o.max_pending_per_address = 4;
                                 o.pending_reserved = 2;
                               });
  ASSERT_NE(ring, nullptr);
  const uint16_t port = PortOf(ring->head());
  ASSERT_TRUE(testing::GenerateOnRing(ring->head(), "Once", Greedy(), 2).ids.size() == 2);
  std::atomic<bool> flooding{true};
  std::atomic<int> opened{0};
  std::vector<std::thread> flood;
  for (int a = 0; a < 8; ++a) {
    flood.emplace_back([&, a] {
      const std::string source = fmt::format("127.0.0.{}", 10 + a);
      std::vector<int> fds;
      while (flooding.load()) {
        // Keep 6 open (more than the address may hold); replace the ones the head closed.
        std::erase_if(fds, [](int fd) {
          char b;
          const ssize_t n = ::recv(fd, &b, 1, MSG_DONTWAIT);
          if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) || n > 0) {
            ::close(fd);
            return true;
          }
          return false;
        });
        while (fds.size() < 6 && flooding.load()) {
          auto fd = testing::DialFrom(port, source, 500);
          if (!fd.ok()) break;
          fds.push_back(*fd);
          opened.fetch_add(1);
        }
        // Until the head closes one of them (or the refusal of the extra ones arrives).
        std::vector<pollfd> p;
        for (int fd : fds) p.push_back({fd, POLLIN, 0});
        ::poll(p.data(), p.size(), 200);
      }
      for (int fd : fds) ::close(fd);
    });
  }
  ASSERT_TRUE(WaitFor([&] { return opened.load() >= 48; }, 10000));
  // Honest clients one after another for longer than the shortened deadline, so the flood's
  // connections are cut and renewed meanwhile.
  double worst = 0;
  int served = 0;
  const auto start = Clock::now();
  while (SecondsSince(start) < 2.5 || served < 5) {
    const auto t0 = Clock::now();
    auto c = RawRingClient::Connect(port, "127.0.0.1");
    worst = std::max(worst, SecondsSince(t0));
    ASSERT_TRUE(c.ok()) << c.status().message();
    ++served;
  }
  const int renewed = opened.load();
  flooding = false;
  for (auto& t : flood) t.join();
  EXPECT_LT(worst, 1.0) << "an honest client waited " << worst << " s for its handshake";
  EXPECT_GT(renewed, 64) << "the flood's connections were closed and renewed";
}

// A neighbour that holds the secret but sends sampling values no stage could use: the middle
// stage and the last stage each refuse the session, naming the field, before opening anything.
TEST(StageLimitsTest, EveryStageChecksTheSamplingValuesItIsSent) {
  KV_REQUIRE_ASSET(kStories);
  for (const auto& [first, last] : {std::pair{2, 4}, std::pair{4, 5}}) {
    ring::StageOptions o;
    o.model_path = Model();
    o.first = first;
    o.last = last;
    o.n_ctx = 64;
    auto fake = testing::FakeNeighbours::Start(o, testing::FakeStageHello(Model(), 0, first),
                                               testing::FakeStageHello(Model(), last % 5, 5));
    ASSERT_NE(fake, nullptr);
    ASSERT_TRUE(fake->WaitForwarding());
    uint32_t session = 100;
    auto expect_refused = [&](wire::SamplingWire w, std::vector<int32_t> prompt,
                              const std::string& field) {
      ring::OpenSessionMsg m{++session, w, std::move(prompt), {}};
      ASSERT_TRUE(fake->pred().Send(m).ok());
      std::optional<ring::Message> got;
      for (auto n = fake->inbox().Next(10000); n; n = fake->inbox().Next(10000)) {
        if (std::holds_alternative<ring::ErrorMsg>(*n)) {
          got = std::move(n);
          break;
        }
      }
      ASSERT_TRUE(got.has_value()) << "no error for " << field << " at layers " << first;
      const auto& e = std::get<ring::ErrorMsg>(*got);
      EXPECT_EQ(e.session, session);
      EXPECT_EQ(e.code, wire::ErrorCode::kBadRequest);
      EXPECT_NE(e.message.find("OPEN_SESSION: "), std::string::npos) << e.message;
      EXPECT_NE(e.message.find(field), std::string::npos) << e.message;
    };
    const wire::SamplingWire ok = ring::SamplingToWire(Greedy(), 4, false);
    auto with = [&](auto set) {
      wire::SamplingWire w = ok;
      set(w);
      return w;
    };
    expect_refused(with([](auto& w) { w.temperature = std::numeric_limits<float>::quiet_NaN(); }),
                   {1, 2}, "temperature");
    expect_refused(with([](auto& w) { w.repeat_penalty = -2; }), {1, 2}, "repeat_penalty");
    expect_refused(with([](auto& w) { w.top_k = std::numeric_limits<int32_t>::min(); }), {1, 2},
                   "top_k");
    expect_refused(with([](auto& w) { w.repeat_last_n = -1; }), {1, 2}, "repeat_last_n");
    expect_refused(ok, {1, 1 << 30}, "outside the vocabulary");
    expect_refused(ok, std::vector<int32_t>(64, 1), "context");
    // The stage is still up for good sessions.
    ASSERT_TRUE(fake->pred().Send(ring::OpenSessionMsg{999, ok, {1, 2}, {}}).ok());
    bool opened = false;
    while (auto n = fake->inbox().Next(10000)) {
      if (auto* m = std::get_if<ring::OpenSessionMsg>(&*n)) opened = m->session == 999;
      if (opened || std::holds_alternative<ring::ErrorMsg>(*n)) break;
    }
    EXPECT_TRUE(opened) << "a good OPEN_SESSION is opened and forwarded";
  }
}

// HIDDEN rows past the context are refused before they are widened to f32, and a HIDDEN larger
// than anything the stage could use is refused at its record's length.
TEST(StageLimitsTest, HiddenSizesAreCheckedBeforeAnythingIsAllocated) {
  KV_REQUIRE_ASSET(kStories);
  ring::StageOptions o;
  o.model_path = Model();
  o.first = 2;
  o.last = 4;
  o.n_ctx = 64;
  auto fake = testing::FakeNeighbours::Start(o, testing::FakeStageHello(Model(), 0, 2),
                                             testing::FakeStageHello(Model(), 4, 5));
  ASSERT_NE(fake, nullptr);
  ASSERT_TRUE(fake->WaitForwarding());
  const wire::SamplingWire ok = ring::SamplingToWire(Greedy(), 4, false);
  ASSERT_TRUE(fake->pred().Send(ring::OpenSessionMsg{7, ok, {1, 2, 3}, {}}).ok());
  std::vector<float> rows(65 * 64, 0.5f);
  ASSERT_TRUE(
      fake->pred().Send(ring::MakeHidden(7, 0, 65, 64, wire::Dtype::kBF16, 0, rows)).ok());
  std::optional<ring::ErrorMsg> err;
  while (auto n = fake->inbox().Next(10000)) {
    if (auto* e = std::get_if<ring::ErrorMsg>(&*n)) {
      err = *e;
      break;
    }
  }
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->session, 7u);
  EXPECT_EQ(err->code, wire::ErrorCode::kTooLarge);
  EXPECT_NE(err->message.find("pass the context of 64"), std::string::npos) << err->message;
  // bf16 rows of 64 past what a neighbour of this stage may send (an OPEN_SESSION of the most
  // prompt tokens, extra sampling and grammar: about 1.3 MiB).
  const uint32_t n_rows = ring::MaxStagePayload(64, 64) / (64 * 2) + 1;
  std::vector<float> many(size_t{n_rows} * 64, 0.5f);
  ASSERT_TRUE(
      fake->pred().Send(ring::MakeHidden(7, 0, n_rows, 64, wire::Dtype::kBF16, 0, many)).ok());
  auto reply = fake->pred().Receive();
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  ASSERT_TRUE(std::holds_alternative<ring::ErrorMsg>(*reply)) << ring::MessageName(*reply);
  EXPECT_EQ(std::get<ring::ErrorMsg>(*reply).code, wire::ErrorCode::kTooLarge);
  EXPECT_NE(std::get<ring::ErrorMsg>(*reply).message.find("limit"), std::string::npos)
      << std::get<ring::ErrorMsg>(*reply).message;
}

// Connections that end (clients, refused strangers) give their threads and memory back at once,
// not when the next connection arrives.
TEST(StageLimitsTest, EndedConnectionsAreFreedWithoutANewOne) {
  KV_REQUIRE_ASSET(kStories);
  auto ring = LocalRing::Start(Model(), 2);
  ASSERT_NE(ring, nullptr);
  ASSERT_EQ(testing::GenerateOnRing(ring->head(), "Once", Greedy(), 2).ids.size(), 2u);
  const int before = ThreadsOfThisProcess();
  {
    std::vector<std::unique_ptr<RawRingClient>> clients;
    for (int i = 0; i < 24; ++i) {
      auto c = RawRingClient::Connect(PortOf(ring->head()));
      ASSERT_TRUE(c.ok()) << c.status().message();
      clients.push_back(std::move(c).value());
    }
    EXPECT_GE(ThreadsOfThisProcess(), before + 24);
    for (auto& c : clients) c->Close();
  }
  // Strangers refused in their handshake, too.
  for (int i = 0; i < 8; ++i) {
    auto fd = testing::DialFrom(PortOf(ring->head()), "127.0.0.1");
    ASSERT_TRUE(fd.ok());
    const char junk[64] = {1};
    (void)::send(*fd, junk, sizeof(junk), MSG_NOSIGNAL);
    ::close(*fd);
  }
  EXPECT_TRUE(WaitFor([&] { return ThreadsOfThisProcess() <= before; }, 10000))
      << ThreadsOfThisProcess() << " threads, " << before << " before";
}

}  // namespace
}  // namespace kvasir
