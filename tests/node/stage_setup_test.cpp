// What a stage's setup refuses before anything is fetched (ring::CheckStageOptions) and the dial
// hooks of relayed links (node::ApplyRelayEdges).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "node/relay_dial.h"
#include "ring/node_key.h"
#include "ring/stage.h"
#include "test_assets.h"

namespace kvasir::node {
namespace {

using ring::CheckStageOptions;
using ::testing::HasSubstr;

ring::StageOptions Valid() {
  ring::StageOptions o;
  o.first = 1;
  o.last = 2;
  o.listen = "127.0.0.1:0";
  o.next = "127.0.0.1:9";
  o.insecure = true;
  o.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
  return o;
}

TEST(StageCheckTest, ValidOptionsPass) {
  Status s = CheckStageOptions(Valid());
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(StageCheckTest, EachBadOptionIsNamed) {
  struct Case {
    std::function<void(ring::StageOptions*)> change;
    std::string named;
  };
  const std::vector<Case> cases = {
      {[](ring::StageOptions* o) { o->listen = "127.0.0.1:99999"; }, "--listen"},
      {[](ring::StageOptions* o) { o->listen = "0.0.0.0:7000"; }, "loopback only"},
      {[](ring::StageOptions* o) { o->next = "nowhere"; }, "--next"},
      {[](ring::StageOptions* o) {
         o->standby_peers = {"127.0.0.1:1", "x"};
       },
       "--standby-peers"},
      {[](ring::StageOptions* o) { o->chunk = 0; }, "--chunk"},
      {[](ring::StageOptions* o) { o->max_sessions = 0; }, "--max-sessions"},
      {[](ring::StageOptions* o) { o->max_clients = 0; }, "--max-clients"},
      {[](ring::StageOptions* o) { o->n_threads = 0; }, "-t 0"},
      {[](ring::StageOptions* o) { o->link_timeout_ms = 50; }, "--link-timeout"},
      {[](ring::StageOptions* o) { o->repair_timeout_ms = -1; }, "--repair-timeout"},
      {[](ring::StageOptions* o) { o->standby = true, o->first = 0; }, "--standby"},
      {[](ring::StageOptions* o) { o->insecure = false; }, "nothing to authenticate"},
  };
  for (const Case& c : cases) {
    ring::StageOptions o = Valid();
    c.change(&o);
    EXPECT_THAT(CheckStageOptions(o).message(), HasSubstr(c.named)) << c.named;
  }
}

TEST(StageCheckTest, AnInheritedListenerNeedsNoAddress) {
  ring::StageOptions o = Valid();
  o.listen.clear();
  o.listen_fd = 3;
  EXPECT_TRUE(CheckStageOptions(o).ok());
}

TEST(RelayDialTest, RelayedLinksGetHooksAndDirectOnesNone) {
  ring::StageOptions o = Valid();
  RelayEdges e;
  e.next_via = "ws://127.0.0.1:1/edge/ring1.e1";
  Status s = ApplyRelayEdges(e, &o);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(static_cast<bool>(o.dial_next));
  EXPECT_FALSE(static_cast<bool>(o.dial_pred));
  EXPECT_EQ(o.next_via, e.next_via);
  // A relayed successor has one address: no standbys for it.
  o.standby_peers = {"127.0.0.1:2"};
  EXPECT_THAT(CheckStageOptions(o).message(), HasSubstr("--standby-peers needs --next"));
  // The hook dials the relay it names (nothing listens there).
  auto dialed = o.dial_next([] { return false; });
  EXPECT_FALSE(dialed.ok());
}

TEST(RelayDialTest, BadUrlsAndSecretFilesAreNamed) {
  ring::StageOptions o = Valid();
  RelayEdges e;
  e.pred_via = "http://relay/edge/x";
  EXPECT_THAT(ApplyRelayEdges(e, &o).message(), HasSubstr("--pred-via"));
  EXPECT_THAT(CheckRelayEdges(e).message(), HasSubstr("--pred-via"));
  EXPECT_FALSE(static_cast<bool>(o.dial_pred));
  e.pred_via = "ws://127.0.0.1:1/edge/ring1.e1";
  testing::TempDir dir;
  e.secret_file = dir.File("missing.secret");
  EXPECT_THAT(ApplyRelayEdges(e, &o).message(), HasSubstr("missing.secret"));
}

}  // namespace
}  // namespace kvasir::node
