// GgufWriter: GGUF v3 serialisation and the temporary-file-and-rename write.
#include "gguf/gguf_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "base/check.h"

namespace kvasir {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the GGUF writer stores fields in host order");

constexpr uint32_t kWriteVersion = 3;
constexpr size_t kMaxDims = 4;

template <typename T>
void Put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void PutString(std::vector<uint8_t>& out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

uint64_t AlignUp(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

void PutArray(std::vector<uint8_t>& out, const GgufArray& a);

// The value's bytes without its type tag.
void PutValue(std::vector<uint8_t>& out, const GgufValue& v) {
  KV_CHECK(static_cast<size_t>(v.type) == v.value.index(),
           "GgufValue of type {} holds alternative {}", GgufTypeName(v.type), v.value.index());
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          PutString(out, x);
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          PutArray(out, x);
        } else if constexpr (std::is_same_v<T, bool>) {
          Put<uint8_t>(out, x ? 1 : 0);
        } else {
          Put<T>(out, x);
        }
      },
      v.value);
}

// Element type, count and elements.
void PutArray(std::vector<uint8_t>& out, const GgufArray& a) {
  KV_CHECK(static_cast<size_t>(a.elem_type) == a.items.index(),
           "GgufArray of {} holds alternative {}", GgufTypeName(a.elem_type), a.items.index());
  Put<uint32_t>(out, static_cast<uint32_t>(a.elem_type));
  Put<uint64_t>(out, a.size());
  std::visit(
      [&](const auto& items) {
        using E = typename std::decay_t<decltype(items)>::value_type;
        if constexpr (std::is_same_v<E, std::string>) {
          for (const std::string& s : items) PutString(out, s);
        } else if constexpr (std::is_same_v<E, GgufValue>) {
          for (const GgufValue& inner : items) {
            KV_CHECK(inner.type == GgufType::kArray, "array of arrays holds a {}",
                     GgufTypeName(inner.type));
            PutValue(out, inner);
          }
        } else if constexpr (std::is_same_v<E, bool>) {
          for (bool b : items) Put<uint8_t>(out, b ? 1 : 0);
        } else {
          const size_t at = out.size();
          out.resize(at + items.size() * sizeof(E));
          if (!items.empty()) std::memcpy(out.data() + at, items.data(), items.size() * sizeof(E));
        }
      },
      a.items);
}

// Writes to a file descriptor through a buffer; large spans go straight to the kernel.
class FdWriter {
 public:
  explicit FdWriter(int fd) : fd_(fd) { buf_.reserve(kBufferBytes); }

  Status Append(std::span<const uint8_t> bytes) {
    if (buf_.size() + bytes.size() > kBufferBytes) KV_RETURN_IF_ERROR(Flush());
    if (bytes.size() >= kBufferBytes) return WriteAll(bytes);
    buf_.insert(buf_.end(), bytes.begin(), bytes.end());
    return Status::Ok();
  }

  Status AppendZeros(uint64_t n) {
    static constexpr uint8_t kZeros[256] = {};
    while (n > 0) {
      const uint64_t chunk = std::min<uint64_t>(n, sizeof(kZeros));
      KV_RETURN_IF_ERROR(Append({kZeros, chunk}));
      n -= chunk;
    }
    return Status::Ok();
  }

  Status Flush() {
    Status st = WriteAll(buf_);
    buf_.clear();
    return st;
  }

  uint64_t written() const { return written_; }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;

  Status WriteAll(std::span<const uint8_t> bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return Error("write failed after {} bytes: {}", written_, std::strerror(errno));
      }
      written_ += static_cast<uint64_t>(n);
      bytes = bytes.subspan(static_cast<size_t>(n));
    }
    return Status::Ok();
  }

  int fd_;
  std::vector<uint8_t> buf_;
  uint64_t written_ = 0;
};

// The index entry of a tensor (offset left 0), after checking its type and shape.
Result<GgufTensorInfo> MakeTensorInfo(const std::string& name, TensorType type,
                                      std::span<const uint64_t> ne) {
  const uint32_t type_id = static_cast<uint32_t>(type);
  std::optional<TensorTypeInfo> info = GetTensorTypeInfo(type_id);
  if (!info) return Error("tensor {}: unknown tensor type id {}", name, type_id);
  if (ne.size() > kMaxDims) {
    return Error("tensor {}: n_dims {} exceeds the maximum of {}", name, ne.size(), kMaxDims);
  }
  GgufTensorInfo t;
  t.name = name;
  t.type = type_id;
  t.n_dims = static_cast<uint32_t>(ne.size());
  uint64_t n = 1;
  for (size_t j = 0; j < ne.size(); ++j) {
    t.ne[j] = ne[j];
    if (__builtin_mul_overflow(n, ne[j], &n) ||
        n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Error("tensor {}: shape overflows: more than 2^63 elements", name);
    }
  }
  if (t.ne[0] % info->block_elems != 0) {
    return Error("tensor {}: ne[0] = {} is not a multiple of the {} block size {}", name, t.ne[0],
                 info->name, info->block_elems);
  }
  if (__builtin_mul_overflow(n / info->block_elems, uint64_t{info->block_bytes}, &t.n_bytes)) {
    return Error("tensor {}: shape overflows: more than 2^64 bytes", name);
  }
  return t;
}

}  // namespace

void GgufWriter::SetKv(const std::string& key, GgufValue value) {
  for (GgufKv& kv : kvs_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  kvs_.push_back({key, std::move(value)});
}

void GgufWriter::CopyKvs(const GgufHeader& header) {
  for (const GgufKv& kv : header.kvs) SetKv(kv.key, kv.value);
}

Status GgufWriter::AddTensor(const std::string& name, TensorType type, std::span<const uint64_t> ne,
                             std::span<const uint8_t> data, bool borrow) {
  for (const Tensor& t : tensors_) {
    if (t.info.name == name) return Error("tensor {}: duplicate tensor name", name);
  }
  Tensor t;
  KV_ASSIGN_OR_RETURN(t.info, MakeTensorInfo(name, type, ne));
  if (data.size() != t.info.n_bytes) {
    return Error("tensor {}: {} bytes of data, but {} elements of {} take {} bytes", name,
                 data.size(), t.info.n_elements(), TensorTypeName(t.info.type), t.info.n_bytes);
  }
  // `data` stays empty for owned bytes, so copies and moves of the writer never dangle.
  if (borrow) {
    t.data = data;
  } else {
    t.owned.assign(data.begin(), data.end());
  }
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

Status GgufWriter::DeclareTensor(const std::string& name, TensorType type,
                                 std::span<const uint64_t> ne) {
  for (const Tensor& t : tensors_) {
    if (t.info.name == name) return Error("tensor {}: duplicate tensor name", name);
  }
  Tensor t;
  KV_ASSIGN_OR_RETURN(t.info, MakeTensorInfo(name, type, ne));
  t.declared_only = true;
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

std::vector<GgufTensorInfo> GgufWriter::TensorInfos() const {
  const uint32_t alignment = Alignment();
  KV_CHECK(alignment != 0, "general.alignment is not a power of two in [1, {}]", kGgufMaxAlignment);
  std::vector<GgufTensorInfo> out;
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    out.push_back(t.info);
    out.back().offset = offset;
    offset = AlignUp(offset + t.info.n_bytes, alignment);
  }
  return out;
}

uint32_t GgufWriter::Alignment() const {
  for (const GgufKv& kv : kvs_) {
    if (kv.key != "general.alignment") continue;
    std::optional<uint64_t> a = kv.value.AsUint();
    if (!a || !std::has_single_bit(*a) || *a > kGgufMaxAlignment) {
      return 0;
    }
    return static_cast<uint32_t>(*a);
  }
  return kGgufDefaultAlignment;
}

std::vector<uint8_t> GgufWriter::SerializeHeader() const {
  const uint32_t alignment = Alignment();
  KV_CHECK(alignment != 0, "general.alignment is not a power of two in [1, {}]", kGgufMaxAlignment);
  std::vector<uint8_t> out;
  Put<uint32_t>(out, kGgufMagic);
  Put<uint32_t>(out, kWriteVersion);
  Put<uint64_t>(out, tensors_.size());
  Put<uint64_t>(out, kvs_.size());
  for (const GgufKv& kv : kvs_) {
    PutString(out, kv.key);
    Put<uint32_t>(out, static_cast<uint32_t>(kv.value.type));
    PutValue(out, kv.value);
  }
  for (const GgufTensorInfo& t : TensorInfos()) {
    PutString(out, t.name);
    Put<uint32_t>(out, t.n_dims);
    for (uint32_t j = 0; j < t.n_dims; ++j) Put<uint64_t>(out, t.ne[j]);
    Put<uint32_t>(out, t.type);
    Put<uint64_t>(out, t.offset);
  }
  out.resize(AlignUp(out.size(), alignment), 0);
  return out;
}

Status GgufWriter::Write(const std::string& path) const {
  const uint32_t alignment = Alignment();
  if (alignment == 0) {
    const GgufValue* v = nullptr;
    for (const GgufKv& kv : kvs_) {
      if (kv.key == "general.alignment") v = &kv.value;
    }
    return Error("{}: general.alignment {} is not a power of two in [1, {}]", path,
                 v != nullptr ? v->ToDisplayString() : "?", kGgufMaxAlignment);
  }
  for (const Tensor& t : tensors_) {
    if (t.declared_only) {
      return Error("{}: tensor {} has no data (declared for GgufStreamWriter)", path, t.info.name);
    }
  }
  KV_ASSIGN_OR_RETURN(std::unique_ptr<GgufStreamWriter> out, GgufStreamWriter::Create(*this, path));
  for (const Tensor& t : tensors_) {
    KV_RETURN_IF_ERROR(out->Append(t.data.empty() ? std::span(t.owned) : t.data));
  }
  return out->Finish();
}

// ---- GgufStreamWriter ------------------------------------------------------------------------

struct GgufStreamWriter::State {
  std::string path;
  std::string tmp;
  int fd = -1;
  std::unique_ptr<FdWriter> out;
  uint32_t alignment = kGgufDefaultAlignment;
  std::vector<GgufTensorInfo> tensors;
  size_t current = 0;         // tensor receiving the next byte
  uint64_t current_done = 0;  // bytes of it written so far
  bool failed = false;

  Status Fail(const Status& st) {
    failed = true;
    return st.WithContext(fmt::format("{} (writing {})", path, tmp));
  }
  // Skips over finished tensors (and zero-byte ones), writing their padding.
  Status Advance() {
    while (current < tensors.size() && current_done == tensors[current].n_bytes) {
      const uint64_t n = tensors[current].n_bytes;
      KV_RETURN_IF_ERROR(out->AppendZeros(AlignUp(n, alignment) - n));
      ++current;
      current_done = 0;
    }
    return Status::Ok();
  }
};

GgufStreamWriter::GgufStreamWriter(std::unique_ptr<State> state) : state_(std::move(state)) {}

GgufStreamWriter::~GgufStreamWriter() {
  if (state_ != nullptr && state_->fd >= 0) {
    ::close(state_->fd);
    ::unlink(state_->tmp.c_str());
  }
}

Result<std::unique_ptr<GgufStreamWriter>> GgufStreamWriter::Create(const GgufWriter& layout,
                                                                   const std::string& path) {
  auto state = std::make_unique<State>();
  state->path = path;
  state->alignment = layout.Alignment();
  if (state->alignment == 0) {
    return Error("{}: general.alignment is not a power of two in [1, {}]", path, kGgufMaxAlignment);
  }
  state->tensors = layout.TensorInfos();
  state->tmp = path + ".tmp-XXXXXX";
  state->fd = mkostemp(state->tmp.data(), O_CLOEXEC);
  if (state->fd < 0) {
    return Error("{}: cannot create {}: {}", path, state->tmp, std::strerror(errno));
  }
  std::unique_ptr<GgufStreamWriter> w(new GgufStreamWriter(std::move(state)));
  State& s = *w->state_;
  if (fchmod(s.fd, 0644) != 0) return s.Fail(Error("chmod: {}", std::strerror(errno)));
  s.out = std::make_unique<FdWriter>(s.fd);
  if (Status st = s.out->Append(layout.SerializeHeader()); !st.ok()) return s.Fail(st);
  if (Status st = s.Advance(); !st.ok()) return s.Fail(st);
  return w;
}

size_t GgufStreamWriter::current_tensor() const { return state_->current; }

Status GgufStreamWriter::Append(std::span<const uint8_t> bytes) {
  State& s = *state_;
  if (s.failed) return Error("{}: write already failed", s.path);
  while (!bytes.empty()) {
    if (s.current >= s.tensors.size()) {
      return s.Fail(Error("{} bytes past the end of the last tensor", bytes.size()));
    }
    const GgufTensorInfo& t = s.tensors[s.current];
    const uint64_t take = std::min<uint64_t>(bytes.size(), t.n_bytes - s.current_done);
    if (Status st = s.out->Append(bytes.first(take)); !st.ok()) return s.Fail(st);
    s.current_done += take;
    bytes = bytes.subspan(take);
    if (Status st = s.Advance(); !st.ok()) return s.Fail(st);
  }
  return Status::Ok();
}

Status GgufStreamWriter::Finish() {
  State& s = *state_;
  if (s.failed || s.fd < 0) return Error("{}: write already failed or finished", s.path);
  if (s.current < s.tensors.size()) {
    const GgufTensorInfo& t = s.tensors[s.current];
    return s.Fail(Error("tensor {} has {} of its {} bytes", t.name, s.current_done, t.n_bytes));
  }
  if (Status st = s.out->Flush(); !st.ok()) return s.Fail(st);
  if (::fsync(s.fd) != 0) return s.Fail(Error("fsync: {}", std::strerror(errno)));
  const int fd = s.fd;
  s.fd = -1;
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(s.tmp.c_str());
    return Error("{}: close of {} failed: {}", s.path, s.tmp, std::strerror(e));
  }
  if (::rename(s.tmp.c_str(), s.path.c_str()) != 0) {
    const int e = errno;
    ::unlink(s.tmp.c_str());
    return Error("{}: cannot rename {} to it: {}", s.path, s.tmp, std::strerror(e));
  }
  return Status::Ok();
}

}  // namespace kvasir
