#include "metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <absl/strings/ascii.h>
#include <absl/strings/escaping.h>
#include <absl/strings/str_cat.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "kiln/proto/service.h"

namespace kiln::worker {

// See Note [Metrics endpoint] (metrics.h): one thread serves every connection at once with
// poll(), each with a deadline for its whole exchange, so slow or half-open clients cannot hold
// a scrape back.
class Metrics::Endpoint {
 public:
  Endpoint(std::shared_ptr<prometheus::Registry> registry, std::string token)
      : registry_(std::move(registry)), token_(std::move(token)) {}
  ~Endpoint() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) close(fd_);
  }

  absl::Status start(const std::string& listen) {
    const size_t colon = listen.rfind(':');
    std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
    if (host == "localhost") host = "127.0.0.1";
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    int port = -1;
    if (colon != std::string::npos) port = std::atoi(listen.c_str() + colon + 1);
    if (port < 0 || port > 65535 || inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
      return absl::InvalidArgumentError(
          absl::StrCat("cannot serve metrics on '", listen, "': expected IPV4:PORT"));
    addr.sin_port = htons(static_cast<uint16_t>(port));
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof addr;
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(fd_, 128) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      return absl::InvalidArgumentError(
          absl::StrCat("cannot serve metrics on '", listen, "': ", std::strerror(errno)));
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
    return absl::OkStatus();
  }
  int port() const { return port_; }

  // A connection has this long to send its request and take the answer.
  static constexpr auto kDeadline = std::chrono::seconds(2);
  // Open connections beyond this close the one nearest its deadline.
  static constexpr size_t kMaxConnections = 64;
  static constexpr size_t kMaxRequestBytes = 16384;

 private:
  using Clock = std::chrono::steady_clock;
  struct Conn {
    int fd;
    Clock::time_point deadline;
    std::string in, out;  // out: the answer, once the request is in
    size_t sent = 0;
    bool done = false;
  };

  void serve() {
    std::vector<Conn> conns;
    std::vector<pollfd> fds;
    while (!stop_) {
      fds.assign(1, pollfd{fd_, POLLIN, 0});
      for (const Conn& c : conns) fds.push_back({c.fd, c.out.empty() ? POLLIN : POLLOUT, 0});
      if (poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) continue;
      const Clock::time_point now = Clock::now();
      for (size_t i = 0; i < conns.size(); ++i)
        if (fds[i + 1].revents) step(conns[i]);
      if (fds[0].revents & POLLIN) accept_all(conns, now);
      for (Conn& c : conns)
        if (now >= c.deadline) c.done = true;
      std::erase_if(conns, [](const Conn& c) {
        if (c.done) close(c.fd);
        return c.done;
      });
    }
    for (const Conn& c : conns) close(c.fd);
  }

  void accept_all(std::vector<Conn>& conns, Clock::time_point now) {
    for (int c; (c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0;) {
      if (conns.size() >= kMaxConnections) {
        auto oldest = std::min_element(conns.begin(), conns.end(), [](const Conn& a, const Conn& b) {
          return a.deadline < b.deadline;
        });
        close(oldest->fd);
        conns.erase(oldest);
      }
      conns.push_back(Conn{c, now + kDeadline});
    }
  }

  // Reads what the client sent, or writes what is left of the answer; marks the end.
  void step(Conn& c) {
    if (c.out.empty()) {
      char buf[2048];
      const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      if (n > 0) c.in.append(buf, static_cast<size_t>(n));
      const bool whole = c.in.find("\r\n\r\n") != std::string::npos;
      if (n > 0 && !whole && c.in.size() < kMaxRequestBytes) return;
      if (n < 0 || c.in.empty()) {  // the client left without asking
        c.done = true;
        return;
      }
      c.out = answer(c.in);
    }
    // MSG_NOSIGNAL: a client that has gone must not SIGPIPE the worker.
    const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n > 0) c.sent += static_cast<size_t>(n);
    c.done = n <= 0 || c.sent == c.out.size();
  }

  std::string answer(const std::string& req) const {
    auto respond = [](const char* status, const std::string& extra, const std::string& body) {
      return absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Length: ", body.size(),
                          "\r\nConnection: close\r\n", extra, "\r\n", body);
    };
    if (req.rfind("GET /metrics ", 0) != 0 && req.rfind("GET /metrics?", 0) != 0)
      return respond("404 Not Found", "", "only GET /metrics is served here\n");
    if (!token_.empty() && !authorized(req))
      return respond("401 Unauthorized", "WWW-Authenticate: Basic realm=\"kiln-worker\"\r\n",
                     "basic auth with the worker's token as password\n");
    return respond("200 OK", "Content-Type: text/plain; version=0.0.4\r\n",
                   prometheus::TextSerializer().Serialize(registry_->Collect()));
  }

  // "Authorization: Basic base64(user:token)" (any user).
  bool authorized(const std::string& req) const {
    const std::string lower = absl::AsciiStrToLower(req);
    const size_t at = lower.find("\r\nauthorization: basic ");
    if (at == std::string::npos) return false;
    const size_t begin = at + std::strlen("\r\nauthorization: basic ");
    const size_t end = req.find("\r\n", begin);
    std::string decoded;
    if (!absl::Base64Unescape(req.substr(begin, end - begin), &decoded)) return false;
    const size_t colon = decoded.find(':');
    return colon != std::string::npos && decoded.substr(colon + 1) == token_;
  }

  std::shared_ptr<prometheus::Registry> registry_;
  std::string token_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  instructions_ = &prometheus::BuildCounter()
                       .Name("kiln_worker_instructions_total")
                       .Help("Instructions executed (failed ones included)")
                       .Register(*registry_)
                       .Add({});
  compiled_ = &prometheus::BuildCounter()
                   .Name("kiln_worker_compiled_steps_total")
                   .Help("Recorded segments that ran as compiled graphs (the compiled-graph cache)")
                   .Register(*registry_)
                   .Add({});
  memory_ = &prometheus::BuildGauge()
                 .Name("kiln_worker_memory_in_use_bytes")
                 .Help("Bytes of the distinct storages held by all sessions' value tables")
                 .Register(*registry_)
                 .Add({});
  // From a tiny step (1 ms) to a long one (about a minute).
  step_ = &prometheus::BuildHistogram()
               .Name("kiln_worker_step_seconds")
               .Help("Time between two Syncs of a session (one training step)")
               .Register(*registry_)
               .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025,
                                                                0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                                                10, 30, 60});
}

Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::create(const std::string& listen,
                                                         const std::string& token) {
  std::unique_ptr<Metrics> m(new Metrics());
  if (listen.empty()) return m;
  if (auto st = proto::check_listen_address(listen, !token.empty()); !st.ok()) return st;
  m->endpoint_ = std::make_unique<Endpoint>(m->registry_, token);
  if (auto st = m->endpoint_->start(listen); !st.ok()) return st;
  return m;
}

void Metrics::add_instructions(uint64_t n) { instructions_->Increment(static_cast<double>(n)); }
void Metrics::add_compiled_runs(uint64_t n) { compiled_->Increment(static_cast<double>(n)); }
void Metrics::add_memory(int64_t delta) { memory_->Increment(static_cast<double>(delta)); }
void Metrics::observe_step(double seconds) { step_->Observe(seconds); }
int Metrics::port() const { return endpoint_ ? endpoint_->port() : 0; }

}  // namespace kiln::worker
