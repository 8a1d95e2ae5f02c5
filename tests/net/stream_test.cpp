// Listeners handed over as sockets: a listening socket is adopted and accepts, anything else is
// refused naming the fd.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>

#include "net/stream.h"

namespace kvasir::net {
namespace {

TEST(ListenerTest, AnAdoptedSocketAcceptsOnItsPort) {
  auto bound = Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(bound.ok()) << bound.status().message();
  const uint16_t port = bound->port();
  EXPECT_EQ(bound->host(), "127.0.0.1");
  const int fd = bound->Release();
  auto adopted = Listener::Adopt(fd);
  ASSERT_TRUE(adopted.ok()) << adopted.status().message();
  EXPECT_EQ(adopted->port(), port);
  EXPECT_EQ(adopted->host(), "127.0.0.1");
  EXPECT_EQ(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC) << "not leaked into later children";
  auto client = DialTcp("127.0.0.1", port, 2000);
  ASSERT_TRUE(client.ok()) << client.status().message();
  auto served = adopted->Accept();
  ASSERT_TRUE(served.ok()) << served.status().message();
  const uint8_t byte = 42;
  ASSERT_TRUE((*client)->WriteAll({&byte, 1}).ok());
  uint8_t got = 0;
  auto n = (*served)->ReadSome({&got, 1});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(got, 42);
}

TEST(ListenerTest, AdoptRefusesWhatIsNotAListeningSocket) {
  const int file = open("/dev/null", O_RDONLY);
  ASSERT_GE(file, 0);
  auto a = Listener::Adopt(file);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("fd " + std::to_string(file)), std::string::npos)
      << a.status().message();
  close(file);

  const int unbound = socket(AF_INET, SOCK_STREAM, 0);
  auto b = Listener::Adopt(unbound);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("not a listening TCP socket"), std::string::npos)
      << b.status().message();
  close(unbound);

  const int udp = socket(AF_INET, SOCK_DGRAM, 0);
  EXPECT_FALSE(Listener::Adopt(udp).ok());
  close(udp);
  EXPECT_FALSE(Listener::Adopt(-1).ok());
}

}  // namespace
}  // namespace kvasir::net
