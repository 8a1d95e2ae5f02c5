#include "market/joiner.h"

#include <fmt/format.h>

#include <filesystem>
#include <system_error>
#include <thread>
#include <utility>

#include "base/human.h"
#include "base/log.h"
#include "market/joiner_impl.h"

namespace kvasir::market {

Joiner::Joiner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Joiner::~Joiner() { Stop(); }

Result<std::unique_ptr<Joiner>> Joiner::Create(JoinOptions o) {
  if (o.key == nullptr) return Error("join: a node key is required");
  if (o.memory_bytes == 0) return Error("join: --memory must be more than 0");
  if (o.cache_dir.empty()) return Error("join: a cache directory is required");
  if (o.poll_s <= 0) return Error("join: the poll interval must be positive");
  auto impl = std::make_unique<Impl>();
  net::HttpRequestOptions http;
  http.ca_file = o.ca_file;
  KV_ASSIGN_OR_RETURN(MarketClient c, MarketClient::Create(o.market_url, o.key, http));
  impl->client.emplace(std::move(c));
  if (!o.advertise.empty()) {
    std::string host;
    uint16_t port = 0;
    if (Status s = net::ParseHostPort(o.advertise, &host, &port); !s.ok()) {
      return Error("--advertise {}: {}", o.advertise, s.message());
    }
  }
  std::string host;
  uint16_t port = 0;
  KV_RETURN_IF_ERROR(net::ParseHostPort(o.behind_nat ? "127.0.0.1:0" : o.listen, &host, &port));
  KV_ASSIGN_OR_RETURN(net::Listener l, net::Listener::Bind(host, port));
  impl->listener.emplace(std::move(l));
  std::error_code ec;
  std::filesystem::create_directories(o.cache_dir, ec);
  if (ec) return Error("{}: cannot create the cache directory: {}", o.cache_dir, ec.message());
  impl->o = std::move(o);
  impl->rows = std::make_shared<ring::RowStore>(impl->o.reveal);
  return std::unique_ptr<Joiner>(new Joiner(std::move(impl)));
}

Status Joiner::Run() {
  Impl& im = *impl_;
  KV_LOG_INFO("join: node {} joins {} ({}, memory {})", ring::ShortKey(im.o.key->public_key()),
              im.client->url(),
              im.o.behind_nat ? "behind NAT: links through the relay"
                              : fmt::format("listening on port {}", im.listener->port()),
              HumanBytes(im.o.memory_bytes));
  std::thread receipts([&im] { im.ReceiptLoop(); });
  while (!im.stopping) {
    auto grant = im.FindAndClaim();
    if (!grant.ok()) {
      if (!im.stopping) {
        KV_LOG_WARN("join: {}", grant.status().message());
        im.Sleep(im.o.poll_s);
      }
      continue;
    }
    im.ServeClaim(*grant);
    if (!im.stopping) im.Sleep(std::min(1.0, im.o.poll_s));
  }
  im.cv.notify_all();
  receipts.join();
  KV_LOG_INFO("join: left the network");
  return Status::Ok();
}

void Joiner::Stop() {
  if (impl_ == nullptr) return;
  impl_->stopping = true;
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->cv.notify_all();
}

uint16_t Joiner::port() const { return impl_->listener->port(); }

JoinState Joiner::state() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->state;
}

}  // namespace kvasir::market
