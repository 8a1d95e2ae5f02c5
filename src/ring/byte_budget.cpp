#include "ring/byte_budget.h"

#include <algorithm>

namespace kvasir::ring {

std::shared_ptr<ByteBudget> ByteBudget::Create(size_t limit) {
  return std::shared_ptr<ByteBudget>(new ByteBudget(limit));
}

std::shared_ptr<ByteAccount> ByteBudget::Open(std::function<void(size_t)> drop) {
  auto a = std::shared_ptr<ByteAccount>(new ByteAccount(shared_from_this(), std::move(drop)));
  std::lock_guard<std::mutex> lock(mu_);
  accounts_.insert(a.get());
  return a;
}

size_t ByteBudget::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

uint64_t ByteBudget::drops() const {
  std::lock_guard<std::mutex> lock(mu_);
  return drops_;
}

bool ByteBudget::Charge(ByteAccount* a, size_t n) {
  struct Dropped {
    std::function<void(size_t)> fn;
    size_t held;
  };
  std::vector<Dropped> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (a->dropped_) return false;
    if (n > limit_) return false;
    if (held_ + n > limit_) {
      // Only accounts that have held bytes longer than this one may be dropped for it: a client
      // that is itself the longest holder is the one that gives way.
      const uint64_t mine = a->held_ > 0 ? a->since_ : starts_ + 1;
      std::vector<ByteAccount*> older;
      for (ByteAccount* c : accounts_) {
        if (c != a && !c->dropped_ && c->held_ > 0 && c->since_ < mine) older.push_back(c);
      }
      std::sort(older.begin(), older.end(),
                [](const ByteAccount* x, const ByteAccount* y) { return x->since_ < y->since_; });
      size_t freed = 0, count = 0;
      while (count < older.size() && held_ - freed + n > limit_) freed += older[count++]->held_;
      if (held_ - freed + n > limit_) return false;
      for (size_t i = 0; i < count; ++i) {
        ByteAccount* c = older[i];
        c->dropped_ = true;
        held_ -= c->held_;
        ++drops_;
        dropped.push_back({std::move(c->drop_), c->held_});
        c->messages_cv_.notify_all();
      }
    }
    if (a->held_ == 0) a->since_ = ++starts_;
    a->held_ += n;
    held_ += n;
  }
  for (Dropped& d : dropped) {
    if (d.fn) d.fn(d.held);
  }
  return true;
}

void ByteBudget::Release(ByteAccount* a, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  n = std::min(n, a->held_);
  a->held_ -= n;
  if (!a->dropped_) held_ -= n;
}

void ByteBudget::Close(ByteAccount* a) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!a->dropped_) held_ -= a->held_;
  a->held_ = 0;
  accounts_.erase(a);
}

ByteAccount::ByteAccount(std::shared_ptr<ByteBudget> budget, std::function<void(size_t)> drop)
    : budget_(std::move(budget)), drop_(std::move(drop)) {}

ByteAccount::~ByteAccount() { budget_->Close(this); }

bool ByteAccount::Charge(size_t n) { return n == 0 || budget_->Charge(this, n); }

void ByteAccount::Release(size_t n) {
  if (n > 0) budget_->Release(this, n);
}

size_t ByteAccount::held() const {
  std::lock_guard<std::mutex> lock(budget_->mu_);
  return held_;
}

bool ByteAccount::dropped() const {
  std::lock_guard<std::mutex> lock(budget_->mu_);
  return dropped_;
}

size_t ByteAccount::messages() const {
  std::lock_guard<std::mutex> lock(budget_->mu_);
  return messages_;
}

void ByteAccount::WaitMessagesBelow(size_t max, int ms) {
  std::unique_lock<std::mutex> lock(budget_->mu_);
  messages_cv_.wait_for(lock, std::chrono::milliseconds(ms),
                        [&] { return messages_ < max || dropped_; });
}

void ByteAccount::MessageStarted() {
  std::lock_guard<std::mutex> lock(budget_->mu_);
  ++messages_;
}

void ByteAccount::MessageDone() {
  std::lock_guard<std::mutex> lock(budget_->mu_);
  if (messages_ > 0) --messages_;
  messages_cv_.notify_all();
}

ByteCharge ByteCharge::ForMessage(std::shared_ptr<ByteAccount> account, size_t bytes) {
  ByteCharge c;
  if (account == nullptr || !account->Charge(bytes)) return c;
  account->MessageStarted();
  c.account_ = std::move(account);
  c.bytes_ = bytes;
  return c;
}

ByteCharge::ByteCharge(ByteCharge&& other) noexcept
    : account_(std::move(other.account_)), bytes_(other.bytes_) {
  other.bytes_ = 0;
}

ByteCharge& ByteCharge::operator=(ByteCharge&& other) noexcept {
  if (this != &other) {
    Reset();
    account_ = std::move(other.account_);
    bytes_ = other.bytes_;
    other.bytes_ = 0;
  }
  return *this;
}

void ByteCharge::Reset() {
  if (account_ == nullptr) return;
  account_->Release(bytes_);
  account_->MessageDone();
  account_.reset();
  bytes_ = 0;
}

bool ReserveCharged(std::vector<uint8_t>* v, size_t n, ByteAccount* account) {
  const size_t have = v->capacity();
  if (n <= have) return true;
  if (account != nullptr && !account->Charge(n - have)) return false;
  v->reserve(n);  // allocates exactly n (libstdc++), so the capacity is what was charged
  return true;
}

void FreeCharged(std::vector<uint8_t>* v, ByteAccount* account) {
  const size_t have = v->capacity();
  std::vector<uint8_t>().swap(*v);
  if (account != nullptr) account->Release(have);
}

}  // namespace kvasir::ring
