#include "market/proof.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/sha256.h"
#include "market/signed_request.h"

namespace kvasir::market {

Result<std::vector<RangeSample>> SampleRanges(const GgufFile& file,
                                              const std::vector<std::string>& tensors, int count,
                                              std::mt19937_64& rng) {
  std::vector<const GgufTensorInfo*> infos;
  uint64_t total = 0;
  for (const std::string& name : tensors) {
    const GgufTensorInfo* t = file.FindTensor(name);
    if (t == nullptr) return Error("{}: no tensor named {}", file.path(), name);
    if (t->n_bytes == 0) continue;
    infos.push_back(t);
    total += t->n_bytes;
  }
  std::vector<RangeSample> out;
  if (total == 0) return out;
  for (int i = 0; i < count; ++i) {
    // A byte of the window, uniformly; the range starts there (clipped to its tensor's end).
    uint64_t at = std::uniform_int_distribution<uint64_t>(0, total - 1)(rng);
    const GgufTensorInfo* t = infos.front();
    for (const GgufTensorInfo* c : infos) {
      if (at < c->n_bytes) {
        t = c;
        break;
      }
      at -= c->n_bytes;
    }
    const uint64_t length = std::min<uint64_t>(kSampleBytes, t->n_bytes - at);
    const auto data = file.TensorData(*t).subspan(at, length);
    out.push_back({{t->name, at, static_cast<uint32_t>(length)},
                   std::string(reinterpret_cast<const char*>(data.data()), data.size())});
  }
  return out;
}

std::string ProofDigest(std::string_view nonce, std::string_view bytes) {
  Sha256 h;
  h.Update({reinterpret_cast<const uint8_t*>(nonce.data()), nonce.size()});
  h.Update({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  return Sha256Hex(h.Finish());
}

Result<std::vector<std::string>> AnswerChallenge(const GgufFile& slice, std::string_view nonce,
                                                 const std::vector<ProofRange>& ranges) {
  std::vector<std::string> digests;
  for (const ProofRange& r : ranges) {
    const GgufTensorInfo* t = slice.FindTensor(r.tensor);
    if (t == nullptr) return Error("{}: the challenge names tensor {}, which it lacks", slice.path(), r.tensor);
    if (r.offset > t->n_bytes || r.length > t->n_bytes - r.offset) {
      return Error("{}: tensor {}: the challenge's range [{}, +{}) is past its {} bytes",
                   slice.path(), r.tensor, r.offset, r.length, t->n_bytes);
    }
    const auto data = slice.TensorData(*t).subspan(r.offset, r.length);
    digests.push_back(
        ProofDigest(nonce, std::string_view(reinterpret_cast<const char*>(data.data()), data.size())));
  }
  return digests;
}

std::string SamplesToJson(const std::vector<RangeSample>& samples) {
  nlohmann::json j = nlohmann::json::array();
  for (const RangeSample& s : samples) {
    j.push_back({{"tensor", s.range.tensor}, {"offset", s.range.offset}, {"bytes", ToHex(s.bytes)}});
  }
  return j.dump();
}

Result<std::vector<RangeSample>> SamplesFromJson(std::string_view text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) return Error("range samples: not a JSON array");
  std::vector<RangeSample> out;
  for (const auto& e : j) {
    if (!e.is_object() || !e.contains("tensor") || !e["tensor"].is_string() ||
        !e.contains("offset") || !e["offset"].is_number_unsigned() || !e.contains("bytes") ||
        !e["bytes"].is_string()) {
      return Error("range samples: an entry lacks tensor, offset or bytes");
    }
    KV_ASSIGN_OR_RETURN(std::string bytes, FromHex(e["bytes"].get<std::string>()));
    if (bytes.empty() || bytes.size() > kSampleBytes) {
      return Error("range samples: {} bytes in a range (1 to {})", bytes.size(), kSampleBytes);
    }
    RangeSample s;
    s.range = {e["tensor"].get<std::string>(), e["offset"].get<uint64_t>(),
               static_cast<uint32_t>(bytes.size())};
    s.bytes = std::move(bytes);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace kvasir::market
