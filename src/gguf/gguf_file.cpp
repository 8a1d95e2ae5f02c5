// GgufFile: a mapped GGUF file with typed metadata lookups.
#include "gguf/gguf_file.h"

#include "base/check.h"

namespace kvasir {

Result<GgufFile> GgufFile::Open(const std::string& path) {
  KV_ASSIGN_OR_RETURN(MappedFile map, MappedFile::Open(path));
  if (map.size() == 0) return Error("{}: empty file, not a GGUF file", path);
  KV_ASSIGN_OR_RETURN(GgufHeader header, ParseGgufHeader(map.bytes(), map.size(), path));
  GgufFile file;
  file.map_ = std::move(map);
  file.header_ = std::move(header);
  return file;
}

GgufFile GgufFile::HeaderOnly(GgufHeader header, std::string name, uint64_t file_size) {
  GgufFile file;
  file.header_ = std::move(header);
  file.header_only_ = true;
  file.name_ = std::move(name);
  file.size_ = file_size;
  return file;
}

namespace {

Status Missing(const std::string& path, std::string_view key) {
  return Error("{}: key {} missing", path, key);
}

Status WrongType(const std::string& path, std::string_view key, const GgufValue& v,
                 std::string_view expected) {
  return Error("{}: key {}: expected {}, got {} {}", path, key, expected, GgufTypeName(v.type),
               v.ToDisplayString());
}

}  // namespace

Result<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path(), key);
  std::optional<uint64_t> u = v->AsUint();
  if (!u) return WrongType(path(), key, *v, "an unsigned integer");
  return *u;
}

Result<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path(), key);
  std::optional<double> d = v->AsDouble();
  if (!d) return WrongType(path(), key, *v, "a number");
  return *d;
}

Result<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path(), key);
  const std::string* s = v->AsString();
  if (s == nullptr) return WrongType(path(), key, *v, "a string");
  return *s;
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path(), key);
  std::optional<bool> b = v->AsBool();
  if (!b) return WrongType(path(), key, *v, "a bool");
  return *b;
}

const GgufArray* GgufFile::GetArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  return v == nullptr ? nullptr : v->AsArray();
}

Result<uint64_t> GgufFile::GetUintOr(std::string_view key, uint64_t fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetUint(key);
}

Result<double> GgufFile::GetFloatOr(std::string_view key, double fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetFloat(key);
}

std::span<const uint8_t> GgufFile::TensorData(const GgufTensorInfo& t) const {
  const uint64_t start = header_.data_offset + t.offset;
  KV_CHECK(!header_only_, "{}: TensorData() on a header-only GgufFile", path());
  KV_CHECK(start <= map_.size() && t.n_bytes <= map_.size() - start,
           "{}: tensor {} [{}, +{}) outside the mapping; not from this file?", path(), t.name,
           start, t.n_bytes);
  return map_.bytes().subspan(start, t.n_bytes);
}

}  // namespace kvasir
