#include "nginx_fixture.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "net/stream.h"

namespace kvasir::testing {
namespace {

uint16_t FreePort() {
  auto l = net::Listener::Bind("127.0.0.1", 0);
  return l.ok() ? l->port() : 0;
}

bool PortOpen(uint16_t port) {
  auto s = net::DialTcp("127.0.0.1", port, 200);
  return s.ok();
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
  n->port_ = FreePort();
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
      n->tls_port_ = FreePort();
      tls_server = "  server {\n    listen 127.0.0.1:" + std::to_string(n->tls_port_) +
                   " ssl;\n    ssl_certificate " + n->cert_ + ";\n    ssl_certificate_key " +
                   key + ";\n    root " + o.root + ";\n  }\n";
    } else {
      n->cert_.clear();
    }
  }
  const std::string t = n->dir_ + "/tmp";
  n->conf_ = n->dir_ + "/nginx.conf";
  std::ofstream conf(n->conf_);
  conf << (::geteuid() == 0 ? "user root;\n" : "")
       << "daemon off;\nmaster_process off;\nworker_processes 1;\n"
       << "error_log " << n->error_log_ << " warn;\npid " << n->dir_ << "/nginx.pid;\n"
       << "events { worker_connections 256; }\n"
       << "http {\n  access_log off;\n  client_body_temp_path " << t << ";\n  proxy_temp_path "
       << t << ";\n  fastcgi_temp_path " << t << ";\n  uwsgi_temp_path " << t
       << ";\n  scgi_temp_path " << t << ";\n  default_type application/octet-stream;\n"
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
  pid_ = fork();
  if (pid_ == 0) {
    const std::string log = dir_ + "/stderr.log";
    freopen(log.c_str(), "w", stderr);
    freopen("/dev/null", "w", stdout);
    execl(bin.c_str(), bin.c_str(), "-p", dir_.c_str(), "-c", conf_.c_str(), nullptr);
    _exit(127);
  }
  for (int i = 0; i < 100; ++i) {
    if (PortOpen(port_) && (tls_port_ == 0 || PortOpen(tls_port_))) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      std::ifstream in(dir_ + "/stderr.log");
      std::string text((std::istreambuf_iterator<char>(in)), {});
      *why = "nginx exited at start: " + text;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  *why = "nginx did not open port " + std::to_string(port_) + " within 5 s";
  Kill();
  return false;
}

void Nginx::Kill() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
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
