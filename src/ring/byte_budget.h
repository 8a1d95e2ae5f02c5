// The bytes a stage holds for peers that have proven nothing (a head's anonymous clients), under
// one total (docs/PROTOCOL.md, "Limits"). Every buffer of a client link is charged to the link's
// account before it grows and released when it shrinks. When a charge would pass the total, the
// accounts that have held bytes the longest without once being empty (a client dripping a record,
// a client that stopped reading) are dropped first to make room; a charge that cannot be met even
// so fails, and its link is the one that closes.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace kvasir::ring {

class ByteBudget;

// One link's share of a ByteBudget. Thread-safe: the link's reader, its writer and the stage's
// compute thread charge and release it concurrently.
class ByteAccount {
 public:
  ~ByteAccount();  // gives back whatever it still holds
  ByteAccount(const ByteAccount&) = delete;
  ByteAccount& operator=(const ByteAccount&) = delete;

  // Takes `n` more bytes, before they are allocated. False when the budget has no room even after
  // dropping every account that has held bytes longer than this one, or when this account was
  // itself dropped: the caller then fails its link. Call it with no lock of the link held (a
  // dropped account's link is closed from here).
  bool Charge(size_t n);
  void Release(size_t n);
  size_t held() const;
  bool dropped() const;

  // Messages of this link read and not yet handled by the stage (see ByteCharge).
  size_t messages() const;
  // Waits until fewer than `max` messages are outstanding, or `ms` pass.
  void WaitMessagesBelow(size_t max, int ms);

 private:
  friend class ByteBudget;
  friend class ByteCharge;
  ByteAccount(std::shared_ptr<ByteBudget> budget, std::function<void(size_t)> drop);
  void MessageStarted();
  void MessageDone();

  std::shared_ptr<ByteBudget> budget_;
  std::function<void(size_t held)> drop_;
  // Guarded by the budget's mutex.
  size_t held_ = 0;
  bool dropped_ = false;
  uint64_t since_ = 0;  // the budget's count of accounts that started holding when this one did
  size_t messages_ = 0;
  std::condition_variable messages_cv_;
};

// `bytes` of an account held by one message on its way to the stage's compute thread; released,
// and the message counted as handled, when this is destroyed. Movable; empty by default.
class ByteCharge {
 public:
  ByteCharge() = default;
  // Charges `bytes` to `account` for one message. Empty (and nothing charged) when the charge
  // fails: see ByteAccount::Charge.
  static ByteCharge ForMessage(std::shared_ptr<ByteAccount> account, size_t bytes);
  ByteCharge(ByteCharge&& other) noexcept;
  ByteCharge& operator=(ByteCharge&& other) noexcept;
  ByteCharge(const ByteCharge&) = delete;
  ByteCharge& operator=(const ByteCharge&) = delete;
  ~ByteCharge() { Reset(); }
  explicit operator bool() const { return account_ != nullptr; }
  void Reset();

 private:
  std::shared_ptr<ByteAccount> account_;
  size_t bytes_ = 0;
};

class ByteBudget : public std::enable_shared_from_this<ByteBudget> {
 public:
  static std::shared_ptr<ByteBudget> Create(size_t limit);

  // A new, empty account. `drop` closes its link when the budget drops it to make room: it is
  // called at most once, on the thread whose charge needed the room, with the budget's lock not
  // held, and with the bytes the account held.
  std::shared_ptr<ByteAccount> Open(std::function<void(size_t held)> drop);

  size_t limit() const { return limit_; }
  size_t held() const;
  uint64_t drops() const;

 private:
  friend class ByteAccount;
  explicit ByteBudget(size_t limit) : limit_(limit) {}
  bool Charge(ByteAccount* a, size_t n);
  void Release(ByteAccount* a, size_t n);
  void Close(ByteAccount* a);

  const size_t limit_;
  mutable std::mutex mu_;
  size_t held_ = 0;  // charged to accounts that were not dropped
  uint64_t drops_ = 0;
  uint64_t starts_ = 0;  // accounts that went from holding nothing to holding something
  std::set<ByteAccount*> accounts_;
};

// Grows `v`'s capacity to exactly `n` bytes (when it has less), charging the difference to
// `account` first when there is one. False, with `v` unchanged, when the charge fails.
bool ReserveCharged(std::vector<uint8_t>* v, size_t n, ByteAccount* account);
// Frees `v`'s memory and gives its capacity back to `account`.
void FreeCharged(std::vector<uint8_t>* v, ByteAccount* account);

}  // namespace kvasir::ring
