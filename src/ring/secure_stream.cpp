#include "ring/secure_stream.h"

#include <cstring>

namespace kvasir::ring {
namespace {

constexpr size_t kHeaderBytes = crypto_secretstream_xchacha20poly1305_HEADERBYTES;
constexpr size_t kTagBytes = crypto_secretstream_xchacha20poly1305_ABYTES;
constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kKeepBuffer = 1 << 20;  // buffers above this are released after use

}  // namespace

SecureStream::SecureStream(std::unique_ptr<net::Stream> inner, const SessionKey& tx,
                           const SessionKey& rx, size_t max_record)
    : inner_(std::move(inner)), max_record_(max_record), tx_key_(tx), rx_key_(rx) {
  InitCrypto();
}

SecureStream::~SecureStream() {
  sodium_memzero(tx_key_.data(), tx_key_.size());
  sodium_memzero(rx_key_.data(), rx_key_.size());
  sodium_memzero(&push_, sizeof(push_));
  sodium_memzero(&pull_, sizeof(pull_));
}

Status SecureStream::WriteAll(std::span<const uint8_t> bytes) {
  if (bytes.size() > max_record_) {
    return Error(StatusCode::kTooLarge, "{}: a {}-byte record exceeds the {}-byte limit", peer(),
                 bytes.size(), max_record_);
  }
  out_.clear();
  if (!header_sent_) {
    out_.resize(kHeaderBytes);
    crypto_secretstream_xchacha20poly1305_init_push(&push_, out_.data(), tx_key_.data());
    header_sent_ = true;
  }
  const size_t at = out_.size();
  const uint32_t len = static_cast<uint32_t>(bytes.size() + kTagBytes);
  out_.resize(at + sizeof(len) + len);
  std::memcpy(out_.data() + at, &len, sizeof(len));
  crypto_secretstream_xchacha20poly1305_push(&push_, out_.data() + at + sizeof(len), nullptr,
                                             bytes.data(), bytes.size(), nullptr, 0,
                                             crypto_secretstream_xchacha20poly1305_TAG_MESSAGE);
  Status s = inner_->WriteAll(out_);
  if (out_.capacity() > kKeepBuffer) std::vector<uint8_t>().swap(out_);
  return s;
}

Status SecureStream::Fill(size_t n) {
  if (raw_end_ - raw_pos_ >= n) return Status::Ok();
  // Move the unread tail to the front, then grow to fit n.
  if (raw_pos_ > 0) {
    std::memmove(raw_.data(), raw_.data() + raw_pos_, raw_end_ - raw_pos_);
    raw_end_ -= raw_pos_;
    raw_pos_ = 0;
  }
  if (raw_.size() < std::max(n, kReadChunk)) raw_.resize(std::max(n, kReadChunk));
  while (raw_end_ < n) {
    KV_ASSIGN_OR_RETURN(size_t got,
                        inner_->ReadSome(std::span<uint8_t>(raw_).subspan(raw_end_)));
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
  if (len < kTagBytes || len - kTagBytes > max_record_) {
    return Error(StatusCode::kTooLarge, "{}: encrypted record of {} bytes is outside 17..{}",
                 peer(), len, max_record_ + kTagBytes);
  }
  KV_RETURN_IF_ERROR(Fill(sizeof(len) + len));
  plain_.resize(len - kTagBytes);
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
    if (raw_.size() > kKeepBuffer) std::vector<uint8_t>().swap(raw_);
  }
  return Status::Ok();
}

Result<size_t> SecureStream::ReadSome(std::span<uint8_t> buffer) {
  if (!error_.ok()) return error_;
  while (plain_pos_ == plain_.size()) {
    if (plain_.capacity() > kKeepBuffer) std::vector<uint8_t>().swap(plain_);
    plain_pos_ = 0;
    if (Status s = ReadRecord(); !s.ok()) {
      if (s.code() == StatusCode::kEndOfStream) return size_t{0};
      error_ = s;
      return s;
    }
  }
  const size_t n = std::min(buffer.size(), plain_.size() - plain_pos_);
  std::memcpy(buffer.data(), plain_.data() + plain_pos_, n);
  plain_pos_ += n;
  return n;
}

}  // namespace kvasir::ring
