// Rings of real `kvasir stage` processes: a stage that dies mid-session ends that session with a
// clear error, the ring serves again once the stage is back, and each stage's memory covers its
// window rather than the model.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include "model/arch/registry.h"
#include "ring/sampling_wire.h"
#include "kvasir_process.h"
#include "ring_test_util.h"
#include "test_assets.h"
#include "tiny_model.h"

namespace kvasir {
namespace {

using testing::AssetPath;

using testing::ChildProcess;

// A stage process that is asked to stop (SIGTERM) when the test ends. Sessions crossing a link
// that goes down end at once (--repair-timeout 0; heal_process_test holds and replays them).
std::unique_ptr<ChildProcess> StartStage(const std::string& model, const std::string& layers,
                                         int listen_fd, uint16_t next, const std::string& name) {
  std::vector<std::string> args =
      testing::StageProcessArgs({"-m", model}, layers, listen_fd, next, name);
  args.push_back("--repair-timeout");
  args.push_back("0");
  return std::make_unique<ChildProcess>(args, "", SIGTERM, std::vector<int>{listen_fd});
}

using testing::Greedy;

TEST(RingProcessTest, VanishedStageEndsTheSessionAndTheRingRecovers) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string model = AssetPath("models/stories260K.gguf");
  const testing::BoundPorts ports(3);  // held: a restarted stage inherits its socket again
  std::vector<std::unique_ptr<ChildProcess>> stages;
  const char* layers[] = {"0:1", "1:3", "3:5"};
  for (int i = 0; i < 3; ++i) {
    stages.push_back(
        StartStage(model, layers[i], ports.fd(i), ports[(i + 1) % 3], fmt::format("p{}", i)));
  }
  const std::string head = fmt::format("127.0.0.1:{}", ports[0]);
  auto client = ring::RingClient::Connect(head, 20000, testing::kTestRingSecret);
  ASSERT_TRUE(client.ok()) << client.status().message();
  ASSERT_TRUE((*client)->WaitReady(20000).ok());

  // Kill the middle stage after the fifth token of a long generation.
  ring::GenerateMsg req;
  req.prompt = "Once upon a time";
  req.sampling = ring::SamplingToWire(Greedy(), 1500, /*ignore_eog=*/true);
  int seen = 0;
  auto r = (*client)->Generate(req, [&](const ring::TokenMsg&) {
    if (++seen == 5) stages[1]->Kill(SIGKILL);
  });
  ASSERT_FALSE(r.ok()) << "the session should have ended with an error";
  EXPECT_NE(r.status().message().find("down"), std::string::npos) << r.status().message();
  EXPECT_LT(seen, 1500);

  for (int i = 0; i < 3; ++i) EXPECT_EQ(stages[i]->Ended(), -1) << "stage " << i << " died";
  // Restart it: the ring closes again and answers exactly as one process would.
  stages[1]->Start();
  ASSERT_TRUE((*client)->WaitReady(20000).ok());
  EXPECT_EQ(testing::GenerateOnRing(head, "Once upon a time", Greedy(), 16).ids,
            testing::GenerateLocally(model, "Once upon a time", Greedy(), 16).ids);
  // Every stage has freed the broken session's KV cache (and the finished one's).
  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  ASSERT_EQ(stats->size(), 3u);
  for (const auto& s : *stats) EXPECT_EQ(s.sessions_open, 0u) << s.name;
}

// Each stage of a 4-stage ring over an 8-layer model keeps about its window resident.
TEST(RingProcessTest, StageMemoryCoversItsWindowNotTheModel) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  testing::TempDir dir;
  testing::TinyModelShape shape;
  shape.n_layer = 8;
  shape.n_embd = 512;
  shape.n_head = 8;
  shape.n_head_kv = 8;
  shape.n_ff = 1536;
  shape.n_ctx = 256;
  shape.vocab_from = AssetPath("models/stories260K.gguf");
  const std::string model = dir.File("m.gguf");
  ASSERT_TRUE(testing::WriteTinyModel(model, shape).ok());
  const uint64_t file_size = std::filesystem::file_size(model);
  const testing::BoundPorts ports(4);
  std::vector<std::unique_ptr<ChildProcess>> stages;
  for (int i = 0; i < 4; ++i) {
    stages.push_back(StartStage(model, fmt::format("{}:{}", 2 * i, 2 * i + 2), ports.fd(i),
                                ports[(i + 1) % 4], fmt::format("m{}", i)));
  }
  const std::string head = fmt::format("127.0.0.1:{}", ports[0]);
  const auto got = testing::GenerateOnRing(head, "Once upon a time", Greedy(), 8);
  EXPECT_EQ(got.ids.size(), 8u);
  auto client = ring::RingClient::Connect(head, 20000, testing::kTestRingSecret);
  ASSERT_TRUE(client.ok());
  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  ASSERT_EQ(stats->size(), 4u);
  for (const auto& s : *stats) {
    std::printf("%s: layers %d:%d, weights %.1f MiB, RSS %.1f MiB (model file %.1f MiB)\n", s.name,
                s.window_first, s.window_last, s.weight_bytes / 1048576.0,
                s.rss_bytes / 1048576.0, file_size / 1048576.0);
    // Bound: the window's weights plus 24 MiB for the process, its code, KV caches and buffers.
    EXPECT_LT(s.rss_bytes, s.weight_bytes + (24u << 20)) << s.name;
    EXPECT_LT(s.rss_bytes, file_size / 2) << s.name;
  }
}

}  // namespace
}  // namespace kvasir
