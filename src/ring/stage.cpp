// Stage runtime, part 1: creation, validation of the options, stop, statistics and the event
// queue. The links are two parts (PredecessorSide, SuccessorLink) set up in stage_links.cpp, the
// compute loop is in stage_compute.cpp.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "base/log.h"
#include "base/mapped_file.h"
#include "ring/link_limits.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {

Result<std::unique_ptr<Stage>> Stage::Create(const StageOptions& options) {
  StageOptions opt = options;
  // An inherited listening socket is taken over first, so it is closed whatever fails below.
  std::optional<net::Listener> adopted;
  if (opt.listen_fd >= 0) {
    auto l = net::Listener::Adopt(opt.listen_fd);
    if (!l.ok()) {
      ::close(opt.listen_fd);
      return l.status().WithContext("--listen-fd");
    }
    adopted.emplace(std::move(l).value());
    const std::string& host = adopted->host();
    opt.listen = host.find(':') == std::string::npos
                     ? fmt::format("{}:{}", host, adopted->port())
                     : fmt::format("[{}]:{}", host, adopted->port());
  }
  if (opt.name.empty()) opt.name = fmt::format("stage-{}-{}", opt.first, opt.last);
  if (opt.max_batch_rows < opt.chunk) opt.max_batch_rows = opt.chunk;
  if (opt.dial_next && opt.next_via.empty()) opt.next_via = "successor (dial hook)";
  if (opt.dial_pred && opt.pred_via.empty()) opt.pred_via = "predecessor (dial hook)";
  KV_RETURN_IF_ERROR(CheckStageOptions(opt));  // the addresses parse (--listen, --next, ...)
  std::string host;
  uint16_t port = 0;
  (void)net::ParseHostPort(opt.listen, &host, &port);

  KV_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(opt.model_path));
  auto shared = std::make_shared<const GgufFile>(std::move(file));
  KV_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(*shared));
  if (opt.first < 0 || opt.last > cfg.n_layer || opt.first >= opt.last) {
    return Error("--layers {}:{} is not a window of the model's {} layers (need 0 <= A < B <= {})",
                 opt.first, opt.last, cfg.n_layer, cfg.n_layer);
  }
  WindowSpec spec{opt.first, opt.last, opt.first == 0, opt.last == cfg.n_layer};
  WindowOptions wopt;
  wopt.n_ctx = opt.n_ctx;
  wopt.n_threads = opt.n_threads;
  wopt.attn_type = opt.attn_type;
  wopt.max_sequences = opt.max_sessions;
  wopt.backend = opt.backend;
  // Speculation: rows a stage can roll back (docs/PROTOCOL.md, "Speculation"), enough for two
  // verify chunks of K = 7 in flight at once.
  wopt.max_checkpoints = kStageRollbackRows;
  KV_ASSIGN_OR_RETURN(std::unique_ptr<LayerWindow> window, LayerWindow::Load(shared, spec, wopt));
  std::unique_ptr<Tokenizer> tokenizer;
  if (spec.has_embed || spec.has_head) {
    KV_ASSIGN_OR_RETURN(tokenizer, Tokenizer::FromGguf(shared->header(), shared->path()));
  }
  KV_ASSIGN_OR_RETURN(ModelId id, ComputeModelId(shared->header(), shared->path()));
  KV_ASSIGN_OR_RETURN(net::Listener listener, adopted.has_value()
                                                  ? Result<net::Listener>(std::move(*adopted))
                                                  : net::Listener::Bind(host, port));
  std::unique_ptr<SpecTail> drafting;
  if (spec.has_head) {
    auto draft = opt.draft;
    draft.n_threads = opt.n_threads;
    draft.backend = opt.backend;
    KV_ASSIGN_OR_RETURN(drafting, SpecTail::Create(draft, *window));
  }
  auto stage = std::make_unique<StageImpl>(opt, std::move(shared), std::move(window),
                                           std::move(tokenizer), id, std::move(listener));
  stage->AttachDrafting(std::move(drafting));
  return std::unique_ptr<Stage>(std::move(stage));
}

StageImpl::StageImpl(StageOptions options, std::shared_ptr<const GgufFile> file,
                     std::unique_ptr<LayerWindow> window, std::unique_ptr<Tokenizer> tokenizer,
                     ModelId model_id, net::Listener listener)
    : options_(std::move(options)),
      file_(std::move(file)),
      window_(std::move(window)),
      tokenizer_(std::move(tokenizer)),
      model_id_(model_id),
      scheduler_(options_.max_batch_rows),
      cache_(options_.cache_bytes, std::chrono::milliseconds(options_.cache_ttl_ms)),
      row_store_(options_.row_store ? options_.row_store
                                    : std::make_shared<RowStore>(RowStoreOptions{0, 0})),
      receipts_(ReceiptBookOptions{options_.name, options_.key, model_id_,
                                   static_cast<uint32_t>(options_.first),
                                   static_cast<uint32_t>(options_.last),
                                   static_cast<uint32_t>(window_->config().n_layer), row_store_}),
      holds_(std::chrono::milliseconds(options_.repair_timeout_ms)),
      replay_rows_(options_.replay_bytes) {
  generation_.store(NewGeneration());
  for (LayerKind k : window_->config().layer_kinds) recurrent_ |= k != LayerKind::kAttention;
  entry_ = MakeEntryRole(*this, window_->spec().has_embed);
  exit_ = MakeExitRole(*this, window_->spec().has_head);
  client_max_payload_ = entry_->client_max_payload();
  stage_max_payload_ = MaxStagePayload(window_->n_ctx(), window_->config().n_embd);
  if (!options_.dial_next) {
    (void)net::ParseHostPort(options_.next, &succ_host_, &succ_port_);
    succ_addrs_.emplace_back(succ_host_, succ_port_);
    for (const std::string& peer : options_.standby_peers) {
      std::string host;
      uint16_t port = 0;
      (void)net::ParseHostPort(peer, &host, &port);
      succ_addrs_.emplace_back(host, port);
    }
  }
  succ_desc_ = options_.dial_next ? options_.next_via : options_.next;
  stage_auth_.key = options_.key;
  stage_auth_.ring_secret = options_.ring_secret;
  stage_auth_.insecure = options_.insecure;
  pred_side_ = std::make_unique<PredecessorSide>(PredecessorOptions(), std::move(listener));
  succ_link_ = std::make_unique<SuccessorLink>(SuccessorOptions());
  KV_LOG_INFO("{}: node {}{}", options_.name, PublicKeyHex(options_.key->public_key()),
              options_.insecure ? " (insecure: neighbours are not authenticated)" : "");
  KV_LOG_INFO(
      "{}: layers {}:{} of {} ({}{}{}), {:.1f} MiB of weights, on {} ({}), listening on "
      "port {}",
      options_.name, options_.first, options_.last, window_->config().n_layer, entry_->part(),
      !entry_->part().empty() && !exit_->part().empty() ? " + " : "", exit_->part(),
      window_->weight_bytes() / 1048576.0, window_->device().address, window_->device().name,
      pred_side_->port());
  KV_LOG_INFO("{}: repair: holds sessions {} ms, keeps {} MiB of rows sent on for replays",
              options_.name, options_.repair_timeout_ms, options_.replay_bytes >> 20);
}

StageImpl::~StageImpl() { Stop(); }

void StageImpl::Stop() {
  // One caller at a time: a signal thread and the main thread may both stop the stage.
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (running_.exchange(false)) {
    succ_link_->Stop();
    succ_links_.CloseAll();
    Push(Event{});
  }
  // Waits for every connection thread of the predecessor side: no event comes from it after.
  pred_side_->Stop();
  if (dial_thread_.joinable() && dial_thread_.get_id() != std::this_thread::get_id()) {
    dial_thread_.join();
  }
  // The dial thread is gone: what it opened last was refused or closed (LinkSet::CloseAll).
  succ_links_.CloseAll();
}

void StageImpl::Push(Event e) {
  {
    std::lock_guard<std::mutex> lock(events_mu_);
    events_.push_back(std::move(e));
  }
  events_cv_.notify_one();
}

wire::Hello StageImpl::MyHello() const {
  wire::Hello h{};
  h.protocol_version = wire::kProtocolVersion;
  h.role = static_cast<uint32_t>(wire::Role::kStage);
  std::memcpy(h.model_id, model_id_.data(), 16);
  h.n_layer = static_cast<uint32_t>(window_->config().n_layer);
  h.n_embd = static_cast<uint32_t>(window_->config().n_embd);
  h.window_first = options_.first;
  h.window_last = options_.last;
  h.flags = entry_->hello_flag() | exit_->hello_flag();
  std::strncpy(h.name, options_.name.c_str(), sizeof(h.name) - 1);
  h.generation = generation_.load();
  return h;
}

Status StageImpl::CheckStageHello(const wire::Hello& h, bool peer_is_pred) const {
  if (h.protocol_version != wire::kProtocolVersion) {
    return Error("peer speaks protocol {}, this stage speaks {}", h.protocol_version,
                 wire::kProtocolVersion);
  }
  ModelId theirs;
  std::memcpy(theirs.data(), h.model_id, 16);
  if (theirs != model_id_) {
    return Error("peer runs model {}, this stage runs model {}", ModelIdHex(theirs),
                 ModelIdHex(model_id_));
  }
  const int n_layer = window_->config().n_layer;
  const int pred_last = peer_is_pred ? h.window_last : options_.last;
  const int succ_first = peer_is_pred ? options_.first : h.window_first;
  const bool adjacent = pred_last == succ_first || (pred_last == n_layer && succ_first == 0);
  if (!adjacent) {
    return Error("windows are not adjacent: predecessor ends at layer {}, successor starts at {}",
                 pred_last, succ_first);
  }
  return Status::Ok();
}

wire::StageStats StageImpl::StatsRecord() const {
  wire::StageStats s{};
  std::strncpy(s.name, options_.name.c_str(), sizeof(s.name) - 1);
  std::strncpy(s.backend, options_.backend.c_str(), sizeof(s.backend) - 1);
  s.window_first = options_.first;
  s.window_last = options_.last;
  s.weight_bytes = window_->weight_bytes();
  s.rss_bytes = CurrentRssBytes();
  s.bytes_in = pred_side_->pred_bytes_in();
  s.bytes_out = bytes_out_.load();
  s.rows = rows_.load();
  s.decode_rows = decode_rows_.load();
  s.busy_ns = busy_ns_.load();
  s.decode_busy_ns = decode_busy_ns_.load();
  // Sessions whose CLOSE is on its way around the ring count as closed.
  s.links_refused = static_cast<uint32_t>(links_refused_.load());
  s.sessions_open = static_cast<uint32_t>(std::count_if(
      sessions_.begin(), sessions_.end(), [](const auto& kv) { return !kv.second.closing; }));
  return s;
}

void StageImpl::AddStatsRecord(StatsMsg& m) const {
  m.records.push_back(StatsRecord());
  AddRepairRecord(m);  // stage_replay.cpp
  const DraftTotals d = draft_totals();
  if (d.drafter.empty() && m.drafts.empty()) return;
  m.drafts.resize(m.records.size() - 1);  // zeros for the stages before that do not draft
  wire::DraftStatsWire w{};
  std::strncpy(w.drafter, d.drafter.c_str(), sizeof(w.drafter) - 1);
  w.steps = d.steps;
  w.drafted = d.drafted;
  w.accepted = d.accepted;
  m.drafts.push_back(w);
}

void StageImpl::LogStats() {
  const wire::StageStats s = StatsRecord();
  const wire::RepairStatsWire r = RepairRecord();
  KV_LOG_INFO(
      "{}: stats: layers {}:{}, weights {:.1f} MiB, rss {:.1f} MiB, in {} B, out {} B, rows {} "
      "({} decode), busy {:.1f} ms, links refused {}, repairs {} ({} positions replayed: {} "
      "kept here, {} run again; {} pauses, longest {} ms)",
      options_.name, s.window_first, s.window_last, s.weight_bytes / 1048576.0,
      s.rss_bytes / 1048576.0, s.bytes_in, s.bytes_out, s.rows, s.decode_rows, s.busy_ns / 1e6,
      s.links_refused, repairs_.load(), replayed_tokens_.load(), r.kept, r.recomputed, r.pauses,
      r.pause_ms_max);
  if (const DraftTotals d = draft_totals(); !d.drafter.empty()) {
    KV_LOG_INFO(
        "{}: drafts: {}, {} verify chunks, {} drafted, {} accepted ({:.1f} %), {} windows "
        "guessed ahead, {} confirmed",
        options_.name, d.drafter, d.steps, d.drafted, d.accepted, 100.0 * d.acceptance(), d.guessed,
        d.confirmed);
  }
}

Status StageImpl::Run() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (!running_.load()) return Status::Ok();
  }
  pred_side_->Start();
  // A standby dials its successor once a predecessor adopts it (MaybeStartDialing).
  if (options_.standby) {
    KV_LOG_INFO("{}: standby: waiting for a predecessor to adopt it", options_.name);
  } else {
    dial_thread_ = std::thread([this] { succ_link_->Run(); });
  }
  Clock::time_point last_turn = Clock::now();
  while (running_.load()) {
    CheckStalled(last_turn);
    last_turn = Clock::now();
    std::deque<Event> batch;
    {
      std::unique_lock<std::mutex> lock(events_mu_);
      const bool idle = scheduler_.size() == 0;
      if (events_.empty() && idle && !LookAheadDue()) {
        // Wake up periodically to probe the ring while it is not known to be closed, and to end
        // held sessions in time.
        events_cv_.wait_for(lock, entry_->IdleWait());
      }
      batch.swap(events_);
    }
    for (Event& e : batch) HandleEvent(e);
    MaybeStartDialing();
    ExpireHolds();
    entry_->OnTurn();
    // Idle time (a session's tokens are travelling) drafts ahead; events are checked between.
    if (!RunBatch() && batch.empty()) LookAhead();
  }
  return Status::Ok();
}

}  // namespace kvasir::ring
