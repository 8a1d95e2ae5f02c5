// The connections a stage has accepted that are still in their handshake (docs/PROTOCOL.md,
// "Limits"). Nobody in it has proven anything, so a few addresses must not be able to fill it:
// - an address (an IPv4 address, or an IPv6 /64) holds at most `per_address` slots;
// - `reserved` of the slots are kept for the addresses a predecessor came from (Expect());
// - a full table makes room for a newcomer by closing the oldest connection of the address that
//   holds the most slots, so a flood from some addresses cannot keep out the others;
// - once half the slots are taken, every handshake not from an expected address must finish
//   within the short deadline instead of the normal one.
// Pure bookkeeping: the stage closes the connections it is told to. Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace kvasir::ring {

class PendingTable {
 public:
  using Clock = std::chrono::steady_clock;
  struct Limits {
    int slots = 64;
    int per_address = 8;
    int reserved = 8;  // of `slots`, only for expected addresses
    std::chrono::milliseconds deadline{5000};
    std::chrono::milliseconds pressure_deadline{1000};
  };
  struct Admission {
    bool admitted = false;
    uint64_t id = 0;                // when admitted: Remove(id) when its handshake ends
    std::vector<uint64_t> evicted;  // connections to close now to make room
    std::string refusal;            // when not admitted: why, for the refusal message
  };

  explicit PendingTable(Limits limits);

  // A connection from `address` (numeric, as the listener reports it) arrived at `now`.
  Admission Admit(const std::string& address, Clock::time_point now);
  // Its handshake ended (either way), or it was evicted or expired. Unknown ids are ignored.
  void Remove(uint64_t id);
  // The connections whose handshake deadline has passed at `now`.
  std::vector<uint64_t> Expired(Clock::time_point now) const;
  // A predecessor came from `address`: its next connections may use the reserved slots and keep
  // the normal deadline. The last few such addresses are remembered.
  void Expect(const std::string& address);

  size_t size() const { return entries_.size(); }
  bool under_pressure() const { return 2 * entries_.size() >= static_cast<size_t>(limits_.slots); }
  // The key an address is counted under: IPv4 addresses (also IPv4-mapped IPv6) as they are,
  // other IPv6 addresses by their /64, anything unparsable as it is.
  static std::string AddressKey(const std::string& address);

 private:
  struct Entry {
    std::string key;
    Clock::time_point start;
    bool expected = false;
  };
  bool IsExpected(const std::string& key) const;

  Limits limits_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Entry> entries_;  // by id, so oldest first
  std::map<std::string, int> per_key_;
  std::deque<std::string> expected_;   // keys, newest last
};

}  // namespace kvasir::ring
