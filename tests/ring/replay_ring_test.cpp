// A replay after a repair (docs/PROTOCOL.md, "Repair") on one real stage between fake neighbours:
// a stage that still holds a session runs only the positions it lacks, and sends on for the
// others the rows it sent before, bit for bit; with --replay-mb 0 it runs them all again; the
// last stage resumes after the positions it holds and draws what one process draws; and a replay
// that does not match what a stage holds fails that session with an error that says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "model/layer_window.h"
#include "model/model_id.h"
#include "ring/messages.h"
#include "ring/receipt.h"
#include "ring/sampling_wire.h"
#include "ring_test_util.h"
#include "test_assets.h"
#include "tokenizer/tokenizer.h"

namespace kvasir {
namespace {

using testing::AssetPath;

constexpr const char* kModel = "models/stories260K.gguf";
constexpr int kEmbd = 64;  // stories260K's width

struct Prompt {
  std::vector<int32_t> prompt;  // the prompt's ids
  std::vector<int32_t> ids;     // the prompt, then the tokens one process draws after it
};

Prompt MakePrompt(int n_generated) {
  auto file = GgufFile::Open(AssetPath(kModel));
  EXPECT_TRUE(file.ok());
  auto tok = Tokenizer::FromGguf(file->header(), AssetPath(kModel));
  EXPECT_TRUE(tok.ok());
  Prompt p;
  p.prompt = (*tok)->Encode("Once upon a time", true, true);
  p.ids = p.prompt;
  const auto local = testing::GenerateLocally(AssetPath(kModel), "Once upon a time",
                                              testing::Greedy(), n_generated, 64);
  p.ids.insert(p.ids.end(), local.ids.begin(), local.ids.end());
  return p;
}

// The boundary rows after layers [0, last) for `ids`, computed here: [ids.size(), kEmbd] f32.
std::vector<float> FrontRows(const std::vector<int32_t>& ids, int last) {
  auto file = GgufFile::Open(AssetPath(kModel));
  EXPECT_TRUE(file.ok());
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  WindowOptions wo;
  wo.n_ctx = 64;
  auto front = LayerWindow::Load(shared, {0, last, true, false}, wo);
  EXPECT_TRUE(front.ok());
  EXPECT_TRUE((*front)->OpenSequence(0).ok());
  ForwardOutput out;
  const int n = static_cast<int>(ids.size());
  EXPECT_TRUE((*front)->Forward({{{0, 0, n}}, ids, {}, false}, &out).ok());
  return out.hidden;
}

std::unique_ptr<testing::FakeNeighbours> StartStage(int first, int last, size_t replay_bytes) {
  ring::StageOptions o;
  o.model_path = AssetPath(kModel);
  o.first = first;
  o.last = last;
  o.name = "stage";
  o.n_ctx = 64;
  o.replay_bytes = replay_bytes;
  const bool tail = last == 5;
  auto fake = testing::FakeNeighbours::Start(
      o, testing::FakeStageHello(AssetPath(kModel), 0, first),
      testing::FakeStageHello(AssetPath(kModel), tail ? 0 : last, tail ? first : 5));
  EXPECT_NE(fake, nullptr);
  if (fake != nullptr) {
    EXPECT_TRUE(fake->WaitForwarding());
  }
  return fake;
}

void Open(ring::Link& pred, uint32_t session, const std::vector<int32_t>& ids, int n_generated) {
  ring::OpenSessionMsg m;
  m.session = session;
  m.sampling = ring::SamplingToWire(testing::Greedy(), 16, false);
  m.prompt = ids;
  m.replay = n_generated >= 0;
  m.n_generated = static_cast<uint32_t>(std::max(n_generated, 0));
  ASSERT_TRUE(pred.Send(m).ok());
}

// Rows [a, b) of `rows` as one HIDDEN of `session`.
void Send(ring::Link& pred, uint32_t session, const std::vector<float>& rows, int a, int b,
          uint16_t flags = wire::kHiddenSample) {
  std::span<const float> part(rows.data() + static_cast<size_t>(a) * kEmbd,
                              static_cast<size_t>(b - a) * kEmbd);
  ASSERT_TRUE(
      pred.Send(ring::MakeHidden(session, static_cast<uint32_t>(a), static_cast<uint32_t>(b - a),
                                 kEmbd, wire::Dtype::kF32, flags, part))
          .ok());
}

// What the stage sent on: each position's row (the last one sent for it), tokens, errors, and
// the STATS that came through.
struct Seen {
  std::map<uint32_t, std::map<uint32_t, std::vector<float>>> rows;  // session -> pos -> row
  std::map<uint32_t, std::vector<ring::TokenMsg>> tokens;
  std::map<uint32_t, std::string> errors;
  std::optional<ring::StatsMsg> stats;
  std::map<uint32_t, ring::Receipt> receipts;  // signed on, by session
};

// Reads what arrives until `done` holds (false, with a failed expectation, after 10 s).
bool Collect(testing::Inbox& inbox, Seen* seen, const std::function<bool(const Seen&)>& done) {
  while (!done(*seen)) {
    auto m = inbox.Next(10000);
    if (!m) {
      ADD_FAILURE() << "nothing more came";
      return false;
    }
    if (auto* h = std::get_if<ring::HiddenMsg>(&*m)) {
      std::vector<float> f;
      ring::HiddenToF32(*h, &f);
      for (uint32_t i = 0; i < h->n_tokens; ++i) {
        seen->rows[h->session][h->pos0 + i].assign(f.begin() + i * kEmbd,
                                                   f.begin() + (i + 1) * kEmbd);
      }
    } else if (auto* t = std::get_if<ring::TokenMsg>(&*m)) {
      seen->tokens[t->token.session].push_back(*t);
    } else if (auto* e = std::get_if<ring::ErrorMsg>(&*m)) {
      seen->errors[e->session] = e->message;
    } else if (auto* s = std::get_if<ring::StatsMsg>(&*m)) {
      seen->stats = *s;
    } else if (auto* r = std::get_if<ring::ReceiptMsg>(&*m)) {
      auto parsed = ring::ParseReceipt(r->payload);
      EXPECT_TRUE(parsed.ok()) << parsed.status().message();
      if (parsed.ok()) seen->receipts[parsed->session] = *parsed;
    }
  }
  return true;
}

// The stage's statistics: its record and its repair counts (zeros when it has none).
std::pair<wire::StageStats, wire::RepairStatsWire> Stats(testing::FakeNeighbours& fake,
                                                         Seen* seen) {
  seen->stats.reset();
  EXPECT_TRUE(fake.pred().Send(ring::StatsMsg{}).ok());
  Collect(fake.inbox(), seen, [](const Seen& s) { return s.stats.has_value(); });
  if (!seen->stats || seen->stats->records.size() != 1) return {};
  return {seen->stats->records[0],
          seen->stats->repairs.empty() ? wire::RepairStatsWire{} : seen->stats->repairs[0]};
}

// A middle stage (layers 2:4) holds a session of P prompt positions and one decode step when the
// head replays it with one more position: it runs only that one, sends on its kept rows for the
// others unchanged, and its outputs equal a session that was never interrupted. Without kept rows
// (--replay-mb 0) it runs all of them again, with the same outputs.
void CheckMiddleReplay(size_t replay_bytes) {
  const Prompt p = MakePrompt(2);
  const int n_prompt = static_cast<int>(p.prompt.size());
  const int n = static_cast<int>(p.ids.size());  // n_prompt + 2
  const std::vector<float> rows = FrontRows(p.ids, 2);
  auto fake = StartStage(2, 4, replay_bytes);
  ASSERT_NE(fake, nullptr);
  ring::Link& pred = fake->pred();
  Seen seen;
  // Session 1: the prompt, then one decode step; then the replay of all n positions.
  // A decode step waits for the prompt's rows, as in a ring (decode steps run first in a batch).
  auto sent = [&](uint32_t session, int count) {
    return [session, count](const Seen& s) {
      return s.rows.count(session) && s.rows.at(session).size() >= static_cast<size_t>(count);
    };
  };
  Open(pred, 1, p.prompt, -1);
  Send(pred, 1, rows, 0, n_prompt);
  ASSERT_TRUE(Collect(fake->inbox(), &seen, sent(1, n_prompt)));
  Send(pred, 1, rows, n_prompt, n_prompt + 1);
  ASSERT_TRUE(Collect(fake->inbox(), &seen, [&](const Seen& s) {
    return s.rows.count(1) && s.rows.at(1).size() == static_cast<size_t>(n_prompt + 1);
  }));
  const auto before = seen.rows[1];
  const auto [stage0, repair0] = Stats(*fake, &seen);
  seen.rows.clear();
  Open(pred, 1, p.ids, 2);
  Send(pred, 1, rows, 0, n);
  ASSERT_TRUE(Collect(fake->inbox(), &seen, [&](const Seen& s) {
    return s.rows.count(1) && s.rows.at(1).count(static_cast<uint32_t>(n - 1));
  }));
  const auto [stage1, repair1] = Stats(*fake, &seen);
  const int kept = replay_bytes > 0 ? n_prompt + 1 : 0;
  EXPECT_EQ(repair1.kept, static_cast<uint64_t>(kept));
  EXPECT_EQ(repair1.recomputed, static_cast<uint64_t>(n - kept));
  EXPECT_EQ(stage1.rows - stage0.rows, static_cast<uint64_t>(n - kept)) << "rows run again";
  EXPECT_EQ(seen.errors.size(), 0u) << seen.errors.begin()->second;
  if (kept > 0) {
    for (int pos = 0; pos < kept; ++pos) {
      EXPECT_EQ(seen.rows[1][pos], before.at(pos)) << "kept row " << pos << " changed";
    }
  }
  const auto replayed = seen.rows[1];
  // Session 2: the same rows, in the chunks the replayed session ran, never interrupted.
  Open(pred, 2, p.ids, -1);
  if (kept > 0) {
    Send(pred, 2, rows, 0, n_prompt);
    ASSERT_TRUE(Collect(fake->inbox(), &seen, sent(2, n_prompt)));
    Send(pred, 2, rows, n_prompt, n_prompt + 1);
    ASSERT_TRUE(Collect(fake->inbox(), &seen, sent(2, n_prompt + 1)));
    Send(pred, 2, rows, n_prompt + 1, n);
  } else {
    Send(pred, 2, rows, 0, n);
  }
  ASSERT_TRUE(Collect(fake->inbox(), &seen, [&](const Seen& s) {
    return s.rows.count(2) && s.rows.at(2).count(static_cast<uint32_t>(n - 1));
  }));
  for (int pos = 0; pos < n; ++pos) {
    EXPECT_EQ(replayed.at(pos), seen.rows[2][pos]) << "position " << pos;
  }
  // Both close. The stage's receipt line for the replayed session counts and commits to every
  // position once, in order, as the line of the session that was never interrupted does: the
  // same count and the same root over the same rows (the audits pair lines by position).
  ASSERT_TRUE(pred.Send(ring::CloseMsg{1, 2}).ok());
  ASSERT_TRUE(pred.Send(ring::CloseMsg{2, 2}).ok());
  auto file = GgufFile::Open(AssetPath(kModel));
  ASSERT_TRUE(file.ok());
  auto model_id = ComputeModelId(file->header(), AssetPath(kModel));
  ASSERT_TRUE(model_id.ok());
  for (uint32_t session : {1u, 2u}) {
    ring::Receipt r;
    r.session = session;
    r.id[0] = static_cast<uint8_t>(session);
    std::copy(model_id->begin(), model_id->end(), r.model_id.begin());
    ring::AppendReceiptLine(&r, fake->key(), 0, 2, static_cast<uint64_t>(n), ring::Digest{});
    ASSERT_TRUE(pred.Send(ring::ReceiptMsg{ring::EncodeReceipt(r)}).ok());
  }
  ASSERT_TRUE(Collect(fake->inbox(), &seen, [](const Seen& s) { return s.receipts.size() == 2; }));
  ASSERT_EQ(seen.receipts[1].lines.size(), 2u);
  ASSERT_EQ(seen.receipts[2].lines.size(), 2u);
  EXPECT_EQ(seen.receipts[1].lines[1].tokens, static_cast<uint64_t>(n));
  EXPECT_EQ(seen.receipts[2].lines[1].tokens, static_cast<uint64_t>(n));
  EXPECT_EQ(seen.receipts[1].lines[1].rows_root, seen.receipts[2].lines[1].rows_root);
}

TEST(ReplayRingTest, AMiddleStageRunsOnlyThePositionsItLacks) {
  KV_REQUIRE_ASSET(kModel);
  CheckMiddleReplay(size_t{64} << 20);
}

TEST(ReplayRingTest, WithoutKeptRowsAStageRunsTheWholeReplayAndGetsTheSameRows) {
  KV_REQUIRE_ASSET(kModel);
  CheckMiddleReplay(0);
}

// The last stage holds the prompt and drew the first token; the head's replay (prompt and that
// token) makes it run one position and draw the second token of one process, not the first again.
// A forged replay that asks for a token at a position it holds is refused, naming it.
TEST(ReplayRingTest, TheLastStageResumesAfterWhatItHoldsAndRefusesAForgedDraw) {
  KV_REQUIRE_ASSET(kModel);
  const Prompt p = MakePrompt(2);
  const int n_prompt = static_cast<int>(p.prompt.size());
  const std::vector<float> rows = FrontRows(p.ids, 4);
  auto fake = StartStage(4, 5, size_t{64} << 20);
  ASSERT_NE(fake, nullptr);
  ring::Link& pred = fake->pred();
  Seen seen;
  for (uint32_t session : {1u, 2u}) {
    Open(pred, session, p.prompt, -1);
    Send(pred, session, rows, 0, n_prompt);
  }
  ASSERT_TRUE(Collect(fake->inbox(), &seen, [](const Seen& s) { return s.tokens.size() == 2; }));
  EXPECT_EQ(seen.tokens[1][0].token.id, p.ids[n_prompt]);
  // Session 1, honestly: n_prompt + 1 positions, of which the stage holds n_prompt.
  std::vector<int32_t> first(p.ids.begin(), p.ids.begin() + n_prompt + 1);
  Open(pred, 1, first, 1);
  Send(pred, 1, rows, 0, n_prompt + 1);
  // Session 2, forged: rows the stage holds, flagged to draw after them.
  Open(pred, 2, first, 1);
  Send(pred, 2, rows, 0, n_prompt);
  ASSERT_TRUE(Collect(fake->inbox(), &seen, [](const Seen& s) {
    return s.tokens.count(1) && s.tokens.at(1).size() == 2 && s.errors.count(2);
  }));
  EXPECT_EQ(seen.tokens[1][1].token.id, p.ids[n_prompt + 1]) << "not one process's second token";
  EXPECT_EQ(seen.tokens[1][1].token.pos, static_cast<uint32_t>(n_prompt + 1));
  EXPECT_NE(seen.errors[2].find("which this stage kept from before the replay"), std::string::npos)
      << seen.errors[2];
  EXPECT_EQ(seen.errors.count(1), 0u);
  const auto [stage, repair] = Stats(*fake, &seen);
  EXPECT_EQ(repair.kept, static_cast<uint64_t>(2 * n_prompt));
  EXPECT_EQ(repair.recomputed, 2u);
}

// Speculation meets a repair: a middle stage ran a verify chunk (a token and two drafts) when the
// ring broke, and the last stage had rejected the first draft. The replay's ids differ from the
// drafts there, so the stage keeps only the chunk's first row (the token fed) and runs the rest
// again: its rows equal those of a session that never drafted.
TEST(ReplayRingTest, RowsOfDraftsAreNotKeptForAReplay) {
  KV_REQUIRE_ASSET(kModel);
  const Prompt p = MakePrompt(3);
  const int n_prompt = static_cast<int>(p.prompt.size());
  const int n = n_prompt + 2;  // the prompt, the token fed, and the token that replaced a draft
  std::vector<int32_t> drafted = p.ids;
  drafted[n_prompt + 1] = (p.ids[n_prompt + 1] + 7) % 512;  // a draft the last stage rejected
  const std::vector<float> rows = FrontRows(p.ids, 2);
  const std::vector<float> draft_rows = FrontRows(drafted, 2);
  auto fake = StartStage(2, 4, size_t{64} << 20);
  ASSERT_NE(fake, nullptr);
  ring::Link& pred = fake->pred();
  Seen seen;
  Open(pred, 1, p.prompt, -1);
  Send(pred, 1, rows, 0, n_prompt);
  // A decode step waits for the prompt's rows, as in a ring (decode steps run first in a batch).
  ASSERT_TRUE(Collect(fake->inbox(), &seen, [&](const Seen& s) {
    return s.rows.count(1) && s.rows.at(1).size() == static_cast<size_t>(n_prompt);
  }));
  Send(pred, 1, draft_rows, n_prompt, n_prompt + 3, wire::kHiddenSample | wire::kHiddenVerify);
  ASSERT_TRUE(Collect(fake->inbox(), &seen, [&](const Seen& s) {
    return s.rows.count(1) && s.rows.at(1).count(static_cast<uint32_t>(n_prompt + 2));
  }));
  seen.rows.clear();
  Open(pred, 1, std::vector<int32_t>(p.ids.begin(), p.ids.begin() + n), 2);
  Send(pred, 1, rows, 0, n);
  ASSERT_TRUE(Collect(fake->inbox(), &seen, [&](const Seen& s) {
    return s.rows.count(1) && s.rows.at(1).count(static_cast<uint32_t>(n - 1));
  }));
  const auto replayed = seen.rows[1];
  const auto [stage, repair] = Stats(*fake, &seen);
  EXPECT_EQ(repair.kept, static_cast<uint64_t>(n_prompt + 1)) << "rows of a draft kept";
  EXPECT_EQ(repair.recomputed, 1u);
  // Session 2 never drafted: the same ids, in one chunk.
  Open(pred, 2, std::vector<int32_t>(p.ids.begin(), p.ids.begin() + n), -1);
  Send(pred, 2, rows, 0, n);
  ASSERT_TRUE(Collect(fake->inbox(), &seen, [&](const Seen& s) {
    return s.rows.count(2) && s.rows.at(2).count(static_cast<uint32_t>(n - 1));
  }));
  EXPECT_EQ(seen.errors.size(), 0u);
  for (int pos = 0; pos < n; ++pos) {
    const std::vector<float>& a = replayed.at(pos);
    const std::vector<float>& b = seen.rows[2].at(pos);
    ASSERT_EQ(a.size(), b.size());
    float diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
    // Rows run in other chunks may differ in rounding; another token's row differs by far more.
    EXPECT_LT(diff, 1e-3f) << "position " << pos;
  }
}

// Replays that claim what the stage does not hold fail only their own session: rows that skip
// past what it holds, and a verify chunk over its kept positions.
TEST(ReplayRingTest, AForgedReplayFailsOnlyItsSession) {
  KV_REQUIRE_ASSET(kModel);
  const Prompt p = MakePrompt(2);
  const int n_prompt = static_cast<int>(p.prompt.size());
  const int n = static_cast<int>(p.ids.size());
  const std::vector<float> rows = FrontRows(p.ids, 2);
  auto fake = StartStage(2, 4, size_t{64} << 20);
  ASSERT_NE(fake, nullptr);
  ring::Link& pred = fake->pred();
  Seen seen;
  for (uint32_t session : {1u, 2u, 3u}) {
    Open(pred, session, p.prompt, -1);
    Send(pred, session, rows, 0, n_prompt);
  }
  ASSERT_TRUE(Collect(fake->inbox(), &seen, [&](const Seen& s) {
    for (uint32_t session : {1u, 2u, 3u}) {
      if (!s.rows.count(session) || s.rows.at(session).size() < static_cast<size_t>(n_prompt)) {
        return false;
      }
    }
    return true;
  }));
  // Session 1: rows from n_prompt + 1 on, as if the stage held n_prompt + 1 positions.
  Open(pred, 1, p.ids, 2);
  Send(pred, 1, rows, n_prompt + 1, n);
  // Session 2: a verify chunk over positions it kept.
  Open(pred, 2, p.ids, 2);
  Send(pred, 2, rows, n_prompt - 2, n_prompt, wire::kHiddenSample | wire::kHiddenVerify);
  // Session 3: an honest replay, in the same burst.
  Open(pred, 3, p.ids, 2);
  Send(pred, 3, rows, 0, n);
  ASSERT_TRUE(Collect(fake->inbox(), &seen, [&](const Seen& s) {
    return s.errors.count(1) && s.errors.count(2) && s.rows.count(3) &&
           s.rows.at(3).count(static_cast<uint32_t>(n - 1));
  }));
  EXPECT_FALSE(seen.errors[1].empty());
  EXPECT_NE(seen.errors[2].find("replay: a verify chunk"), std::string::npos) << seen.errors[2];
  EXPECT_EQ(seen.errors.count(3), 0u) << seen.errors[3];
}

}  // namespace
}  // namespace kvasir
