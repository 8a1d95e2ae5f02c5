// A peer for fuzz targets: it "sends" the fuzzer's input in small pieces (then ends the stream)
// and swallows whatever it is sent. Reads never block.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "net/stream.h"

namespace kvasir::fuzzing {

class ScriptedStream final : public net::Stream {
 public:
  ScriptedStream(std::span<const uint8_t> input, size_t chunk) : input_(input), chunk_(chunk) {}
  Status WriteAll(std::span<const uint8_t>) override { return Status::Ok(); }
  Result<size_t> ReadSome(std::span<uint8_t> buffer) override {
    const size_t n = std::min({buffer.size(), chunk_, input_.size() - at_});
    std::copy_n(input_.data() + at_, n, buffer.data());
    at_ += n;
    return n;
  }
  void Shutdown() override {}
  std::string peer() const override { return "fuzz"; }
  size_t consumed() const { return at_; }  // bytes handed out so far

 private:
  std::span<const uint8_t> input_;
  size_t chunk_, at_ = 0;
};

}  // namespace kvasir::fuzzing
