#include "ring/link.h"

namespace kvasir::ring {

Link::Link(std::unique_ptr<Stream> stream, std::string what)
    : stream_(std::move(stream)), what_(std::move(what)), read_buf_(64 * 1024) {}

Link::~Link() { Close(); }

Status Link::Send(const Message& m) { return SendFrame(EncodeMessage(m)); }

Status Link::SendFrame(const std::vector<uint8_t>& frame) {
  std::lock_guard<std::mutex> lock(write_mu_);
  if (closed_.load()) return Error("{}: link is closed", what_);
  Status s = stream_->WriteAll(frame);
  if (!s.ok()) return s.WithContext(what_);
  bytes_out_.fetch_add(frame.size());
  return Status::Ok();
}

Result<Message> Link::Receive() {
  while (true) {
    auto next = decoder_.Next();
    if (!next.ok()) return next.status().WithContext(what_);
    if (next->has_value()) {
      const Frame& f = **next;
      bytes_in_.fetch_add(f.payload.size() + sizeof(wire::FrameHeader));
      auto msg = DecodeMessage(f);
      if (!msg.ok()) return msg.status().WithContext(what_);
      return msg;
    }
    if (closed_.load()) return Error("{}: link is closed", what_);
    auto n = stream_->ReadSome(read_buf_);
    if (!n.ok()) return n.status().WithContext(what_);
    if (*n == 0) return Error("{}: peer closed the connection", what_);
    decoder_.Feed(std::span<const uint8_t>(read_buf_.data(), *n));
  }
}

void Link::Fail(wire::ErrorCode code, const std::string& message) {
  if (!closed_.load()) {
    ErrorMsg e{code, 0, message.substr(0, wire::kMaxErrorMessage)};
    (void)Send(e);
  }
  Close();
}

void Link::Close() {
  if (!closed_.exchange(true)) stream_->Shutdown();
}

}  // namespace kvasir::ring
