#include "ring/secure_stream.h"

#include <cstring>

namespace kvasir::ring {
namespace {

constexpr size_t kHeaderBytes = crypto_secretstream_xchacha20poly1305_HEADERBYTES;
constexpr size_t kTagBytes = crypto_secretstream_xchacha20poly1305_ABYTES;
constexpr size_t kMinRead = 4 * 1024;     // the first buffer for bytes that arrived
constexpr size_t kMaxRead = 256 * 1024;   // at most this much read ahead of what is needed
constexpr size_t kKeepBuffer = 1 << 20;   // without an account, buffers above this are freed
constexpr size_t kSmallRecord = 2048;     // sealed on the stack

}  // namespace

SecureStream::SecureStream(std::unique_ptr<net::Stream> inner, const SessionKey& tx,
                           const SessionKey& rx, size_t max_record,
                           std::shared_ptr<ByteAccount> account)
    : inner_(std::move(inner)),
      max_record_(max_record),
      account_(std::move(account)),
      tx_key_(tx),
      rx_key_(rx) {
  InitCrypto();
}

SecureStream::~SecureStream() {
  sodium_memzero(tx_key_.data(), tx_key_.size());
  sodium_memzero(rx_key_.data(), rx_key_.size());
  sodium_memzero(&push_, sizeof(push_));
  sodium_memzero(&pull_, sizeof(pull_));
  for (auto* v : {&out_, &raw_, &plain_}) FreeCharged(v, account_.get());
}

Status SecureStream::Grow(std::vector<uint8_t>* v, size_t n) {
  if (!ReserveCharged(v, n, account_.get())) {
    return Error(StatusCode::kTooLarge,
                 "{}: dropped: the stage's buffers for unauthenticated peers are full", peer());
  }
  v->resize(n);
  return Status::Ok();
}

void SecureStream::Trim(std::vector<uint8_t>* v) {
  if (account_ != nullptr || v->capacity() > kKeepBuffer) FreeCharged(v, account_.get());
}

Status SecureStream::WriteAll(std::span<const uint8_t> bytes) {
  if (bytes.size() > max_record_) {
    return Error(StatusCode::kTooLarge, "{}: a {}-byte record exceeds the {}-byte limit", peer(),
                 bytes.size(), max_record_);
  }
  const size_t head = header_sent_ ? 0 : kHeaderBytes;
  const uint32_t len = static_cast<uint32_t>(bytes.size() + kTagBytes);
  const size_t total = head + sizeof(len) + len;
  // Small records (tokens, errors) are sealed on the stack: nothing to charge, so a dropped
  // client still gets the ERROR that says why.
  uint8_t small[kSmallRecord];
  std::span<uint8_t> out(small, total);
  if (total > kSmallRecord) {
    out_.clear();
    KV_RETURN_IF_ERROR(Grow(&out_, total));
    out = out_;
  }
  if (!header_sent_) {
    crypto_secretstream_xchacha20poly1305_init_push(&push_, out.data(), tx_key_.data());
    header_sent_ = true;
  }
  std::memcpy(out.data() + head, &len, sizeof(len));
  crypto_secretstream_xchacha20poly1305_push(&push_, out.data() + head + sizeof(len), nullptr,
                                             bytes.data(), bytes.size(), nullptr, 0,
                                             crypto_secretstream_xchacha20poly1305_TAG_MESSAGE);
  Status s = inner_->WriteAll(out);
  if (total > kSmallRecord) Trim(&out_);
  return s;
}

Status SecureStream::Fill(size_t n) {
  if (raw_end_ - raw_pos_ >= n) return Status::Ok();
  // Move the unread tail to the front.
  if (raw_pos_ > 0) {
    std::memmove(raw_.data(), raw_.data() + raw_pos_, raw_end_ - raw_pos_);
    raw_end_ -= raw_pos_;
    raw_pos_ = 0;
  }
  while (raw_end_ < n) {
    size_t got = 0;
    if (raw_.empty()) {
      // Nothing held: wait for bytes before allocating anything (an idle client holds nothing).
      uint8_t first[kMinRead];
      KV_ASSIGN_OR_RETURN(got, inner_->ReadSome(std::span<uint8_t>(first, kMinRead)));
      if (got > 0) {
        KV_RETURN_IF_ERROR(Grow(&raw_, kMinRead));
        std::memcpy(raw_.data(), first, got);
      }
    } else {
      if (raw_end_ == raw_.size()) {
        // Room for more only as bytes arrive: at most double what has arrived (and at most a
        // bounded read-ahead past what is needed), whatever the record's header announced.
        KV_RETURN_IF_ERROR(Grow(&raw_, std::min(raw_.size() * 2, n + kMaxRead)));
      }
      KV_ASSIGN_OR_RETURN(got, inner_->ReadSome(std::span<uint8_t>(raw_).subspan(raw_end_)));
    }
    if (got == 0) {
      if (raw_end_ == 0) return Error(StatusCode::kEndOfStream, "{}: peer closed the connection",
                                      peer());
      return Error(StatusCode::kUnavailable, "{}: connection closed in the middle of a record",
                   peer());
    }
    raw_end_ += got;
  }
  return Status::Ok();
}

Status SecureStream::ReadRecord() {
  if (!header_read_) {
    KV_RETURN_IF_ERROR(Fill(kHeaderBytes));
    if (crypto_secretstream_xchacha20poly1305_init_pull(&pull_, raw_.data() + raw_pos_,
                                                        rx_key_.data()) != 0) {
      return Error(StatusCode::kUnauthenticated, "{}: bad encrypted stream header", peer());
    }
    raw_pos_ += kHeaderBytes;
    header_read_ = true;
  }
  KV_RETURN_IF_ERROR(Fill(sizeof(uint32_t)));
  uint32_t len;
  std::memcpy(&len, raw_.data() + raw_pos_, sizeof(len));
  if (len < kTagBytes) {
    return Error("{}: encrypted record of {} bytes is shorter than its {}-byte tag", peer(), len,
                 kTagBytes);
  }
  if (len - kTagBytes > max_record_) {
    return Error(StatusCode::kTooLarge,
                 "{}: a record of {} bytes exceeds the {}-byte limit of this link", peer(),
                 len - kTagBytes, max_record_);
  }
  KV_RETURN_IF_ERROR(Fill(sizeof(len) + len));
  KV_RETURN_IF_ERROR(Grow(&plain_, len - kTagBytes));
  plain_pos_ = 0;
  unsigned long long plain_len = 0;
  unsigned char tag = 0;
  if (crypto_secretstream_xchacha20poly1305_pull(&pull_, plain_.data(), &plain_len, &tag,
                                                 raw_.data() + raw_pos_ + sizeof(len), len,
                                                 nullptr, 0) != 0) {
    return Error(StatusCode::kUnauthenticated,
                 "{}: an encrypted record failed authentication (altered, replayed or out of order)",
                 peer());
  }
  raw_pos_ += sizeof(len) + len;
  plain_.resize(plain_len);
  if (raw_pos_ == raw_end_) {
    raw_pos_ = raw_end_ = 0;
    Trim(&raw_);
  }
  return Status::Ok();
}

Result<size_t> SecureStream::ReadSome(std::span<uint8_t> buffer) {
  if (!error_.ok()) return error_;
  while (plain_pos_ == plain_.size()) {
    Trim(&plain_);
    plain_.clear();
    plain_pos_ = 0;
    if (Status s = ReadRecord(); !s.ok()) {
      if (s.code() == StatusCode::kEndOfStream) return size_t{0};
      // A transport's read deadline leaves the record half read, to be continued.
      if (s.code() != StatusCode::kTimeout) error_ = s;
      return s;
    }
  }
  const size_t n = std::min(buffer.size(), plain_.size() - plain_pos_);
  std::memcpy(buffer.data(), plain_.data() + plain_pos_, n);
  plain_pos_ += n;
  return n;
}

}  // namespace kvasir::ring
