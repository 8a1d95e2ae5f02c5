// An encrypted, authenticated byte stream over another net::Stream, keyed by the link handshake
// (ring/handshake.h). Each WriteAll() becomes one record: a u32 little-endian length, then the
// record sealed with libsodium's crypto_secretstream_xchacha20poly1305 (which numbers records, so
// a record that is dropped, replayed, reordered or altered fails to open). The first bytes each way
// are the 24-byte stream header. A record that fails to open ends the stream with an error; a read
// that fails with kTimeout (a transport with read deadlines) may be tried again.
//
// Memory: the reader's buffer grows with the bytes that have arrived, never to the length a record
// header announces, so a peer that announces a large record and sends it slowly holds only what
// it sent. With a ByteAccount (a client link) every buffer is charged to it before it grows and
// freed as soon as it is empty; without one, buffers up to 1 MiB are kept for reuse.
#pragma once

#include <sodium.h>

#include <memory>
#include <vector>

#include "net/stream.h"
#include "ring/byte_budget.h"
#include "ring/handshake.h"

namespace kvasir::ring {

class SecureStream final : public net::Stream {
 public:
  // `max_record` bounds the plaintext of one record (a larger announced length ends the stream
  // with kTooLarge before anything is allocated for it). `account`, when set, is charged for
  // every buffer (a failed charge ends the stream with kTooLarge).
  SecureStream(std::unique_ptr<net::Stream> inner, const SessionKey& tx, const SessionKey& rx,
               size_t max_record, std::shared_ptr<ByteAccount> account = nullptr);
  ~SecureStream() override;

  Status WriteAll(std::span<const uint8_t> bytes) override;
  Result<size_t> ReadSome(std::span<uint8_t> buffer) override;
  void Shutdown() override { inner_->Shutdown(); }
  // What follows is dropped unread: its bytes need no decryption.
  void Linger(int timeout_ms, size_t max_bytes) override { inner_->Linger(timeout_ms, max_bytes); }
  void LimitSendBuffer(int bytes) override { inner_->LimitSendBuffer(bytes); }
  std::string peer() const override { return inner_->peer(); }

 private:
  Status Fill(size_t n);  // reads until raw_ holds at least n unread bytes
  Status ReadRecord();    // opens the next record into plain_
  // Grows `v` to hold `n` bytes (charged), or fails with kTooLarge naming the budget.
  Status Grow(std::vector<uint8_t>* v, size_t n);
  // Frees `v` if it is empty of use and over what this stream keeps for reuse.
  void Trim(std::vector<uint8_t>* v);

  std::unique_ptr<net::Stream> inner_;
  size_t max_record_;
  std::shared_ptr<ByteAccount> account_;
  // Writer side.
  crypto_secretstream_xchacha20poly1305_state push_{};
  SessionKey tx_key_{};
  bool header_sent_ = false;
  std::vector<uint8_t> out_;  // [header +] u32 length + sealed record
  // Reader side.
  crypto_secretstream_xchacha20poly1305_state pull_{};
  SessionKey rx_key_{};
  bool header_read_ = false;
  std::vector<uint8_t> raw_;  // bytes from inner_, [raw_pos_, raw_end_) unread
  size_t raw_pos_ = 0, raw_end_ = 0;
  std::vector<uint8_t> plain_;  // the opened record, [plain_pos_, size) unread
  size_t plain_pos_ = 0;
  Status error_;
};

}  // namespace kvasir::ring
