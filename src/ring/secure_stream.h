// An encrypted, authenticated byte stream over another net::Stream, keyed by the link handshake
// (ring/handshake.h). Each WriteAll() becomes one record: a u32 little-endian length, then the
// record sealed with libsodium's crypto_secretstream_xchacha20poly1305 (which numbers records, so
// a record that is dropped, replayed, reordered or altered fails to open). The first bytes each way
// are the 24-byte stream header. A record that fails to open ends the stream with an error.
#pragma once

#include <sodium.h>

#include <memory>
#include <vector>

#include "net/stream.h"
#include "ring/handshake.h"

namespace kvasir::ring {

class SecureStream final : public net::Stream {
 public:
  // `max_record` bounds the plaintext of one record (larger announced lengths end the stream).
  SecureStream(std::unique_ptr<net::Stream> inner, const SessionKey& tx, const SessionKey& rx,
               size_t max_record);
  ~SecureStream() override;

  Status WriteAll(std::span<const uint8_t> bytes) override;
  Result<size_t> ReadSome(std::span<uint8_t> buffer) override;
  void Shutdown() override { inner_->Shutdown(); }
  std::string peer() const override { return inner_->peer(); }

 private:
  Status Fill(size_t n);     // reads until raw_ holds at least n unread bytes
  Status ReadRecord();       // opens the next record into plain_

  std::unique_ptr<net::Stream> inner_;
  size_t max_record_;
  // Writer side.
  crypto_secretstream_xchacha20poly1305_state push_{};
  SessionKey tx_key_{};
  bool header_sent_ = false;
  std::vector<uint8_t> out_;
  // Reader side.
  crypto_secretstream_xchacha20poly1305_state pull_{};
  SessionKey rx_key_{};
  bool header_read_ = false;
  std::vector<uint8_t> raw_;  // bytes from inner_, [raw_pos_, raw_end_) unread
  size_t raw_pos_ = 0, raw_end_ = 0;
  std::vector<uint8_t> plain_;
  size_t plain_pos_ = 0;
  Status error_;
};

}  // namespace kvasir::ring
