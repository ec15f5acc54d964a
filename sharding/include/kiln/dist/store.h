// kiln/dist/store.h: the rendezvous key-value store (PyTorch's TCPStore): one process hosts a
// small server thread, every rank connects to it over TCP (loopback by default).
//
//   kiln::dist::TCPStore server("127.0.0.1", 29500, /*is_server=*/true);  // rank 0
//   kiln::dist::TCPStore store("127.0.0.1", 29500);                      // every rank
//   store.set("addr/1", bytes);
//   std::string a = store.get("addr/0");         // waits for the key (the store's timeout)
//   int64_t n = store.add("arrived", 1);         // an atomic counter
//
// Values are byte strings. Every blocking call ends within its timeout with a kiln::Error
// (Runtime) naming host:port; nothing waits forever.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::dist {

using Milliseconds = std::chrono::milliseconds;

class TCPStore {
 public:
  // is_server: host the store in this process, listening on host:port (port 0: any free port,
  // port() tells which). Every instance is also a client; connecting retries until `timeout`.
  TCPStore(std::string host, int port, bool is_server = false,
           Milliseconds timeout = std::chrono::seconds(60));
  ~TCPStore();
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  void set(const std::string& key, const std::string& value);
  // Waits for the key (up to the store's timeout) and returns its value.
  std::string get(const std::string& key);
  // Adds `delta` to the integer at `key` (0 when absent) and returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  // Sets `desired` when the key holds `expected` (or is absent and `expected` is empty); returns
  // the value the key holds afterwards.
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired);
  // Whether every key is set, without waiting.
  bool check(const std::vector<std::string>& keys);
  // Waits until every key is set; kiln::Error naming the missing keys after `timeout`.
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, Milliseconds timeout);
  bool delete_key(const std::string& key);

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  Milliseconds timeout() const { return timeout_; }
  void set_timeout(Milliseconds t) { timeout_ = t; }

 private:
  class Server;
  class Client;
  std::string host_;
  int port_;
  Milliseconds timeout_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

}  // namespace kiln::dist
