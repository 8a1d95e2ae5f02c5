// A stand-in for a claim's holder on 127.0.0.1: it answers the ring handshake with a node key of
// its choosing (the right one, or an impostor's), and as a head it answers a client's HELLO with a
// model and a window of its choosing; or it accepts and says nothing. For the market's checks
// (ring_check.h) and for joiners that dial a neighbour.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "net/stream.h"
#include "ring/handshake.h"
#include "ring/link.h"
#include "ring/secure_stream.h"

namespace kvasir::testing {

class FakeHolder {
 public:
  enum class Mode { kAnswer, kSilent };
  struct Options {
    ring::NodeKey key;
    Mode mode = Mode::kAnswer;
    bool head = false;
    std::array<uint8_t, 16> model_id{};
    int first = 0, last = 2;
  };
  explicit FakeHolder(Options o) : o_(std::move(o)) {
    auto l = net::Listener::Bind("127.0.0.1", 0);
    EXPECT_TRUE(l.ok()) << l.status().message();
    listener_.emplace(std::move(l).value());
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeHolder() {
    listener_->Close();
    thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : held_) s->Shutdown();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(listener_->port()); }
  int handshakes() const { return handshakes_.load(); }
  int refused() const { return refused_.load(); }  // handshakes the peer broke off
  std::string last_error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_.empty() ? std::string() : errors_.back();
  }
  // Handshakes that failed with an error containing `text`.
  int ErrorsContaining(const std::string& text) const {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const std::string& e : errors_) n += e.find(text) != std::string::npos ? 1 : 0;
    return n;
  }

 private:
  void Loop() {
    auto key = std::make_shared<const ring::NodeKey>(o_.key);
    while (true) {
      auto s = listener_->Accept();
      if (!s.ok()) return;
      std::unique_ptr<net::Stream> stream = std::move(s).value();
      if (o_.mode == Mode::kSilent) {
        std::lock_guard<std::mutex> lock(mu_);
        held_.push_back(std::move(stream));  // open, and never a byte
        continue;
      }
      ring::LinkAuth stage_auth;
      stage_auth.key = key;
      stage_auth.insecure = true;  // any initiator: what is under test is what it demands of us
      ring::LinkAuth client_auth;
      client_auth.key = key;
      auto hs = ring::HandshakeRespond(*stream, stage_auth, client_auth);
      ++handshakes_;
      if (!hs.ok()) {
        ++refused_;
        std::lock_guard<std::mutex> lock(mu_);
        errors_.push_back(hs.status().message());
        continue;
      }
      if (!o_.head) continue;  // dropped: the handshake is all a non-head check asks
      ring::Link link(std::make_unique<ring::SecureStream>(std::move(stream), hs->tx, hs->rx, 4096),
                      "checker", ring::LinkOptions{});
      link.SetReceiveDeadline(5000);
      auto hello = link.Receive();
      if (!hello.ok()) continue;
      wire::Hello h{};
      h.protocol_version = wire::kProtocolVersion;
      h.role = static_cast<uint32_t>(wire::Role::kStage);
      std::memcpy(h.model_id, o_.model_id.data(), sizeof(h.model_id));
      h.window_first = o_.first;
      h.window_last = o_.last;
      (void)link.Send(ring::HelloMsg{h});
      link.SetReceiveDeadline(2000);
      (void)link.Receive();  // until the checker closes
    }
  }

  Options o_;
  std::optional<net::Listener> listener_;
  std::thread thread_;
  std::atomic<int> handshakes_{0}, refused_{0};
  mutable std::mutex mu_;
  std::vector<std::string> errors_;
  std::vector<std::unique_ptr<net::Stream>> held_;
};

}  // namespace kvasir::testing
