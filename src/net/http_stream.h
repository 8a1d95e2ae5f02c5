// The body of an HTTP answer that is sent while it is being made (Server-Sent Events): a producer
// on any thread writes pieces as they come, and the server's thread sends each as an HTTP/1.1
// chunk (net/http_server.h). A handler makes one, keeps it for its producer, and puts it in the
// response it replies with.
//
// Bounded, and never in the producer's way: the bytes written and not yet sent are limited, and a
// producer that gets that far ahead of its client (a slow reader) has that client dropped instead
// of being made to wait, so one slow client stalls neither its producer nor anyone else's stream.
// The producer learns that its client has gone (closed the connection, was dropped, or the server
// stopped) from Write's result, from gone(), or from an OnGone callback.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace kvasir::net {

class HttpBodyStream {
 public:
  // `max_pending_bytes`: written and not yet handed to the socket, at most this (at least 1).
  explicit HttpBodyStream(size_t max_pending_bytes = size_t{1} << 20);
  HttpBodyStream(const HttpBodyStream&) = delete;
  HttpBodyStream& operator=(const HttpBodyStream&) = delete;

  // Queues `bytes` (nothing when empty). Returns false once the client has gone: the bytes are
  // dropped, and so is everything else written from then on. Bytes that would take the pending
  // ones past the limit end the stream the same way (the client is dropped as a slow reader).
  // Never blocks on the client. Any thread.
  bool Write(std::string bytes);
  // Ends the body: the last chunk goes out after what was written. Idempotent; any thread.
  void End();
  // Whether the client has gone (see Write). Any thread.
  bool gone() const;
  // Why the client has gone, for logs; "" while it is there.
  std::string why_gone() const;
  // Runs `callback` once when the client goes before End() was called (at once, on this thread,
  // when it has gone already). Callbacks run on the thread that notices (the server's, or a
  // producer's in Write): they must be quick and must not call OnGone. Any thread.
  void OnGone(std::function<void()> callback);

  // ---- For the server (net/http_server.cpp) ----
  // What the server does when there is something to send or the client has gone: wakes its
  // connection. Called with the stream's lock held, so it must only post work elsewhere.
  void Attach(std::function<void()> wake);
  // Stops waking the connection (it is closing). Any thread.
  void Detach();
  // Takes everything written so far; `ended` when End() was called and nothing is left after it.
  struct Taken {
    std::string bytes;
    bool ended = false;
  };
  Taken Take();
  // The client has gone: no more writes, callbacks run (unless End() came first). Idempotent.
  void MarkGone(const std::string& why);

 private:
  const size_t max_pending_;
  mutable std::mutex mu_;
  std::string pending_;  // written, not yet taken
  bool ended_ = false;
  bool gone_ = false;
  std::string why_gone_;
  std::function<void()> wake_;
  std::vector<std::function<void()>> on_gone_;
};

}  // namespace kvasir::net
