#include "net/admission.h"

#include <arpa/inet.h>
#include <fmt/format.h>

#include <cstring>
#include <tuple>

#include "base/check.h"

namespace kvasir::net {

const char* StageName(Stage stage) {
  switch (stage) {
    case Stage::kClosing: return "closing";
    case Stage::kIdle: return "idle";
    case Stage::kSilent: return "silent";
    case Stage::kReading: return "reading";
    case Stage::kWriting: return "writing";
    case Stage::kWaiting: return "waiting";
    case Stage::kHandling: return "handling";
  }
  return "?";
}

const char* PoolName(Pool pool) { return pool == Pool::kOpen ? "open" : "proven"; }

Status ValidatePolicy(const AdmissionPolicy& p) {
  for (Pool pool : {Pool::kOpen, Pool::kProven}) {
    const PoolLimits& l = pool == Pool::kOpen ? p.open : p.proven;
    if (l.max_total < 1 || l.max_per_address < 1) {
      return Error(
          "{} pool: the connection limits must be at least 1 (got {} per address, {} in all)",
          PoolName(pool), l.max_per_address, l.max_total);
    }
    if (l.pressure_from < 1 || l.pressure_from > l.max_total) {
      return Error("{} pool: pressure from {} connections: must be from 1 to the pool's {}",
                   PoolName(pool), l.pressure_from, l.max_total);
    }
  }
  for (int s = 0; s < kStageCount; ++s) {
    const StageTimeout& t = p.timeouts[s];
    if (t.normal_ms < 0 || t.pressed_ms < 0) {
      return Error("stage {}: deadlines must not be negative (got {} ms, {} ms under pressure)",
                   StageName(static_cast<Stage>(s)), t.normal_ms, t.pressed_ms);
    }
  }
  return Status::Ok();
}

std::string AdmissionKey(std::string_view ip) {
  const std::string text(ip);
  in6_addr a6{};
  if (::inet_pton(AF_INET6, text.c_str(), &a6) != 1) return text;  // IPv4, or not an address
  static constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(a6.s6_addr, kMappedPrefix, sizeof(kMappedPrefix)) == 0) {
    return fmt::format("{}.{}.{}.{}", a6.s6_addr[12], a6.s6_addr[13], a6.s6_addr[14],
                       a6.s6_addr[15]);
  }
  in6_addr prefix{};
  std::memcpy(prefix.s6_addr, a6.s6_addr, 8);
  char buf[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET6, &prefix, buf, sizeof(buf));
  return std::string(buf) + "/64";
}

int AdmissionTable::CountFrom(Pool pool, const std::string& address) const {
  const auto& per = pools_[static_cast<int>(pool)].per_address;
  auto it = per.find(address);
  return it == per.end() ? 0 : it->second;
}

bool AdmissionTable::Pressed(Pool pool) const { return Count(pool) >= Limits(pool).pressure_from; }

std::optional<Pool> AdmissionTable::PoolOf(ConnId id) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.pool;
}

std::optional<Stage> AdmissionTable::StageOf(ConnId id) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.stage;
}

std::optional<Millis> AdmissionTable::DeadlineOf(ConnId id) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  const Entry& e = it->second;
  const StageTimeout& t = policy_.timeout(e.stage);
  const int ms = Pressed(e.pool) && t.pressed_ms > 0 ? t.pressed_ms : t.normal_ms;
  if (ms == 0 || e.stage == Stage::kHandling) return std::nullopt;
  return e.since + ms;
}

void AdmissionTable::Count(Pool pool, const std::string& address, int delta) {
  PoolState& ps = pools_[static_cast<int>(pool)];
  ps.total += delta;
  int& n = ps.per_address[address];
  n += delta;
  KV_CHECK(ps.total >= 0 && n >= 0, "admission: negative count in the {} pool", PoolName(pool));
  if (n == 0) ps.per_address.erase(address);
}

bool AdmissionTable::MakeRoom(Pool pool, const std::string& address, Admission* out) {
  const PoolLimits& limits = Limits(pool);
  const int mine = CountFrom(pool, address);
  if (mine >= limits.max_per_address) {
    out->why = fmt::format("{} holds {} connections in the {} pool, the most one address may",
                           address, mine, PoolName(pool));
    return false;
  }
  if (Count(pool) < limits.max_total) return true;
  // Full. The victim: of the addresses holding at least two more than this one, the one holding
  // the most; of its connections the most evictable stage, then the oldest.
  const std::unordered_map<ConnId, Entry>::iterator none = entries_.end();
  auto victim = none;
  std::tuple<int, int, Millis> best{0, 0, 0};  // (count, -stage, -since): larger is evicted first
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const Entry& e = it->second;
    if (e.pool != pool || e.stage == Stage::kHandling) continue;
    const int count = CountFrom(pool, e.address);
    if (count < mine + 2) continue;
    const std::tuple<int, int, Millis> key{count, -static_cast<int>(e.stage), -e.since};
    if (victim == none || key > best) {
      victim = it;
      best = key;
    }
  }
  if (victim == none) {
    out->why = fmt::format(
        "the {} pool is full ({} connections) and no address holds two more "
        "than {} ({})",
        PoolName(pool), Count(pool), address, mine);
    return false;
  }
  out->evicted = victim->first;
  out->evicted_address = victim->second.address;
  Count(pool, victim->second.address, -1);
  entries_.erase(victim);
  return true;
}

Admission AdmissionTable::Admit(ConnId id, const std::string& address, Millis now) {
  KV_CHECK(entries_.count(id) == 0, "admission: connection {} admitted twice", id);
  Admission a;
  if (!MakeRoom(Pool::kOpen, address, &a)) return a;
  a.admitted = true;
  entries_[id] = Entry{address, Pool::kOpen, Stage::kSilent, now};
  Count(Pool::kOpen, address, +1);
  return a;
}

Admission AdmissionTable::Promote(ConnId id) {
  Admission a;
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    a.why = "not in the table";
    return a;
  }
  if (it->second.pool == Pool::kProven) {
    a.admitted = true;
    return a;
  }
  const std::string address = it->second.address;
  if (!MakeRoom(Pool::kProven, address, &a)) return a;
  // MakeRoom may have erased another entry, never this one (it is in the other pool).
  it = entries_.find(id);
  Count(Pool::kOpen, address, -1);
  Count(Pool::kProven, address, +1);
  it->second.pool = Pool::kProven;
  a.admitted = true;
  return a;
}

void AdmissionTable::SetStage(ConnId id, Stage stage, Millis now, bool restart_clock) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  it->second.stage = stage;
  if (restart_clock) it->second.since = now;
}

void AdmissionTable::Remove(ConnId id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Count(it->second.pool, it->second.address, -1);
  entries_.erase(it);
}

std::vector<AdmissionTable::Expired> AdmissionTable::TakeExpired(Millis now) {
  std::vector<Expired> out;
  for (const auto& [id, e] : entries_) {
    const std::optional<Millis> deadline = DeadlineOf(id);
    if (deadline && now >= *deadline) out.push_back({id, e.stage, e.pool});
  }
  for (const Expired& x : out) Remove(x.id);
  return out;
}

}  // namespace kvasir::net
