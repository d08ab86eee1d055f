// A raw socket client for the server tests: what an HTTP client library will not send (a
// request cut short, a client that leaves mid-stream).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace tessel::infer::testing {

// A socket connected to 127.0.0.1:`port` (-1: none).
inline int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(static_cast<uint16_t>(port));
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0) return fd;
  close(fd);
  return -1;
}

}  // namespace tessel::infer::testing
