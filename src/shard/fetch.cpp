#include "shard/fetch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "base/human.h"
#include "base/log.h"
#include "base/sha256.h"
#include "gguf/gguf_file.h"
#include "net/http_client.h"
#include "shard/slice.h"

namespace kvasir {
namespace {

// Most headers fit (a 32k-token vocabulary is ~0.5 MiB); bigger ones take a few more requests,
// each asking for at least four times as much.
constexpr uint64_t kFirstHeaderRequest = uint64_t{256} << 10;
// The reader refuses headers above 256 MiB; a little more covers the padding.
constexpr uint64_t kMaxHeaderBytes = (uint64_t{256} << 20) + (uint64_t{1} << 20);
constexpr int kStateVersion = 1;

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Runs `attempt` until it succeeds, fails for good, or has been tried retry.retries + 1 times,
// waiting delay, 2*delay, ... (at most 8 s) in between.
Status WithRetries(net::HttpClient& client, const RetryPolicy& retry,
                   const std::function<Status()>& attempt, const std::atomic<bool>* abort) {
  const int attempts = std::max(retry.retries, 0) + 1;
  int delay_ms = retry.delay_ms;
  Status last;
  for (int i = 1;; ++i) {
    last = attempt();
    if (last.ok() || !client.retryable() || i >= attempts) break;
    if (abort != nullptr && abort->load()) break;
    KV_LOG_WARN("fetch: {} (attempt {} of {}; retrying in {:.1f} s)", last.message(), i, attempts,
                delay_ms / 1000.0);
    SleepMs(delay_ms);
    delay_ms = std::min(delay_ms * 2, 8000);
  }
  if (!last.ok() && client.retryable()) {
    return last.WithContext(
        fmt::format("gave up after {} attempt{}", attempts, attempts == 1 ? "" : "s"));
  }
  return last;
}

// The validators of `reply` against those of the header read: equal, or an error saying the file
// changed (a server that ignored If-Range, or a weak ETag that moved).
Status SameFile(const RemoteHeader& rh, const net::RangeReply& reply) {
  if (reply.total_size == rh.file_size && reply.etag == rh.etag &&
      reply.last_modified == rh.last_modified) {
    return Status::Ok();
  }
  std::string what;
  auto add = [&](const char* name, const std::string& a, const std::string& b) {
    if (a == b) return;
    if (!what.empty()) what += ", ";
    what += fmt::format("{} '{}' -> '{}'", name, a, b);
  };
  add("size", std::to_string(rh.file_size), std::to_string(reply.total_size));
  add("ETag", rh.etag, reply.etag);
  add("Last-Modified", rh.last_modified, reply.last_modified);
  return Error("the file at {} changed during the download ({})", rh.url, what);
}

// One place in the output that bytes of the parent go to.
struct Segment {
  uint64_t src = 0;  // absolute offset in the parent
  uint64_t dst = 0;  // absolute offset in the slice
  uint64_t len = 0;
};

// One range request: parent bytes [src, src + len), of which `segments` (sorted, inside the
// range) are kept; the rest is alignment padding or small gaps between tensors.
struct Piece {
  uint64_t src = 0, len = 0;
  std::vector<Segment> segments;
  uint64_t window_bytes = 0;  // sum of segment lengths
};

std::vector<Piece> PlanPieces(std::vector<Segment> segs, uint64_t max_gap, uint64_t max_len) {
  std::sort(segs.begin(), segs.end(),
            [](const Segment& a, const Segment& b) { return a.src < b.src; });
  std::vector<Piece> pieces;
  size_t i = 0;
  while (i < segs.size()) {
    // A run of segments separated by small gaps.
    size_t j = i + 1;
    uint64_t end = segs[i].src + segs[i].len;
    while (j < segs.size() && segs[j].src >= end && segs[j].src - end <= max_gap) {
      end = segs[j].src + segs[j].len;
      ++j;
    }
    // Cut the run [segs[i].src, end) into pieces of at most max_len bytes.
    for (uint64_t at = segs[i].src; at < end;) {
      Piece p;
      p.src = at;
      p.len = std::min(max_len, end - at);
      for (size_t k = i; k < j; ++k) {
        const uint64_t a = std::max(segs[k].src, p.src);
        const uint64_t b = std::min(segs[k].src + segs[k].len, p.src + p.len);
        if (a >= b) continue;
        p.segments.push_back({a, segs[k].dst + (a - segs[k].src), b - a});
        p.window_bytes += b - a;
      }
      // Do not start a piece in a gap: trim leading and trailing gap bytes.
      if (!p.segments.empty()) {
        const uint64_t first = p.segments.front().src;
        const uint64_t last = p.segments.back().src + p.segments.back().len;
        p.src = first;
        p.len = last - first;
        pieces.push_back(std::move(p));
      }
      at += std::min(max_len, end - at);
    }
    i = j;
  }
  return pieces;
}

Status WriteAllAt(int fd, const uint8_t* data, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, data, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Error("{}: write failed: {}", path, std::strerror(errno));
    }
    data += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

void RemoveQuietly(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

Status SyncDirOf(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::filesystem::path dir = parent.empty() ? std::filesystem::path(".") : parent;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Ok();
  ::fsync(fd);
  ::close(fd);
  return Status::Ok();
}

// The identity of a download: resuming is only safe into the same layout from the same file. The
// URL is not part of it, so a fetch may resume from a mirror serving the same bytes (same size and
// validators).
nlohmann::json StateIdentity(const FetchOptions& o, const RemoteHeader& rh,
                             const std::string& layout_sha) {
  return {{"version", kStateVersion},
          {"file_size", rh.file_size},
          {"etag", rh.etag},
          {"last_modified", rh.last_modified},
          {"layout_sha256", layout_sha},
          {"first", o.first},
          {"last", o.last}};
}

Status SaveState(const std::string& path, const std::string& url, const nlohmann::json& identity,
                 const std::vector<Piece>& pieces, const std::vector<char>& done) {
  nlohmann::json j = identity;
  j["url"] = url;
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (done[i]) list.push_back({pieces[i].src, pieces[i].len});
  }
  j["done"] = list;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump() << "\n";
    out.flush();
    if (!out) return Error("{}: cannot write: {}", tmp, std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return Error("{}: cannot rename {} to it: {}", path, tmp, std::strerror(errno));
  }
  return Status::Ok();
}

// Pieces recorded as complete by an earlier run with the same identity; empty (and a log line
// saying why) when there is nothing to resume.
std::set<std::pair<uint64_t, uint64_t>> LoadState(const std::string& state_path,
                                                  const std::string& part_path,
                                                  const nlohmann::json& identity,
                                                  uint64_t part_size) {
  std::set<std::pair<uint64_t, uint64_t>> done;
  std::ifstream in(state_path);
  if (!in) return done;
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception&) {
    KV_LOG_WARN("fetch: {} is unreadable; starting over", state_path);
    return done;
  }
  for (const auto& [key, value] : identity.items()) {
    if (!j.contains(key) || j[key] != value) {
      KV_LOG_WARN("fetch: {} is from a different download ({} differs); starting over", state_path,
                  key);
      return done;
    }
  }
  std::error_code ec;
  if (std::filesystem::file_size(part_path, ec) != part_size || ec) {
    KV_LOG_WARN("fetch: {} is missing or has the wrong size; starting over", part_path);
    return done;
  }
  try {
    for (const auto& e : j.at("done")) {
      done.insert({e.at(0).get<uint64_t>(), e.at(1).get<uint64_t>()});
    }
  } catch (const std::exception&) {
    KV_LOG_WARN("fetch: {} is malformed; starting over", state_path);
    done.clear();
  }
  return done;
}

Status CheckSha256(const GgufFile& file, const std::map<std::string, std::string>& sha256,
                   const std::string& url, int* verified) {
  for (const auto& [name, want] : sha256) {
    const GgufTensorInfo* t = file.FindTensor(name);
    if (t == nullptr) return Error("tensor {} is in the manifest but not in the slice", name);
    const std::string got = Sha256Hex(Sha256Of(file.TensorData(*t)));
    if (got != want) {
      return Error("tensor {}: SHA-256 {} does not match the manifest's {} (downloaded from {})",
                   name, got, want, url);
    }
    ++*verified;
  }
  return Status::Ok();
}

}  // namespace

Result<RemoteHeader> ReadRemoteHeader(const std::string& url_text, const net::HttpOptions& http,
                                      const RetryPolicy& retry) {
  KV_ASSIGN_OR_RETURN(net::Url url, net::ParseUrl(url_text));
  KV_ASSIGN_OR_RETURN(std::unique_ptr<net::HttpClient> client, net::HttpClient::Create(url, http));
  RemoteHeader rh;
  uint64_t want = kFirstHeaderRequest;
  for (;;) {
    const uint64_t have = rh.bytes.size();
    net::RangeReply reply;
    Status s = WithRetries(
        *client, retry,
        [&]() -> Status {
          rh.bytes.resize(have);
          return client->GetRange(
              net::RangeRequest{have, want - have, /*clamp_at_eof=*/true, rh.if_range},
              [&](std::span<const uint8_t> b) {
                rh.bytes.insert(rh.bytes.end(), b.begin(), b.end());
                return Status::Ok();
              },
              &reply);
        },
        nullptr);
    rh.bytes_read += reply.received;
    if (!s.ok()) return s;
    if (have == 0) {
      rh.file_size = reply.total_size;
      rh.etag = reply.etag;
      rh.last_modified = reply.last_modified;
      rh.if_range = net::IfRangeValidator(reply.etag, reply.last_modified);
      rh.url = client->url().ToString();
    } else {
      KV_RETURN_IF_ERROR(SameFile(rh, reply));
    }
    rh.requests = client->requests();
    uint64_t needed = 0;
    auto parsed = ParseGgufHeader(rh.bytes, rh.file_size, rh.url, &needed);
    if (parsed.ok()) return rh;
    const bool at_eof = rh.file_size != 0 && rh.bytes.size() >= rh.file_size;
    if (needed == 0 || at_eof) return parsed.status();
    want = std::max(needed, want * 4);
    if (rh.file_size != 0) want = std::min(want, rh.file_size);
    if (want > kMaxHeaderBytes) {
      return Error("{}: GGUF header needs more than {} bytes; refusing", rh.url,
                   HumanBytes(kMaxHeaderBytes));
    }
  }
}

Status FetchSlice(const FetchOptions& o, FetchSummary* summary) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.out_path.empty()) return Error("no output path");
  if (o.connections < 1 || o.connections > 64) {
    return Error("connections must be in 1..64 (got {})", o.connections);
  }
  const std::filesystem::path dir = std::filesystem::path(o.out_path).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(dir)) {
    return Error("{}: directory {} does not exist", o.out_path, dir.string());
  }
  const std::string part_path = o.out_path + ".part";
  const std::string state_path = o.out_path + ".part.state";

  // 1. Header and tensor index.
  KV_ASSIGN_OR_RETURN(RemoteHeader rh, ReadRemoteHeader(o.url, o.http, o.retry));
  if (rh.if_range.empty() && o.sha256.empty()) {
    KV_LOG_WARN(
        "fetch: {} sends no strong ETag and no Last-Modified date, and there are no "
        "digests: the download cannot be checked (a file replaced on the server during "
        "it would go unnoticed)",
        rh.url);
  }
  KV_ASSIGN_OR_RETURN(GgufHeader header, ParseGgufHeader(rh.bytes, rh.file_size, rh.url));
  const uint64_t data_offset = header.data_offset;
  const uint32_t alignment = header.alignment;
  GgufFile parent = GgufFile::HeaderOnly(std::move(header), rh.url, rh.file_size);
  KV_ASSIGN_OR_RETURN(SlicePlan plan, PlanSlice(parent, o.first, o.last));
  if (o.expected_model_id && *o.expected_model_id != plan.parent_model_id) {
    return Error("{}: serves model {}, the manifest names model {}", rh.url, plan.parent_model_id,
                 *o.expected_model_id);
  }
  for (const auto& entry : o.sha256) {
    const std::string& name = entry.first;
    const bool in_window = std::any_of(plan.source.begin(), plan.source.end(),
                                       [&](const GgufTensorInfo& t) { return t.name == name; });
    if (!in_window) {
      return Error("the manifest lists tensor {} for layers {}:{}, which do not hold it", name,
                   o.first, o.last);
    }
  }

  // 2. The slice's layout: header bytes, then each tensor at its aligned offset.
  const std::vector<uint8_t> out_header = plan.layout.SerializeHeader();
  const std::vector<GgufTensorInfo> infos = plan.layout.TensorInfos();
  uint64_t out_size = out_header.size();
  std::vector<Segment> segments;
  for (size_t i = 0; i < infos.size(); ++i) {
    const uint64_t end = out_header.size() + infos[i].offset + infos[i].n_bytes;
    out_size = std::max<uint64_t>(out_size,
                                  out_header.size() + AlignUp(end - out_header.size(), alignment));
    if (infos[i].n_bytes == 0) continue;
    segments.push_back({data_offset + plan.source[i].offset, out_header.size() + infos[i].offset,
                        infos[i].n_bytes});
  }
  // Bytes the header read already brought (the start of the first tensors) are not fetched again.
  uint64_t from_header = 0;
  std::vector<Segment> to_fetch;
  std::vector<Segment> copy_now;
  for (Segment sg : segments) {
    if (sg.src < rh.bytes.size()) {
      const uint64_t n = std::min<uint64_t>(sg.len, rh.bytes.size() - sg.src);
      copy_now.push_back({sg.src, sg.dst, n});
      from_header += n;
      sg.src += n;
      sg.dst += n;
      sg.len -= n;
    }
    if (sg.len > 0) to_fetch.push_back(sg);
  }
  std::vector<Piece> pieces = PlanPieces(to_fetch, o.max_gap_bytes, o.max_request_bytes);

  FetchSummary sum;
  sum.url = rh.url;
  sum.file_bytes = rh.file_size;
  sum.header_bytes = rh.bytes_read;
  sum.n_tensors = plan.summary.n_tensors;
  sum.window_bytes = plan.summary.bytes;
  sum.downloaded_bytes = rh.bytes_read;
  sum.requests = 0;
  sum.out_bytes = out_size;
  sum.digests = static_cast<int>(o.sha256.size());
  if (!rh.if_range.empty()) {
    sum.pinned_by = fmt::format("{} {}", net::IsStrongEtag(rh.if_range) ? "ETag" : "Last-Modified",
                                rh.if_range);
  }

  // 3. Resume what an earlier run left, or start a fresh part file.
  const std::string layout_sha = Sha256Hex(Sha256Of(out_header));
  const nlohmann::json identity = StateIdentity(o, rh, layout_sha);
  const auto resumable = LoadState(state_path, part_path, identity, out_size);
  std::vector<char> done(pieces.size(), 0);
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (resumable.count({pieces[i].src, pieces[i].len}) != 0) {
      done[i] = 1;
      sum.resumed_bytes += pieces[i].window_bytes;
    }
  }
  if (sum.resumed_bytes == 0) {
    RemoveQuietly(part_path);
    RemoveQuietly(state_path);
  } else {
    KV_LOG_INFO("fetch: resuming {}: {} of {} already on disk", part_path,
                HumanBytes(sum.resumed_bytes), HumanBytes(sum.window_bytes));
  }
  const int fd = ::open(part_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Error("{}: cannot create: {}", part_path, std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};
  auto fail_remove = [&](Status s) {
    ::close(fd);
    closer.fd = -1;
    RemoveQuietly(part_path);
    RemoveQuietly(state_path);
    return s;
  };
  if (::ftruncate(fd, static_cast<off_t>(out_size)) != 0) {
    return fail_remove(
        Error("{}: cannot size to {} bytes: {}", part_path, out_size, std::strerror(errno)));
  }
  if (int e = ::posix_fallocate(fd, 0, static_cast<off_t>(out_size));
      e != 0 && e != EOPNOTSUPP && e != EINVAL) {
    return fail_remove(Error("{}: cannot reserve {} for the slice: {}", part_path,
                             HumanBytes(out_size), std::strerror(e)));
  }
  if (Status s = WriteAllAt(fd, out_header.data(), out_header.size(), 0, part_path); !s.ok()) {
    return fail_remove(s);
  }
  for (const Segment& sg : copy_now) {
    if (Status s = WriteAllAt(fd, rh.bytes.data() + sg.src, sg.len, sg.dst, part_path); !s.ok()) {
      return fail_remove(s);
    }
  }

  // 4. Tensor bytes: `connections` workers take pieces in order.
  std::mutex mu;
  std::atomic<size_t> next{0};
  std::atomic<bool> abort{false};
  std::atomic<uint64_t> done_bytes{sum.resumed_bytes + from_header};
  std::atomic<uint64_t> downloaded{0};
  std::atomic<uint64_t> requests{0};
  Status first_error;
  bool error_retryable = false;
  bool file_changed = false;
  net::Url final_url;
  {
    auto u = net::ParseUrl(rh.url);
    if (!u.ok()) return fail_remove(u.status());
    final_url = *u;
  }
  const auto transfer_start = std::chrono::steady_clock::now();
  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };

  auto worker = [&]() {
    auto made = net::HttpClient::Create(final_url, o.http);
    if (!made.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) first_error = made.status();
      abort = true;
      return;
    }
    net::HttpClient& client = **made;
    for (size_t i = next++; i < pieces.size() && !abort.load(); i = next++) {
      if (done[i]) continue;
      const Piece& p = pieces[i];
      uint64_t got = 0;  // bytes of the piece received so far (kept across retries)
      size_t seg = 0;
      Status s = WithRetries(
          client, o.retry,
          [&]() -> Status {
            if (abort.load()) return Error("stopped");
            net::RangeReply reply;
            const uint64_t start = p.src + got;
            Status r = client.GetRange(
                net::RangeRequest{start, p.len - got, false, rh.if_range},
                [&](std::span<const uint8_t> b) -> Status {
                  // Scatter the bytes of parent range [src+got, +b.size()) into the segments.
                  uint64_t pos = p.src + got;
                  const uint64_t end = pos + b.size();
                  uint64_t window = 0;
                  while (seg < p.segments.size() && pos < end) {
                    const Segment& sg = p.segments[seg];
                    if (pos < sg.src) {
                      pos = std::min(end, sg.src);
                      continue;
                    }
                    const uint64_t take = std::min(end, sg.src + sg.len) - pos;
                    KV_RETURN_IF_ERROR(WriteAllAt(fd, b.data() + (pos - (p.src + got)), take,
                                                  sg.dst + (pos - sg.src), part_path));
                    window += take;
                    pos += take;
                    if (pos == sg.src + sg.len) ++seg;
                  }
                  got += b.size();
                  downloaded += b.size();
                  done_bytes += window;
                  return abort.load() ? Error("stopped") : Status::Ok();
                },
                &reply);
            if (!r.ok()) return r;
            Status same = SameFile(rh, reply);
            if (!same.ok()) {
              std::lock_guard<std::mutex> lock(mu);
              file_changed = true;
            }
            return same;
          },
          &abort);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok() && !abort.load()) {
          first_error = s;
          error_retryable = client.retryable();
        }
        if (client.failure() == net::HttpFailure::kChanged) file_changed = true;
        abort = true;
        break;
      }
      std::lock_guard<std::mutex> lock(mu);
      done[i] = 1;
      ::fdatasync(fd);
      if (Status st = SaveState(state_path, o.url, identity, pieces, done);
          !st.ok() && first_error.ok()) {
        first_error = st;
        abort = true;
      }
    }
    requests += client.requests();
  };

  std::atomic<bool> finished{false};
  std::mutex report_mu;
  std::condition_variable report_cv;
  std::thread reporter;
  if (o.progress) {
    reporter = std::thread([&] {
      std::unique_lock<std::mutex> lock(report_mu);
      while (!finished.load()) {
        report_cv.wait_for(lock, std::chrono::milliseconds(200));
        if (finished.load()) break;
        o.progress({done_bytes.load(), sum.window_bytes, sum.resumed_bytes,
                    seconds_since(transfer_start)});
      }
    });
  }
  const int n_workers =
      static_cast<int>(std::min<size_t>(o.connections, std::max<size_t>(pieces.size(), 1)));
  std::vector<std::thread> workers;
  for (int w = 0; w < n_workers; ++w) workers.emplace_back(worker);
  for (std::thread& t : workers) t.join();
  {
    std::lock_guard<std::mutex> lock(report_mu);
    finished = true;
  }
  report_cv.notify_all();
  if (reporter.joinable()) reporter.join();
  if (o.progress) {
    o.progress(
        {done_bytes.load(), sum.window_bytes, sum.resumed_bytes, seconds_since(transfer_start)});
  }
  sum.downloaded_bytes += downloaded.load();
  sum.requests = rh.requests + requests.load();

  if (!first_error.ok()) {
    if (file_changed) {
      // Pieces of two versions of a file make no model: none of them can be kept.
      return fail_remove(Status::Error(fmt::format("{}; the pieces fetched so far are unusable "
                                                   "and were removed: run the fetch again",
                                                   first_error.message()),
                                       first_error.code()));
    }
    const bool any_done = std::any_of(done.begin(), done.end(), [](char d) { return d != 0; });
    if (error_retryable && any_done) {
      uint64_t kept = 0;
      for (size_t i = 0; i < pieces.size(); ++i) kept += done[i] ? pieces[i].window_bytes : 0;
      if (summary != nullptr) *summary = sum;
      return Status::Error(fmt::format("{}; {} of {} are kept in {}: run the same command again "
                                       "to resume",
                                       first_error.message(), HumanBytes(kept),
                                       HumanBytes(sum.window_bytes), part_path),
                           first_error.code());
    }
    return fail_remove(first_error);
  }

  // 5. Verify what arrived, then move it into place.
  if (::fsync(fd) != 0) {
    return fail_remove(Error("{}: fsync failed: {}", part_path, std::strerror(errno)));
  }
  ::close(fd);
  closer.fd = -1;
  {
    auto file = GgufFile::Open(part_path);
    if (!file.ok()) return fail_remove(file.status().WithContext("the fetched slice is invalid"));
    if (file->file_size() != out_size) {
      return fail_remove(
          Error("{}: size {} differs from the planned {}", part_path, file->file_size(), out_size));
    }
    int verified = 0;
    if (Status s = CheckSha256(*file, o.sha256, rh.url, &verified); !s.ok()) return fail_remove(s);
    sum.verified_tensors = verified;
  }
  if (::rename(part_path.c_str(), o.out_path.c_str()) != 0) {
    return fail_remove(
        Error("{}: cannot rename {} to it: {}", o.out_path, part_path, std::strerror(errno)));
  }
  RemoveQuietly(state_path);
  (void)SyncDirOf(o.out_path);
  sum.seconds = seconds_since(t0);
  if (summary != nullptr) *summary = sum;
  return Status::Ok();
}

std::string DescribeVerification(const FetchSummary& s) {
  if (s.digests > 0) {
    std::string out = fmt::format("verified: {} tensors SHA-256", s.verified_tensors);
    if (s.verified_tensors < s.n_tensors) {
      out += fmt::format(" ({} of {} tensors have no digest)", s.n_tensors - s.verified_tensors,
                         s.n_tensors);
    }
    return out;
  }
  if (!s.pinned_by.empty()) {
    return fmt::format(
        "not verified: no digests (the download was pinned to one version of the "
        "file by {})",
        s.pinned_by);
  }
  return "not verified: no digests (and the server sent no strong ETag or Last-Modified date to "
         "pin the file with: a file replaced during the download would go unnoticed)";
}

Status VerifySlice(const std::string& path, const std::string& model_id, int first, int last,
                   const std::map<std::string, std::string>& sha256) {
  KV_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
  KV_ASSIGN_OR_RETURN(std::string id, file.GetString("kvasir.model_id"));
  if (id != model_id) return Error("{}: a slice of model {}, not {}", path, id, model_id);
  KV_ASSIGN_OR_RETURN(uint64_t f, file.GetUint("kvasir.window.first"));
  KV_ASSIGN_OR_RETURN(uint64_t l, file.GetUint("kvasir.window.last"));
  if (f != static_cast<uint64_t>(first) || l != static_cast<uint64_t>(last)) {
    return Error("{}: holds layers {}:{}, not {}:{}", path, f, l, first, last);
  }
  int verified = 0;
  return CheckSha256(file, sha256, path, &verified).WithContext(path);
}

}  // namespace kvasir
