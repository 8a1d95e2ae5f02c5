// ParseGgufHeader: the GGUF v2/v3 header, metadata and tensor index, validated field by field.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string_view>
#include <unordered_set>

#include "gguf/gguf_file.h"

namespace kvasir {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader copies little-endian fields as they are");

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kI64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
constexpr uint32_t kMaxDims = 4;
// Arrays of arrays deeper than this are refused (no real file comes close; it bounds recursion).
constexpr uint32_t kMaxArrayDepth = 8;
// Header (metadata + tensor index) bytes past this offset are refused, whether or not the file is
// larger: the largest real vocabularies need tens of megabytes, and the parsed header takes a few
// times its encoded size in memory.
constexpr uint64_t kMaxHeaderBytes = uint64_t{256} << 20;
// Containers sized from a count in the file reserve at most this many elements up front; beyond it
// they grow with the bytes actually parsed, so a lying count cannot cause a giant allocation.
constexpr uint64_t kMaxReserve = uint64_t{1} << 16;
// Smallest prefix worth asking for when retrying.
constexpr uint64_t kMinRetryBytes = 4096;

// Smallest encodings, used to bound counts by the bytes left before allocating anything.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // key length, value type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset
constexpr uint64_t kMinStringBytes = 8;                  // length
constexpr uint64_t kMinArrayBytes = 4 + 8;               // element type, count

uint64_t SatAdd(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? kU64Max : r;
}

uint64_t SatMul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? kU64Max : r;
}

bool IsValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

// Bytes of one element of a fixed-size type; 0 for strings and arrays.
uint64_t FixedSize(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

uint64_t MinEncodedSize(GgufType t) {
  if (t == GgufType::kString) return kMinStringBytes;
  if (t == GgufType::kArray) return kMinArrayBytes;
  return FixedSize(t);
}

std::string PluralName(GgufType t) {
  if (t == GgufType::kString) return "strings";
  if (t == GgufType::kArray) return "arrays";
  return fmt::format("{} values", GgufTypeName(t));
}

// Copies `count` fixed-size little-endian elements into an unboxed vector.
template <typename T>
std::vector<T> CopyElements(const uint8_t* src, uint64_t count) {
  std::vector<T> v(count);
  if (count > 0) std::memcpy(v.data(), src, count * sizeof(T));
  return v;
}

// A cursor over the available bytes. Every read checks the bytes left first; when the bytes end
// before the file does, needed() says how large a prefix is worth retrying with.
class Parser {
 public:
  Parser(std::span<const uint8_t> bytes, uint64_t file_size)
      : data_(bytes.data()),
        prefix_size_(bytes.size()),
        file_size_(file_size),
        end_(file_size != 0 ? std::min<uint64_t>(bytes.size(), file_size) : bytes.size()),
        limit_(std::min(end_, kMaxHeaderBytes)) {}

  uint64_t pos() const { return pos_; }
  // Bytes the header may still use: up to the end of the bytes given, and at most kMaxHeaderBytes.
  uint64_t Left() const { return limit_ - pos_; }
  uint64_t needed() const { return needed_; }
  const uint8_t* data() const { return data_; }

  // The error for `what`, which needs `n` bytes at the cursor while fewer are left.
  Status Short(std::string_view what, uint64_t n) {
    const uint64_t want = SatAdd(pos_, n);
    std::string msg = fmt::format("{} exceeds the {} bytes left at offset {}", what, Left(), pos_);
    if (want > kMaxHeaderBytes) {  // refused outright, however large the file
      if (end_ > limit_) msg += fmt::format(" (headers are limited to {} bytes)", kMaxHeaderBytes);
      return Status::Error(std::move(msg));
    }
    const bool more_exists = file_size_ == 0 || end_ < file_size_;
    const bool plausible = file_size_ == 0 || want <= file_size_;
    if (more_exists && plausible) {
      needed_ = std::max<uint64_t>({want, SatMul(end_, 2), kMinRetryBytes});
      needed_ = std::min(needed_, file_size_ != 0 ? file_size_ : kMaxHeaderBytes);
      msg +=
          fmt::format(" (a {}-byte prefix was given; retry with {} bytes)", prefix_size_, needed_);
    }
    return Status::Error(std::move(msg));
  }

  template <typename T>
  Status Read(std::string_view what, T* out) {
    if (sizeof(T) > Left()) return Short(fmt::format("{} ({} bytes)", what, sizeof(T)), sizeof(T));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  // A length-prefixed string, as a view into the input bytes.
  Status ReadString(std::string_view what, std::string_view* out) {
    uint64_t len = 0;
    KV_RETURN_IF_ERROR(Read(fmt::format("{} length", what), &len));
    if (len > Left()) return Short(fmt::format("{} length {}", what, len), len);
    *out = std::string_view(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

  // A value of the given (already validated) type; `depth` counts enclosing arrays.
  Status ReadValue(GgufType type, uint32_t depth, GgufValue* out) {
    out->type = type;
    switch (type) {
      case GgufType::kUint8:
        return ReadScalar<uint8_t>(out);
      case GgufType::kInt8:
        return ReadScalar<int8_t>(out);
      case GgufType::kUint16:
        return ReadScalar<uint16_t>(out);
      case GgufType::kInt16:
        return ReadScalar<int16_t>(out);
      case GgufType::kUint32:
        return ReadScalar<uint32_t>(out);
      case GgufType::kInt32:
        return ReadScalar<int32_t>(out);
      case GgufType::kFloat32:
        return ReadScalar<float>(out);
      case GgufType::kUint64:
        return ReadScalar<uint64_t>(out);
      case GgufType::kInt64:
        return ReadScalar<int64_t>(out);
      case GgufType::kFloat64:
        return ReadScalar<double>(out);
      case GgufType::kBool: {
        uint8_t b = 0;
        KV_RETURN_IF_ERROR(Read("bool value", &b));
        out->value = b != 0;
        return Status::Ok();
      }
      case GgufType::kString: {
        std::string_view s;
        KV_RETURN_IF_ERROR(ReadString("string", &s));
        out->value = std::string(s);
        return Status::Ok();
      }
      case GgufType::kArray: {
        GgufArray array;
        KV_RETURN_IF_ERROR(ReadArray(depth + 1, &array));
        out->value = std::move(array);
        return Status::Ok();
      }
    }
    return Error("unknown value type {}", static_cast<uint32_t>(type));
  }

  // An array (element type, count, elements); `depth` is its own nesting level, from 1.
  Status ReadArray(uint32_t depth, GgufArray* out) {
    if (depth > kMaxArrayDepth) {
      return Error("arrays nested deeper than {} levels at offset {}", kMaxArrayDepth, pos_);
    }
    uint32_t elem_type = 0;
    KV_RETURN_IF_ERROR(Read("array element type", &elem_type));
    if (!IsValueType(elem_type)) {
      return Error("unknown array element type {} at offset {}", elem_type, pos_ - 4);
    }
    const GgufType type = static_cast<GgufType>(elem_type);
    uint64_t count = 0;
    KV_RETURN_IF_ERROR(Read("array count", &count));
    const uint64_t min_bytes = SatMul(count, MinEncodedSize(type));
    if (min_bytes > Left()) {
      return Short(fmt::format("array of {} {}", count, PluralName(type)), min_bytes);
    }
    out->elem_type = type;
    const uint8_t* src = data_ + pos_;
    switch (type) {
      case GgufType::kUint8:
        out->items = CopyElements<uint8_t>(src, count);
        break;
      case GgufType::kInt8:
        out->items = CopyElements<int8_t>(src, count);
        break;
      case GgufType::kUint16:
        out->items = CopyElements<uint16_t>(src, count);
        break;
      case GgufType::kInt16:
        out->items = CopyElements<int16_t>(src, count);
        break;
      case GgufType::kUint32:
        out->items = CopyElements<uint32_t>(src, count);
        break;
      case GgufType::kInt32:
        out->items = CopyElements<int32_t>(src, count);
        break;
      case GgufType::kFloat32:
        out->items = CopyElements<float>(src, count);
        break;
      case GgufType::kUint64:
        out->items = CopyElements<uint64_t>(src, count);
        break;
      case GgufType::kInt64:
        out->items = CopyElements<int64_t>(src, count);
        break;
      case GgufType::kFloat64:
        out->items = CopyElements<double>(src, count);
        break;
      case GgufType::kBool: {
        std::vector<bool> v(count);
        for (uint64_t i = 0; i < count; ++i) v[i] = src[i] != 0;
        out->items = std::move(v);
        break;
      }
      case GgufType::kString: {
        std::vector<std::string> v;
        v.reserve(std::min(count, kMaxReserve));
        for (uint64_t i = 0; i < count; ++i) {
          std::string_view s;
          Status st = ReadString("string", &s);
          if (!st.ok()) return st.WithContext(fmt::format("item {}", i));
          v.emplace_back(s);
        }
        out->items = std::move(v);
        return Status::Ok();
      }
      case GgufType::kArray: {
        std::vector<GgufValue> v;
        v.reserve(std::min(count, kMaxReserve));
        for (uint64_t i = 0; i < count; ++i) {
          GgufArray inner;
          Status st = ReadArray(depth + 1, &inner);
          if (!st.ok()) return st.WithContext(fmt::format("item {}", i));
          v.push_back(GgufValue::Array(std::move(inner)));
        }
        out->items = std::move(v);
        return Status::Ok();
      }
    }
    pos_ += count * FixedSize(type);  // bounded by Left() above
    return Status::Ok();
  }

 private:
  template <typename T>
  Status ReadScalar(GgufValue* out) {
    T v{};
    KV_RETURN_IF_ERROR(Read(fmt::format("{} value", GgufTypeName(out->type)), &v));
    out->value = v;
    return Status::Ok();
  }

  const uint8_t* data_;
  uint64_t prefix_size_;
  uint64_t file_size_;  // 0: unknown
  uint64_t end_;        // readable bytes: the prefix, cut to the file size when known
  uint64_t limit_;      // end_, cut to kMaxHeaderBytes
  uint64_t pos_ = 0;
  uint64_t needed_ = 0;
};

// Validates `general.alignment` when present; returns the alignment to use.
Result<uint32_t> AlignmentOf(const GgufHeader& h) {
  for (size_t i = 0; i < h.kvs.size(); ++i) {
    if (h.kvs[i].key != "general.alignment") continue;
    const GgufValue& v = h.kvs[i].value;
    std::optional<uint64_t> a = v.AsUint();
    if (!a) {
      return Error("kv {} (general.alignment): expected an unsigned integer, got {} {}", i,
                   GgufTypeName(v.type), v.ToDisplayString());
    }
    if (!std::has_single_bit(*a) || *a > kGgufMaxAlignment) {
      return Error("kv {} (general.alignment): {} is not a power of two in [1, {}]", i, *a,
                   kGgufMaxAlignment);
    }
    return static_cast<uint32_t>(*a);
  }
  return kGgufDefaultAlignment;
}

std::string ShapeString(const GgufTensorInfo& t) {
  std::string s = "[";
  for (uint32_t j = 0; j < t.n_dims; ++j) s += fmt::format("{}{}", j == 0 ? "" : ", ", t.ne[j]);
  return s + "]";
}

// Reads one tensor index entry and checks everything that does not need the file size.
Status ReadTensorInfo(Parser& p, uint32_t alignment, GgufTensorInfo* t) {
  KV_RETURN_IF_ERROR(p.Read("n_dims", &t->n_dims));
  if (t->n_dims > kMaxDims) {
    return Error("n_dims {} exceeds the maximum of {}", t->n_dims, kMaxDims);
  }
  for (uint32_t j = 0; j < t->n_dims; ++j) {
    KV_RETURN_IF_ERROR(p.Read(fmt::format("ne[{}]", j), &t->ne[j]));
    if (t->ne[j] > kI64Max) return Error("ne[{}] = {} exceeds the int64 range", j, t->ne[j]);
  }
  KV_RETURN_IF_ERROR(p.Read("type", &t->type));
  KV_RETURN_IF_ERROR(p.Read("offset", &t->offset));
  std::optional<TensorTypeInfo> info = GetTensorTypeInfo(t->type);
  if (!info) return Error("unknown tensor type id {}", t->type);
  if (t->ne[0] % info->block_elems != 0) {
    return Error("ne[0] = {} is not a multiple of the {} block size {}", t->ne[0], info->name,
                 info->block_elems);
  }
  uint64_t n = 1;
  for (uint64_t d : t->ne) {
    if (__builtin_mul_overflow(n, d, &n) || n > kI64Max) {
      return Error("shape {} overflows: more than 2^63 elements", ShapeString(*t));
    }
  }
  const uint64_t blocks = n / info->block_elems;
  if (__builtin_mul_overflow(blocks, uint64_t{info->block_bytes}, &t->n_bytes)) {
    return Error("shape {} of {} overflows: more than 2^64 bytes", ShapeString(*t), info->name);
  }
  if (t->offset % alignment != 0) {
    return Error("offset {} is not a multiple of the alignment {}", t->offset, alignment);
  }
  return Status::Ok();
}

Status ParseInto(Parser& p, uint64_t file_size, GgufHeader* h) {
  uint32_t magic = 0;
  KV_RETURN_IF_ERROR(p.Read("magic", &magic));
  if (magic != kGgufMagic) {
    return Error("bad magic 0x{:08x} at offset 0: not a GGUF file (expected \"GGUF\")", magic);
  }
  KV_RETURN_IF_ERROR(p.Read("version", &h->version));
  if (h->version == 1) return Error("GGUF version 1 is not supported (only versions 2 and 3)");
  if (h->version != 2 && h->version != 3) {
    const uint32_t swapped = __builtin_bswap32(h->version);
    if (swapped == 2 || swapped == 3) return Error("big-endian GGUF files are not supported");
    return Error("unsupported GGUF version {} (expected 2 or 3)", h->version);
  }
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
  KV_RETURN_IF_ERROR(p.Read("tensor count", &n_tensors));
  KV_RETURN_IF_ERROR(p.Read("kv count", &n_kv));
  const uint64_t min_bytes =
      SatAdd(SatMul(n_kv, kMinKvBytes), SatMul(n_tensors, kMinTensorInfoBytes));
  if (min_bytes > p.Left()) {
    return p.Short(fmt::format("{} kvs and {} tensors", n_kv, n_tensors), min_bytes);
  }

  // Duplicate detection uses views into the input bytes, which outlive the parse.
  std::unordered_set<std::string_view> seen;
  seen.reserve(std::min(n_kv, kMaxReserve));
  h->kvs.reserve(std::min(n_kv, kMaxReserve));
  for (uint64_t i = 0; i < n_kv; ++i) {
    GgufKv& kv = h->kvs.emplace_back();
    std::string_view key;
    Status st = p.ReadString("key", &key);
    if (!st.ok()) return st.WithContext(fmt::format("kv {}", i));
    kv.key = std::string(key);
    const auto context = [&] { return fmt::format("kv {} ({})", i, kv.key); };
    uint32_t type = 0;
    st = p.Read("value type", &type);
    if (!st.ok()) return st.WithContext(context());
    if (!IsValueType(type)) {
      return Error("{}: unknown value type {} at offset {}", context(), type, p.pos() - 4);
    }
    if (!seen.insert(key).second) return Error("{}: duplicate key", context());
    st = p.ReadValue(static_cast<GgufType>(type), 0, &kv.value);
    if (!st.ok()) return st.WithContext(context());
  }
  KV_ASSIGN_OR_RETURN(h->alignment, AlignmentOf(*h));

  seen.clear();
  seen.reserve(std::min(n_tensors, kMaxReserve));
  h->tensors.reserve(std::min(n_tensors, kMaxReserve));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo& t = h->tensors.emplace_back();
    std::string_view name;
    Status st = p.ReadString("name", &name);
    if (!st.ok()) return st.WithContext(fmt::format("tensor {}", i));
    t.name = std::string(name);
    st = ReadTensorInfo(p, h->alignment, &t);
    if (!st.ok()) return st.WithContext(fmt::format("tensor {}", t.name));
    if (!seen.insert(name).second) return Error("tensor {}: duplicate tensor name", t.name);
  }
  h->header_bytes = p.pos();
  const uint64_t padded = SatAdd(h->header_bytes, h->alignment - 1);
  h->data_offset = padded / h->alignment * h->alignment;

  if (file_size == 0) return Status::Ok();
  for (const GgufTensorInfo& t : h->tensors) {
    const uint64_t start = SatAdd(h->data_offset, t.offset);
    const uint64_t end = SatAdd(start, t.n_bytes);
    if (end > file_size) {
      return Error(
          "tensor {}: data [{}, {}) ({} bytes at data offset {}) past end of file (size {})",
          t.name, start, end, t.n_bytes, t.offset, file_size);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<GgufHeader> ParseGgufHeader(std::span<const uint8_t> bytes, uint64_t file_size,
                                   const std::string& name, uint64_t* needed_bytes) {
  Parser parser(bytes, file_size);
  GgufHeader header;
  Status st = ParseInto(parser, file_size, &header);
  if (needed_bytes != nullptr) *needed_bytes = st.ok() ? 0 : parser.needed();
  if (!st.ok()) return st.WithContext(name);
  return header;
}

const GgufValue* GgufHeader::Find(std::string_view key) const {
  for (const GgufKv& kv : kvs) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

const GgufTensorInfo* GgufHeader::FindTensor(std::string_view name) const {
  for (const GgufTensorInfo& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace kvasir
