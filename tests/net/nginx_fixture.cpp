#include "nginx_fixture.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "net/stream.h"

namespace kvasir::testing {
namespace {

// A loopback socket bound to a free port and listening, held until the fixture ends: nginx
// inherits it, so the port is never free for another process to take.
int BindLoopback(uint16_t* port) {
  auto l = net::Listener::Bind("127.0.0.1", 0);
  if (!l.ok()) return -1;
  *port = l->port();
  return l->Release();
}

// Sends an HTTP request to `port` and returns the connection (-1 on failure). A connection to a
// socket that is listening succeeds at once; the answer comes once nginx accepts it.
int SendProbe(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const char req[] = "HEAD /kvasir-nginx-probe HTTP/1.0\r\n\r\n";
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(req) - 1)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::string FindNginx() {
  for (const char* p : {"/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

std::unique_ptr<Nginx> Nginx::Start(const Options& o, std::string* why) {
  const std::string bin = FindNginx();
  if (bin.empty()) {
    *why = "no nginx binary in /usr/sbin, /usr/bin or /usr/local/sbin (apt-get install nginx)";
    return nullptr;
  }
  std::unique_ptr<Nginx> n(new Nginx());
  std::string tmpl = (std::filesystem::temp_directory_path() / "kvasir-nginx-XXXXXX").string();
  n->dir_ = mkdtemp(tmpl.data());
  std::filesystem::create_directories(n->dir_ + "/tmp");
  n->error_log_ = n->dir_ + "/error.log";
  n->fd_ = BindLoopback(&n->port_);
  if (n->fd_ < 0) {
    *why = "cannot bind a loopback port for nginx";
    return nullptr;
  }
  std::string tls_server;
  if (!o.tls) n->tls_why_ = "TLS is off (Nginx::Options::tls = false)";
  if (o.tls) {
    n->cert_ = n->dir_ + "/cert.pem";
    const std::string key = n->dir_ + "/key.pem";
    n->tls_why_ = MakeTestCertificate(n->cert_, key, "IP:127.0.0.1,DNS:localhost");
    if (!n->tls_why_.empty() && AssetsRequired()) {
      // CI must run the https half too: no certificate is a failure, not a quiet http-only nginx.
      *why = n->tls_why_ + " (KVASIR_REQUIRE_ASSETS=1: https is required)";
      return nullptr;
    }
    if (n->tls_why_.empty()) {
      n->tls_fd_ = BindLoopback(&n->tls_port_);
      if (n->tls_fd_ < 0) {
        *why = "cannot bind a loopback port for nginx's https";
        return nullptr;
      }
      tls_server = "  server {\n    listen 127.0.0.1:" + std::to_string(n->tls_port_) +
                   " ssl;\n    ssl_certificate " + n->cert_ + ";\n    ssl_certificate_key " + key +
                   ";\n    root " + o.root + ";\n  }\n";
    } else {
      n->cert_.clear();
    }
  }
  const std::string t = n->dir_ + "/tmp";
  n->conf_ = n->dir_ + "/nginx.conf";
  std::ofstream conf(n->conf_);
  conf << (::geteuid() == 0 ? "user root;\n" : "")
       // A master and one worker: nginx 1.22 crashes taking inherited sockets without a master.
       << "daemon off;\nworker_processes 1;\n"
       << "error_log " << n->error_log_ << " warn;\npid " << n->dir_ << "/nginx.pid;\n"
       << "events { worker_connections 256; }\n"
       << "http {\n  access_log off;\n  client_body_temp_path " << t << ";\n  proxy_temp_path " << t
       << ";\n  fastcgi_temp_path " << t << ";\n  uwsgi_temp_path " << t << ";\n  scgi_temp_path "
       << t << ";\n  default_type application/octet-stream;\n"
       << "  server {\n    listen 127.0.0.1:" << n->port_ << ";\n    root " << o.root << ";\n"
       << "    location /norange/ { alias " << o.root << "/; max_ranges 0; }\n"
       << "    location /slow/ { alias " << o.root << "/; limit_rate " << o.slow_rate << "; }\n"
       << "  }\n"
       << tls_server << "}\n";
  conf.close();
  if (!n->Launch(why)) return nullptr;
  return n;
}

bool Nginx::Launch(std::string* why) {
  const std::string bin = FindNginx();
  // nginx takes listening sockets over from the NGINX variable ("fd;fd;"), as in its binary
  // upgrade, and uses the one whose address a `listen` names instead of binding it.
  std::string inherited = std::to_string(fd_) + ";";
  if (tls_fd_ >= 0) inherited += std::to_string(tls_fd_) + ";";
  pid_ = fork();
  if (pid_ == 0) {
    setpgid(0, 0);  // the master and its worker in one group, for Kill()
    const std::string log = dir_ + "/stderr.log";
    freopen(log.c_str(), "w", stderr);
    freopen("/dev/null", "w", stdout);
    for (int fd : {fd_, tls_fd_}) {
      if (fd >= 0 && fcntl(fd, F_SETFD, 0) != 0) _exit(126);
    }
    setenv("NGINX", inherited.c_str(), 1);
    execl(bin.c_str(), bin.c_str(), "-p", dir_.c_str(), "-c", conf_.c_str(), nullptr);
    _exit(127);
  }
  setpgid(pid_, pid_);  // as the child does: whichever runs first
  // Requests wait in the sockets' backlog until nginx accepts them: an answer on each port says it
  // is serving; its exit says it will not.
  std::vector<pollfd> probes;
  for (uint16_t port : {port_, tls_port_}) {
    if (port == 0) continue;
    const int fd = SendProbe(port);
    if (fd < 0) {
      *why = "cannot send a request to nginx's port " + std::to_string(port);
      Kill();
      return false;
    }
    probes.push_back({fd, POLLIN, 0});
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  size_t answered = 0;
  bool exited = false;
  while (answered < probes.size() && !exited && std::chrono::steady_clock::now() < deadline) {
    if (::poll(probes.data(), probes.size(), 100) > 0) {
      for (pollfd& p : probes) {
        if (p.fd >= 0 && p.revents != 0) {
          ::close(p.fd);
          p.fd = -1;  // poll() skips it from now on
          ++answered;
        }
      }
    }
    int status = 0;
    exited = answered < probes.size() && waitpid(pid_, &status, WNOHANG) == pid_;
  }
  for (const pollfd& p : probes) {
    if (p.fd >= 0) ::close(p.fd);
  }
  if (answered == probes.size()) return true;
  if (exited) {
    pid_ = -1;
    std::ifstream in(dir_ + "/stderr.log");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    *why = "nginx exited at start: " + text;
    return false;
  }
  *why = "nginx did not answer on port " + std::to_string(port_) + " within 20 s";
  Kill();
  return false;
}

void Nginx::Kill() {
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);  // the master and its worker at once
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
}

bool Nginx::Restart(std::string* why) {
  Kill();
  return Launch(why);
}

Nginx::~Nginx() {
  Kill();
  for (int fd : {fd_, tls_fd_}) {
    if (fd >= 0) ::close(fd);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string Nginx::Url(const std::string& path) const {
  return "http://127.0.0.1:" + std::to_string(port_) + path;
}

std::string Nginx::TlsUrl(const std::string& path) const {
  if (tls_port_ == 0) return "";
  return "https://127.0.0.1:" + std::to_string(tls_port_) + path;
}

}  // namespace kvasir::testing
