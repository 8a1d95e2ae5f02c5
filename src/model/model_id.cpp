#include "model/model_id.h"

#include <openssl/evp.h>

#include <cstring>
#include <memory>

namespace kvasir {
namespace {

// Appends a value in a canonical little-endian form: type tag, then the payload.
class Canon {
 public:
  void U8(uint8_t v) { out_.push_back(v); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void Str(const std::string& s) {
    U64(s.size());
    Raw(s.data(), s.size());
  }
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void Value(const GgufValue& v) {
    U32(static_cast<uint32_t>(v.type));
    std::visit(
        [this](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::string>) {
            Str(x);
          } else if constexpr (std::is_same_v<T, GgufArray>) {
            Array(x);
          } else {
            Raw(&x, sizeof(x));
          }
        },
        v.value);
  }
  void Array(const GgufArray& a) {
    U32(static_cast<uint32_t>(a.elem_type));
    U64(a.size());
    std::visit(
        [this](const auto& items) {
          for (const auto& item : items) {
            using T = std::decay_t<decltype(item)>;
            if constexpr (std::is_same_v<T, std::string>) {
              Str(item);
            } else if constexpr (std::is_same_v<T, GgufValue>) {
              Value(item);
            } else if constexpr (std::is_same_v<T, bool>) {
              U8(item ? 1 : 0);
            } else {
              Raw(&item, sizeof(item));
            }
          }
        },
        a.items);
  }
  const std::vector<uint8_t>& bytes() const { return out_; }

 private:
  std::vector<uint8_t> out_;
};

}  // namespace

std::string ModelIdHex(const ModelId& id) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : id) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

Result<ModelId> ComputeModelId(const GgufHeader& header, const std::string& name) {
  ModelId id{};
  if (const GgufValue* v = header.Find("kvasir.model_id"); v != nullptr) {
    const std::string* hex = v->AsString();
    if (hex == nullptr || hex->size() != 32) {
      return Error("{}: kvasir.model_id must be a string of 32 hex digits", name);
    }
    for (size_t i = 0; i < 16; ++i) {
      unsigned byte = 0;
      if (std::sscanf(hex->c_str() + 2 * i, "%2x", &byte) != 1) {
        return Error("{}: kvasir.model_id '{}' is not hex", name, *hex);
      }
      id[i] = static_cast<uint8_t>(byte);
    }
    return id;
  }
  Canon c;
  for (const GgufKv& kv : header.kvs) {
    if (kv.key.rfind("kvasir.", 0) == 0) continue;
    c.Str(kv.key);
    c.Value(kv.value);
  }
  for (const GgufTensorInfo& t : header.tensors) {
    c.Str(t.name);
    c.U32(t.type);
    c.U32(t.n_dims);
    for (uint64_t d : t.ne) c.U64(d);
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(c.bytes().data(), c.bytes().size(), digest, &len, EVP_sha256(), nullptr) != 1) {
    return Error("{}: SHA-256 failed", name);
  }
  std::memcpy(id.data(), digest, id.size());
  return id;
}

}  // namespace kvasir
