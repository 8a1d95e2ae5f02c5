// The checks of a stage's options that need no model (ring/stage.h, CheckStageOptions).
#include <thread>

#include "net/stream.h"
#include "ring/stage.h"
#include "ring/test_fault.h"

namespace kvasir::ring {

Status ParseBoundary(const std::string& text, wire::Dtype* dtype) {
  if (text == "f32") {
    *dtype = wire::Dtype::kF32;
  } else if (text == "f16") {
    *dtype = wire::Dtype::kF16;
  } else if (text == "bf16") {
    *dtype = wire::Dtype::kBF16;
  } else {
    return Error("--boundary '{}' is not one of f32, f16, bf16", text);
  }
  return Status::Ok();
}

Status CheckStageOptions(const StageOptions& opt) {
  if (opt.chunk < 1) return Error("--chunk {} must be at least 1", opt.chunk);
  if (opt.max_sessions < 1) return Error("--max-sessions {} must be at least 1", opt.max_sessions);
  if (opt.max_clients < 1) return Error("--max-clients {} must be at least 1", opt.max_clients);
  if (opt.n_threads < 1) return Error("-t {} must be at least 1", opt.n_threads);
  if (const unsigned hw = std::thread::hardware_concurrency(); hw > 0 && opt.n_threads > int(hw)) {
    return Error("-t {}: this machine has {} hardware threads", opt.n_threads, hw);
  }
  if (opt.link_timeout_ms < 100) {
    return Error("--link-timeout {} ms is too short (at least 100 ms)", opt.link_timeout_ms);
  }
  if (opt.handshake_timeout_ms < 100 || opt.pressure_handshake_timeout_ms < 100 ||
      opt.pressure_handshake_timeout_ms > opt.handshake_timeout_ms) {
    return Error(
        "handshake deadlines of {} ms ({} ms under pressure) must be at least 100 ms, the "
        "second no longer than the first",
        opt.handshake_timeout_ms, opt.pressure_handshake_timeout_ms);
  }
  if (opt.max_pending_per_address < 1 || opt.pending_reserved < 0 ||
      opt.max_pending <= opt.pending_reserved) {
    return Error(
        "handshake slots: {} in all, {} reserved, {} per address: need more slots than "
        "reserved ones and at least 1 per address",
        opt.max_pending, opt.pending_reserved, opt.max_pending_per_address);
  }
  KV_RETURN_IF_ERROR(CheckTestFaultNoise(opt.test_fault_noise));
  if (opt.repair_timeout_ms < 0 || opt.repair_timeout_ms > 3600000) {
    return Error("--repair-timeout {} ms must be from 0 to 3600 s", opt.repair_timeout_ms);
  }
  if (opt.standby && opt.first == 0) {
    return Error(
        "--standby: the head's window (layer 0) has no standby: clients hold the head's address "
        "and the head holds the sessions' tokens");
  }
  std::string host;
  uint16_t port = 0;
  if (!opt.dial_next) {
    KV_RETURN_IF_ERROR(net::ParseHostPort(opt.next, &host, &port).WithContext("--next"));
  } else if (!opt.standby_peers.empty()) {
    return Error("--standby-peers needs --next: a relayed successor has one address");
  }
  for (const std::string& peer : opt.standby_peers) {
    KV_RETURN_IF_ERROR(net::ParseHostPort(peer, &host, &port).WithContext("--standby-peers"));
  }
  // An inherited listener is checked by the address it was bound to, once that is known.
  if (opt.listen_fd < 0 || !opt.listen.empty()) {
    KV_RETURN_IF_ERROR(net::ParseHostPort(opt.listen, &host, &port).WithContext("--listen"));
    if (opt.insecure && !net::IsLoopbackHost(host)) {
      return Error("--insecure stages listen on loopback only (127.0.0.1 or ::1), not {}",
                   opt.listen);
    }
  }
  if (opt.key == nullptr) return Error("the stage has no node key");
  if (!opt.insecure && opt.ring_secret.empty()) {
    if (!opt.pred_key.has_value() || !opt.succ_key.has_value()) {
      return Error(StatusCode::kUnauthenticated,
                   "nothing to authenticate the {} with: give --ring-secret-file F (the same file "
                   "on every stage), a manifest whose ranks carry node_key, or --insecure "
                   "(loopback only)",
                   opt.pred_key.has_value() ? "successor" : "predecessor");
    }
  }
  return Status::Ok();
}

}  // namespace kvasir::ring
