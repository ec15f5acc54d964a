// The rendezvous store (kiln/dist/store.h), in one process: a server and clients on loopback.
#include "kiln/dist/store.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "test_util.h"

namespace kiln::testing {
namespace {

using dist::TCPStore;
using std::chrono::milliseconds;

// A loopback port with nothing listening on it.
int closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

TEST(DistStore, SetGetAddCompareSetCheckDelete) {
  TCPStore server("127.0.0.1", 0, true);
  TCPStore client("127.0.0.1", server.port());
  client.set("a", std::string("x\0y", 3));
  EXPECT_EQ(server.get("a"), std::string("x\0y", 3));
  EXPECT_EQ(client.add("n", 2), 2);
  EXPECT_EQ(server.add("n", -5), -3);
  EXPECT_EQ(client.get("n"), "-3");
  EXPECT_EQ(client.compare_set("c", "", "first"), "first");        // absent + empty expected: set
  EXPECT_EQ(client.compare_set("c", "wrong", "second"), "first");  // mismatch: unchanged
  EXPECT_EQ(client.compare_set("c", "first", "second"), "second");
  EXPECT_EQ(client.compare_set("d", "x", "y"), "x");  // absent, non-empty expected: nothing set
  EXPECT_FALSE(client.check({"d"}));
  EXPECT_TRUE(client.check({"a", "n", "c"}));
  EXPECT_FALSE(client.check({"a", "zz"}));
  EXPECT_TRUE(client.delete_key("a"));
  EXPECT_FALSE(client.delete_key("a"));
  EXPECT_FALSE(client.check({"a"}));
  std::string big(1 << 20, 'q');
  client.set("big", big);
  EXPECT_EQ(server.get("big"), big);
}

TEST(DistStore, WaitReturnsWhenAnotherClientSets) {
  TCPStore server("127.0.0.1", 0, true);
  std::thread setter([port = server.port()] {
    TCPStore c("127.0.0.1", port);
    std::this_thread::sleep_for(milliseconds(50));
    c.set("k1", "1");
    c.set("k2", "2");
  });
  server.wait({"k1", "k2"}, milliseconds(5000));
  EXPECT_EQ(server.get("k2"), "2");
  setter.join();
}

TEST(DistStore, CountersFromManyClients) {
  TCPStore server("127.0.0.1", 0, true);
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([port = server.port()] {
      TCPStore c("127.0.0.1", port);
      for (int k = 0; k < 50; ++k) c.add("count", 1);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(server.get("count"), "200");
}

TEST(DistStore, ClientRetriesUntilTheServerListens) {
  const int port = closed_port();
  std::unique_ptr<TCPStore> server;
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(100));
    server = std::make_unique<TCPStore>("127.0.0.1", port, true);
  });
  TCPStore client("127.0.0.1", port, false, milliseconds(5000));
  late.join();
  client.set("k", "v");
  EXPECT_EQ(server->get("k"), "v");
}

TEST(DistStore, ErrorsNameHostAndPort) {
  const int port = closed_port();
  expect_error(ErrorKind::Runtime, "could not connect to 127.0.0.1:" + std::to_string(port),
               [&] { TCPStore c("127.0.0.1", port, false, milliseconds(200)); });
  TCPStore server("127.0.0.1", 0, true, milliseconds(200));
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  expect_error(ErrorKind::Runtime, "waiting for key(s) 'missing' at " + where,
               [&] { server.get("missing"); });
  expect_error(ErrorKind::Runtime, "timed out after 50 ms",
               [&] { server.wait({"missing"}, milliseconds(50)); });
  expect_error(ErrorKind::Value, "port must be in [0, 65535]",
               [] { TCPStore c("127.0.0.1", 70000); });
}

TEST(DistStore, LostServerIsAnError) {
  auto server = std::make_unique<TCPStore>("127.0.0.1", 0, true);
  TCPStore client("127.0.0.1", server->port(), false, milliseconds(500));
  client.set("k", "v");
  server.reset();
  expect_error(ErrorKind::Runtime, "lost the connection to the store",
               [&] { client.set("k", "w"); });
}

}  // namespace kiln::testing
