// The rendezvous store (kiln/dist/store.h).
//
// Note [Store protocol]: a request is a length-prefixed message: u32 byte count, then a u8
// command and the fields, each a u32 length and its bytes. The reply has the same shape with a
// status byte in place of the command. The server is one thread polling the listening socket and
// its clients; every client request is answered at once (get/wait poll with check on the client
// side), so a stuck client never blocks the others for longer than one message.
#include "kiln/dist/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "kiln/error.h"

namespace kiln::dist {
namespace {

enum Command : uint8_t { kSet, kGet, kAdd, kCompareSet, kCheck, kDelete };
using Clock = std::chrono::steady_clock;
using Fields = std::vector<std::string>;

std::string endpoint(const std::string& host, int port) {
  return host + ":" + std::to_string(port);
}

sockaddr_in resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  KILN_CHECK(rc == 0 && res, Runtime, "TCPStore: cannot resolve ", endpoint(host, port), ": ",
             gai_strerror(rc));
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// Whole-buffer socket I/O; false on EOF, error or a receive timeout.
bool write_all(int fd, const void* p, size_t n) {
  auto* b = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, b, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool send_message(int fd, uint8_t head, const Fields& fields) {
  std::string buf(4, '\0');
  buf.push_back(static_cast<char>(head));
  for (const std::string& f : fields) {
    uint32_t len = static_cast<uint32_t>(f.size());
    buf.append(reinterpret_cast<const char*>(&len), 4);
    buf += f;
  }
  uint32_t total = static_cast<uint32_t>(buf.size() - 4);
  std::memcpy(buf.data(), &total, 4);
  return write_all(fd, buf.data(), buf.size());
}

constexpr uint32_t kMaxMessage = 1u << 30;

bool recv_message(int fd, uint8_t& head, Fields& fields) {
  uint32_t total = 0;
  if (!read_all(fd, &total, 4) || total < 1 || total > kMaxMessage) return false;
  std::string buf(total, '\0');
  if (!read_all(fd, buf.data(), total)) return false;
  head = static_cast<uint8_t>(buf[0]);
  fields.clear();
  size_t pos = 1;
  while (pos < total) {
    uint32_t len = 0;
    if (total - pos < 4) return false;
    std::memcpy(&len, buf.data() + pos, 4);
    pos += 4;
    if (len > total - pos) return false;
    fields.push_back(buf.substr(pos, len));
    pos += len;
  }
  return true;
}

}  // namespace

// ---- Server
// --------------------------------------------------------------------------------------

class TCPStore::Server {
 public:
  Server(const std::string& host, int port) {
    sockaddr_in addr = resolve(host, port);
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    KILN_CHECK(fd_ >= 0, Runtime, "TCPStore: socket(): ", std::strerror(errno));
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(fd_, 128) != 0) {
      std::string err = std::strerror(errno);
      ::close(fd_);
      KILN_FAIL(Runtime, "TCPStore: cannot listen on ", endpoint(host, port), ": ", err);
    }
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    KILN_CHECK(::pipe2(wake_, O_CLOEXEC) == 0, Runtime, "TCPStore: pipe(): ", std::strerror(errno));
    thread_ = std::thread([this] { run(); });
  }

  ~Server() {
    char c = 0;
    (void)!::write(wake_[1], &c, 1);
    thread_.join();
    for (int fd : {fd_, wake_[0], wake_[1]}) ::close(fd);
  }

  int port() const { return port_; }

 private:
  void run() {
    std::vector<int> clients;
    for (;;) {
      std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {fd_, POLLIN, 0}};
      for (int c : clients) fds.push_back({c, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) break;
      if (fds[0].revents) break;
      if (fds[1].revents & POLLIN) {
        int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) {
          int one = 1;
          setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          clients.push_back(c);
        }
      }
      std::vector<int> alive;
      for (size_t i = 2; i < fds.size(); ++i) {
        bool ok = !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)) || serve(fds[i].fd);
        if (ok)
          alive.push_back(fds[i].fd);
        else
          ::close(fds[i].fd);
      }
      for (size_t i = fds.size() - 2; i < clients.size(); ++i) alive.push_back(clients[i]);
      clients = std::move(alive);
    }
    for (int c : clients) ::close(c);
  }

  // One request from client `fd`; false when the client is gone or malformed.
  bool serve(int fd) {
    uint8_t cmd = 0;
    Fields f;
    if (!recv_message(fd, cmd, f)) return false;
    auto need = [&](size_t n) { return f.size() == n; };
    switch (cmd) {
      case kSet:
        if (!need(2)) return false;
        data_[f[0]] = f[1];
        return send_message(fd, 0, {});
      case kGet: {
        if (!need(1)) return false;
        auto it = data_.find(f[0]);
        return it == data_.end() ? send_message(fd, 1, {}) : send_message(fd, 0, {it->second});
      }
      case kAdd: {
        if (!need(2)) return false;
        auto it = data_.find(f[0]);
        int64_t v = 0;
        if (it != data_.end()) v = std::strtoll(it->second.c_str(), nullptr, 10);
        v += std::strtoll(f[1].c_str(), nullptr, 10);
        data_[f[0]] = std::to_string(v);
        return send_message(fd, 0, {data_[f[0]]});
      }
      case kCompareSet: {
        if (!need(3)) return false;
        auto it = data_.find(f[0]);
        if (it == data_.end() ? f[1].empty() : it->second == f[1]) data_[f[0]] = f[2];
        it = data_.find(f[0]);
        return send_message(fd, 0, {it == data_.end() ? f[1] : it->second});
      }
      case kCheck:
        for (const std::string& k : f)
          if (!data_.count(k)) return send_message(fd, 1, {});
        return send_message(fd, 0, {});
      case kDelete:
        if (!need(1)) return false;
        return send_message(fd, data_.erase(f[0]) ? 0 : 1, {});
      default:
        return false;
    }
  }

  int fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::unordered_map<std::string, std::string> data_;
};

// ---- Client
// --------------------------------------------------------------------------------------

class TCPStore::Client {
 public:
  Client(const std::string& host, int port, Milliseconds timeout) : where_(endpoint(host, port)) {
    sockaddr_in addr = resolve(host, port);
    const auto deadline = Clock::now() + timeout;
    auto backoff = Milliseconds(5);
    std::string last = "timed out";
    for (;;) {
      fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      KILN_CHECK(fd_ >= 0, Runtime, "TCPStore: socket(): ", std::strerror(errno));
      if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
      last = std::strerror(errno);
      ::close(fd_);
      fd_ = -1;
      KILN_CHECK(Clock::now() + backoff < deadline, Runtime, "TCPStore: could not connect to ",
                 where_, " within ", timeout.count(), " ms (", last, ")");
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, Milliseconds(200));
    }
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // A server that stops answering turns into an error, not a hang.
    timeval tv{static_cast<time_t>(timeout.count() / 1000),
               static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~Client() { ::close(fd_); }

  // Sends one request; returns the status byte and the reply's fields.
  uint8_t request(Command cmd, const Fields& fields, Fields* reply = nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    uint8_t status = 0;
    Fields out;
    KILN_CHECK(send_message(fd_, cmd, fields) && recv_message(fd_, status, out), Runtime,
               "TCPStore: lost the connection to the store at ", where_);
    if (reply) *reply = std::move(out);
    return status;
  }

  const std::string& where() const { return where_; }

 private:
  std::string where_;
  int fd_ = -1;
  std::mutex mu_;
};

// ---- TCPStore
// ------------------------------------------------------------------------------------

TCPStore::TCPStore(std::string host, int port, bool is_server, Milliseconds timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout) {
  KILN_CHECK(port >= 0 && port < 65536, Value, "TCPStore: port must be in [0, 65535], got ", port);
  if (is_server) {
    server_ = std::make_unique<Server>(host_, port_);
    port_ = server_->port();
  }
  client_ = std::make_unique<Client>(host_, port_, timeout_);
}

TCPStore::~TCPStore() {
  client_.reset();
  server_.reset();
}

void TCPStore::set(const std::string& key, const std::string& value) {
  client_->request(kSet, {key, value});
}

std::string TCPStore::get(const std::string& key) {
  wait({key});
  Fields r;
  KILN_CHECK(client_->request(kGet, {key}, &r) == 0 && r.size() == 1, Runtime, "TCPStore: key '",
             key, "' vanished from ", client_->where());
  return r[0];
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  Fields r;
  client_->request(kAdd, {key, std::to_string(delta)}, &r);
  return std::strtoll(r.at(0).c_str(), nullptr, 10);
}

std::string TCPStore::compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  Fields r;
  client_->request(kCompareSet, {key, expected, desired}, &r);
  return r.at(0);
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  return client_->request(kCheck, keys) == 0;
}

void TCPStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TCPStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto backoff = std::chrono::microseconds(200);
  while (!check(keys)) {
    if (Clock::now() >= deadline) {
      std::string missing;
      for (const std::string& k : keys)
        if (!check({k})) missing += (missing.empty() ? "'" : ", '") + k + "'";
      KILN_FAIL(Runtime, "TCPStore: timed out after ", timeout.count(), " ms waiting for key(s) ",
                missing, " at ", client_->where());
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::microseconds(20000));
  }
}

bool TCPStore::delete_key(const std::string& key) { return client_->request(kDelete, {key}) == 0; }

}  // namespace kiln::dist
