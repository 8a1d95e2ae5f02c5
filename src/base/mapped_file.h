// Read-only memory map of a whole file. Pages are loaded on first touch, so a stage that maps a full
// model but reads only its window's tensors keeps only those pages resident.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"

namespace kvasir {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Maps `path` read-only. An empty file maps to an empty span.
  static Result<MappedFile> Open(const std::string& path);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

  // Hints that [offset, offset+len) will be read soon (readahead); bounds are clamped.
  void WillNeed(size_t offset, size_t len) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Resident set size of this process in bytes (from /proc/self/statm), or 0 if unknown.
size_t CurrentRssBytes();
// Peak resident set size of this process in bytes (VmHWM), or 0 if unknown.
size_t PeakRssBytes();

}  // namespace kvasir
