// Stage runtime, part 1: creation, the accept and dial threads, handshakes, and link bookkeeping.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "base/log.h"
#include "base/mapped_file.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {

Result<std::unique_ptr<Stage>> Stage::Create(const StageOptions& options) {
  StageOptions opt = options;
  if (opt.name.empty()) opt.name = fmt::format("stage-{}-{}", opt.first, opt.last);
  if (opt.chunk < 1) return Error("--chunk {} must be at least 1", opt.chunk);
  if (opt.max_batch_rows < opt.chunk) opt.max_batch_rows = opt.chunk;
  std::string succ_host;
  uint16_t succ_port = 0;
  if (opt.dial_next) {
    if (opt.next_via.empty()) opt.next_via = "successor (dial hook)";
  } else {
    KV_RETURN_IF_ERROR(ParseHostPort(opt.next, &succ_host, &succ_port).WithContext("--next"));
  }
  if (opt.dial_pred && opt.pred_via.empty()) opt.pred_via = "predecessor (dial hook)";
  std::string host;
  uint16_t port = 0;
  KV_RETURN_IF_ERROR(ParseHostPort(opt.listen, &host, &port).WithContext("--listen"));

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
  wopt.max_sequences = opt.max_sessions;
  KV_ASSIGN_OR_RETURN(std::unique_ptr<LayerWindow> window, LayerWindow::Load(shared, spec, wopt));
  std::unique_ptr<Tokenizer> tokenizer;
  if (spec.has_embed || spec.has_head) {
    KV_ASSIGN_OR_RETURN(tokenizer, Tokenizer::FromGguf(shared->header(), shared->path()));
  }
  KV_ASSIGN_OR_RETURN(ModelId id, ComputeModelId(shared->header(), shared->path()));
  KV_ASSIGN_OR_RETURN(Listener listener, Listener::Bind(host, port));
  auto stage = std::make_unique<StageImpl>(opt, std::move(shared), std::move(window),
                                           std::move(tokenizer), id, std::move(listener));
  return std::unique_ptr<Stage>(std::move(stage));
}

StageImpl::StageImpl(StageOptions options, std::shared_ptr<const GgufFile> file,
                     std::unique_ptr<LayerWindow> window, std::unique_ptr<Tokenizer> tokenizer,
                     ModelId model_id, Listener listener)
    : options_(std::move(options)),
      file_(std::move(file)),
      window_(std::move(window)),
      tokenizer_(std::move(tokenizer)),
      model_id_(model_id),
      listener_(std::move(listener)) {
  if (!options_.dial_next) (void)ParseHostPort(options_.next, &succ_host_, &succ_port_);
  succ_desc_ = options_.dial_next ? options_.next_via : options_.next;
  std::random_device rd;
  // Session ids start at a random point so a restarted head never reuses live ids.
  next_session_ = (rd() & 0x3fffffffu) + 1;
  probe_nonce_ = (static_cast<uint64_t>(rd()) << 32) | rd();
  KV_LOG_INFO("{}: layers {}:{} of {} ({}{}), {:.1f} MiB of weights, listening on port {}",
              options_.name, options_.first, options_.last, window_->config().n_layer,
              is_head() ? "embeddings" : "", is_last() ? (is_head() ? " + head" : "head") : "",
              window_->weight_bytes() / 1048576.0, listener_.port());
}

StageImpl::~StageImpl() { Stop(); }

void StageImpl::Stop() {
  // One caller at a time: a signal thread and the main thread may both stop the stage.
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (running_.exchange(false)) {
    listener_.Close();
    {
      std::lock_guard<std::mutex> lock(links_mu_);
      succ_cv_.notify_all();
    }
    std::lock_guard<std::mutex> lock(threads_mu_);
    for (auto& l : all_links_) l->Close();
    Push(Event{});
  }
  for (std::thread* t : {&accept_thread_, &dial_thread_, &pred_thread_}) {
    if (t->joinable() && t->get_id() != std::this_thread::get_id()) t->join();
  }
  std::vector<ConnThread> threads;
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    for (auto& l : all_links_) l->Close();
    threads.swap(conn_threads_);
  }
  for (auto& t : threads) {
    if (t.thread.joinable()) t.thread.join();
  }
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
  h.flags = (is_head() ? wire::kHelloHasEmbed : 0) | (is_last() ? wire::kHelloHasHead : 0);
  std::strncpy(h.name, options_.name.c_str(), sizeof(h.name) - 1);
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

void StageImpl::AcceptLoop() {
  while (running_.load()) {
    auto stream = listener_.Accept();
    if (!stream.ok()) {
      if (running_.load()) KV_LOG_WARN("{}: accept: {}", options_.name, stream.status().message());
      return;
    }
    const std::string peer = (*stream)->peer();
    auto link = std::make_shared<Link>(std::move(stream).value(), "peer " + peer);
    std::lock_guard<std::mutex> lock(threads_mu_);
    if (!running_.load()) return;
    // Reap connections that have ended, so a long-lived stage does not accumulate them.
    std::erase_if(all_links_, [](const auto& l) { return l->closed(); });
    for (auto it = conn_threads_.begin(); it != conn_threads_.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = conn_threads_.erase(it);
      } else {
        ++it;
      }
    }
    all_links_.push_back(link);
    auto done = std::make_shared<std::atomic<bool>>(false);
    conn_threads_.push_back({std::thread([this, link, done] {
                               (void)ServeConnection(link);
                               done->store(true);
                             }),
                             done});
  }
}

Status StageImpl::ServeConnection(std::shared_ptr<Link> link) {
  auto first = link->Receive();
  if (!first.ok()) {
    link->Fail(wire::ErrorCode::kMalformed, first.status().message());
    return first.status();
  }
  auto* hello = std::get_if<HelloMsg>(&*first);
  if (hello == nullptr) {
    const std::string why = fmt::format("expected HELLO first, got {}", MessageName(*first));
    link->Fail(wire::ErrorCode::kMalformed, why);
    return Error("{}: {}", link->what(), why);
  }
  const wire::Hello& h = hello->hello;
  const bool is_client = h.role == static_cast<uint32_t>(wire::Role::kClient);
  uint64_t client = 0;
  if (is_client) {
    if (h.protocol_version != wire::kProtocolVersion) {
      const std::string why = fmt::format("client speaks protocol {}, this stage speaks {}",
                                          h.protocol_version, wire::kProtocolVersion);
      link->Fail(wire::ErrorCode::kVersion, why);
      return Error("{}: {}", link->what(), why);
    }
    if (!is_head()) {
      const std::string why =
          fmt::format("{} holds layers {}:{}; clients connect to the head stage (layer 0)",
                      options_.name, options_.first, options_.last);
      link->Fail(wire::ErrorCode::kBadRequest, why);
      return Error("{}: {}", link->what(), why);
    }
  } else if (Status s = CheckStageHello(h, true); !s.ok()) {
    KV_LOG_WARN("{}: refused predecessor {}: {}", options_.name, link->what(), s.message());
    const auto code = h.protocol_version != wire::kProtocolVersion ? wire::ErrorCode::kVersion
                      : std::memcmp(h.model_id, model_id_.data(), 16) != 0
                          ? wire::ErrorCode::kWrongModel
                          : wire::ErrorCode::kNotAdjacent;
    link->Fail(code, s.message());
    return s.WithContext("refused predecessor " + link->what());
  }
  if (Status s = link->Send(HelloMsg{MyHello()}); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    if (is_client) {
      client = next_client_++;
      clients_[client] = link;
    } else {
      if (pred_ != nullptr) pred_->Close();
      pred_ = link;
    }
  }
  const std::string peer_name(h.name, strnlen(h.name, sizeof(h.name)));
  if (!is_client) {
    KV_LOG_INFO("{}: link up: predecessor {} ({}, layers {}:{})", options_.name, peer_name,
                link->what(), h.window_first, h.window_last);
  }
  uint64_t seen_in = link->bytes_in();
  while (running_.load()) {
    auto msg = link->Receive();
    if (!msg.ok()) {
      if (!link->closed()) {
        const std::string& why = msg.status().message();
        const bool eof = why.find("closed the connection") != std::string::npos;
        if (!eof) {
          KV_LOG_WARN("{}: {}", options_.name, why);
          link->Fail(wire::ErrorCode::kMalformed, why);
        }
      }
      break;
    }
    if (!is_client) {
      bytes_in_.fetch_add(link->bytes_in() - seen_in);
      seen_in = link->bytes_in();
    }
    Event e;
    e.kind = Event::Kind::kMessage;
    e.from_pred = !is_client;
    e.client = client;
    e.msg = std::move(msg).value();
    Push(std::move(e));
  }
  link->Close();
  bool was_current = false;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    if (is_client) {
      clients_.erase(client);
    } else if (pred_ == link) {
      pred_.reset();
      was_current = true;
    }
  }
  Event e;
  if (is_client) {
    e.kind = Event::Kind::kClientGone;
    e.client = client;
    Push(std::move(e));
  } else if (was_current && running_.load()) {
    KV_LOG_WARN("{}: link down: predecessor {}", options_.name, link->what());
    e.kind = Event::Kind::kPredDown;
    e.reason = "link from predecessor " + link->what() + " down";
    Push(std::move(e));
  }
  return Status::Ok();
}

void StageImpl::Backoff(int* backoff_ms) {
  std::unique_lock<std::mutex> lock(links_mu_);
  succ_cv_.wait_for(lock, std::chrono::milliseconds(*backoff_ms),
                    [this] { return !running_.load(); });
  *backoff_ms = std::min(*backoff_ms * 2, 2000);
}

void StageImpl::DialLoop() {
  int backoff_ms = 100;
  bool logged_wait = false;
  std::string last_refusal;
  const std::function<bool()> cancelled = [this] { return !running_.load(); };
  while (running_.load()) {
    auto stream = options_.dial_next ? options_.dial_next(cancelled)
                                     : DialTcp(succ_host_, succ_port_, 2000);
    if (!stream.ok()) {
      if (!logged_wait && running_.load()) {
        // A relay's refusal says more than a TCP port that is not open yet (and names the URL).
        if (options_.dial_next) {
          KV_LOG_INFO("{}: waiting for successor: {}", options_.name, stream.status().message());
        } else {
          KV_LOG_INFO("{}: waiting for successor {}", options_.name, succ_desc_);
        }
        logged_wait = true;
      }
      Backoff(&backoff_ms);
      continue;
    }
    auto link = std::make_shared<Link>(std::move(stream).value(), "successor " + succ_desc_);
    {
      std::lock_guard<std::mutex> lock(threads_mu_);
      if (!running_.load()) return;
      all_links_.push_back(link);
    }
    Status s = link->Send(HelloMsg{MyHello()});
    auto reply = s.ok() ? link->Receive() : Result<Message>(s);
    Status ok = reply.status();
    if (ok.ok()) {
      if (auto* e = std::get_if<ErrorMsg>(&*reply)) {
        ok = Error("successor {} refused the link: {}", succ_desc_, e->message);
      } else if (auto* h = std::get_if<HelloMsg>(&*reply)) {
        ok = CheckStageHello(h->hello, false).WithContext("successor " + succ_desc_);
      } else {
        ok = Error("successor {} answered HELLO with {}", succ_desc_, MessageName(*reply));
      }
    }
    if (!ok.ok()) {
      // Once per reason: a refusal repeats on every retry until something changes.
      if (running_.load() && ok.message() != last_refusal) {
        KV_LOG_WARN("{}: {}", options_.name, ok.message());
        last_refusal = ok.message();
      }
      link->Close();
      Backoff(&backoff_ms);
      continue;
    }
    backoff_ms = 100;
    logged_wait = false;
    last_refusal.clear();
    KV_LOG_INFO("{}: link up: successor {}", options_.name, succ_desc_);
    {
      std::lock_guard<std::mutex> lock(links_mu_);
      succ_ = link;
    }
    Event up;
    up.kind = Event::Kind::kSuccUp;
    Push(std::move(up));
    // The successor only sends errors back; read until the link ends.
    while (running_.load()) {
      auto msg = link->Receive();
      if (!msg.ok()) break;
      if (auto* e = std::get_if<ErrorMsg>(&*msg)) {
        KV_LOG_WARN("{}: successor reports: {}", options_.name, e->message);
      }
    }
    link->Close();
    {
      std::lock_guard<std::mutex> lock(links_mu_);
      succ_.reset();
    }
    if (running_.load()) {
      KV_LOG_WARN("{}: link down: successor {}", options_.name, succ_desc_);
      Event e;
      e.kind = Event::Kind::kSuccDown;
      e.reason = "link to successor " + succ_desc_ + " down";
      Push(std::move(e));
    }
  }
}

void StageImpl::PredDialLoop() {
  int backoff_ms = 100;
  std::string last_failure;  // each new reason is logged once, not every retry
  const std::function<bool()> cancelled = [this] { return !running_.load(); };
  while (running_.load()) {
    auto stream = options_.dial_pred(cancelled);
    Status s = stream.status();
    if (stream.ok()) {
      auto link = std::make_shared<Link>(std::move(stream).value(), "via " + options_.pred_via);
      {
        std::lock_guard<std::mutex> lock(threads_mu_);
        if (!running_.load()) return;
        std::erase_if(all_links_, [](const auto& l) { return l->closed(); });
        all_links_.push_back(link);
      }
      // Serve it on this thread: one relayed predecessor connection at a time.
      s = ServeConnection(link);
      link->Close();
      if (s.ok()) {
        backoff_ms = 100;
        last_failure.clear();
      }
    }
    if (!s.ok() && running_.load() && s.message() != last_failure) {
      KV_LOG_INFO("{}: waiting for predecessor: {}", options_.name, s.message());
      last_failure = s.message();
    }
    Backoff(&backoff_ms);
  }
}

bool StageImpl::SendNext(const Message& m) {
  std::shared_ptr<Link> succ;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    succ = succ_;
  }
  if (succ == nullptr) return false;
  const std::vector<uint8_t> frame = EncodeMessage(m);
  if (!succ->SendFrame(frame).ok()) {
    succ->Close();
    return false;
  }
  bytes_out_.fetch_add(frame.size());
  return true;
}

void StageImpl::SendToClient(uint64_t client, const Message& m) {
  std::shared_ptr<Link> link;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    auto it = clients_.find(client);
    if (it != clients_.end()) link = it->second;
  }
  if (link != nullptr && !link->Send(m).ok()) link->Close();
}

wire::StageStats StageImpl::StatsRecord() const {
  wire::StageStats s{};
  std::strncpy(s.name, options_.name.c_str(), sizeof(s.name) - 1);
  s.window_first = options_.first;
  s.window_last = options_.last;
  s.weight_bytes = window_->weight_bytes();
  s.rss_bytes = CurrentRssBytes();
  s.bytes_in = bytes_in_.load();
  s.bytes_out = bytes_out_.load();
  s.rows = rows_.load();
  s.decode_rows = decode_rows_.load();
  s.busy_ns = busy_ns_.load();
  s.decode_busy_ns = decode_busy_ns_.load();
  // Sessions whose CLOSE is on its way around the ring count as closed.
  s.sessions_open = static_cast<uint32_t>(
      std::count_if(sessions_.begin(), sessions_.end(), [](const auto& kv) { return !kv.second.closing; }));
  return s;
}

void StageImpl::LogStats() {
  const wire::StageStats s = StatsRecord();
  KV_LOG_INFO(
      "{}: stats: layers {}:{}, weights {:.1f} MiB, rss {:.1f} MiB, in {} B, out {} B, rows {} "
      "({} decode), busy {:.1f} ms",
      options_.name, s.window_first, s.window_last, s.weight_bytes / 1048576.0,
      s.rss_bytes / 1048576.0, s.bytes_in, s.bytes_out, s.rows, s.decode_rows, s.busy_ns / 1e6);
}

Status StageImpl::Run() {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  dial_thread_ = std::thread([this] { DialLoop(); });
  if (options_.dial_pred) pred_thread_ = std::thread([this] { PredDialLoop(); });
  while (running_.load()) {
    std::deque<Event> batch;
    {
      std::unique_lock<std::mutex> lock(events_mu_);
      const bool idle = decode_work_.empty() && prefill_work_.empty();
      if (events_.empty() && idle) {
        // Wake up periodically to probe the ring while it is not known to be closed.
        events_cv_.wait_for(lock, std::chrono::milliseconds(ring_closed_ ? 1000 : 100));
      }
      batch.swap(events_);
    }
    for (Event& e : batch) HandleEvent(e);
    MaybeProbeRing();
    RunBatch();
  }
  return Status::Ok();
}

}  // namespace kvasir::ring
