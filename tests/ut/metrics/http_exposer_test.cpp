// A real HTTP server on 127.0.0.1, read with a plain POSIX socket client.
#include "framework/metrics/http_exposer.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "framework/metrics/exposition.h"
#include "hp/metrics/registry.h"
#include "tests/ut/metrics/test_helpers.h"

namespace hp::metrics {
namespace {

using test::error_of;

class Socket {
 public:
  Socket() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    if (fd_ < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  }
  ~Socket() { ::close(fd_); }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

sockaddr_in loopback(int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

// A port nobody listens on right now: bind to port 0, ask which one the
// kernel picked, let it go.
int free_port() {
  Socket s;
  sockaddr_in address = loopback(0);
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    throw std::runtime_error(std::string("bind: ") + std::strerror(errno));
  }
  socklen_t length = sizeof address;
  ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&address), &length);
  return ntohs(address.sin_port);
}

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
};

int connect_to(const Socket& s, int port) {
  const sockaddr_in address = loopback(port);
  return ::connect(s.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address);
}

// Sends `request` as is. The server closes the connection after the
// response, so the body is everything up to end of stream.
Response http_request(int port, const std::string& request) {
  Socket s;
  timeval timeout{5, 0};
  ::setsockopt(s.fd(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (connect_to(s, port) != 0) {
    throw std::runtime_error("connect to port " + std::to_string(port) + ": " +
                             std::strerror(errno));
  }
  if (::send(s.fd(), request.data(), request.size(), 0) != static_cast<ssize_t>(request.size())) {
    throw std::runtime_error(std::string("send: ") + std::strerror(errno));
  }
  std::string raw;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(s.fd(), buffer, sizeof buffer, 0);
    if (n < 0) throw std::runtime_error(std::string("recv: ") + std::strerror(errno));
    if (n == 0) break;
    raw.append(buffer, static_cast<std::size_t>(n));
  }
  const auto end_of_head = raw.find("\r\n\r\n");
  if (end_of_head == std::string::npos) throw std::runtime_error("no HTTP head in: " + raw);
  Response response;
  response.body = raw.substr(end_of_head + 4);
  const std::string head = raw.substr(0, end_of_head);
  // "HTTP/1.1 200 OK"
  response.status = std::stoi(head.substr(head.find(' ') + 1, 3));
  std::size_t line_start = head.find("\r\n");
  while (line_start != std::string::npos) {
    line_start += 2;
    const std::size_t line_end = head.find("\r\n", line_start);
    const std::string line = head.substr(line_start, line_end - line_start);
    const std::size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      response.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
    }
    line_start = line_end;
  }
  return response;
}

Response http_get(int port, const std::string& path) {
  return http_request(port, "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
}

TEST(HttpExposer, ServesMetrics) {
  Registry registry;
  registry.set_common_labels({{"rank", "0"}});
  Counter& steps = registry.counter("steps_total", "Steps done.");
  registry.histogram("step_time_seconds", "Step time.", {0.1, 1}).observe(0.5);
  const int port = free_port();
  HttpExposer exposer(registry, "127.0.0.1", port);
  EXPECT_EQ(exposer.url(), "http://127.0.0.1:" + std::to_string(port) + "/metrics");
  EXPECT_EQ(exposer.port(), port);

  Response response = http_get(port, "/metrics");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(response.headers["content-length"], std::to_string(response.body.size()));
  EXPECT_EQ(response.body, to_prometheus_text(registry));
  EXPECT_NE(response.body.find("steps_total{rank=\"0\"} 0\n"), std::string::npos);

  // Every scrape renders the registry as it is now.
  steps.inc(41);
  steps.inc();
  response = http_get(port, "/metrics?x=1");
  EXPECT_EQ(response.status, 200);
  EXPECT_NE(response.body.find("steps_total{rank=\"0\"} 42\n"), std::string::npos) << response.body;
}

TEST(HttpExposer, OtherPathsAre404) {
  Registry registry;
  registry.gauge("loss", "Loss.").set(1);
  const int port = free_port();
  HttpExposer exposer(registry, "127.0.0.1", port);
  for (const char* path : {"/nope", "/", "/metrics/extra", "/metricsx"}) {
    const Response response = http_get(port, path);
    EXPECT_EQ(response.status, 404) << path;
    EXPECT_EQ(response.body, "not found: metrics are served at /metrics\n") << path;
  }
}

TEST(HttpExposer, HeadAndOtherMethods) {
  Registry registry;
  registry.gauge("loss", "Loss.").set(1);
  const int port = free_port();
  HttpExposer exposer(registry, "127.0.0.1", port);

  Response response = http_request(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.headers["content-length"],
            std::to_string(to_prometheus_text(registry).size()));
  EXPECT_EQ(response.body, "");

  response = http_request(port, "POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_EQ(response.status, 405);
  EXPECT_EQ(response.headers["allow"], "GET, HEAD");

  response = http_request(port, "hello\r\n\r\n");
  EXPECT_EQ(response.status, 400);
  EXPECT_EQ(response.body,
            "bad request: expected a request line such as 'GET /metrics HTTP/1.1'\n");

  response = http_request(port, "GET /metrics HTTP/1.1\r\n" + std::string(20000, 'x') + "\r\n\r\n");
  EXPECT_EQ(response.status, 431);
}

TEST(HttpExposer, PortInUseNamesAddressPortAndCause) {
  Registry registry;
  const int port = free_port();
  HttpExposer first(registry, "127.0.0.1", port);
  const std::string error =
      error_of<std::runtime_error>([&] { HttpExposer second(registry, "127.0.0.1", port); });
  const std::string p = std::to_string(port);
  EXPECT_EQ(error, "cannot serve metrics on 127.0.0.1:" + p +
                       ": bind failed: Address already in use (is another process, or another "
                       "rank, using port " +
                       p + "? choose another port)");
  // The first one still serves.
  EXPECT_EQ(http_get(port, "/metrics").status, 200);
}

TEST(HttpExposer, StopsInDestructor) {
  Registry registry;
  const int port = free_port();
  auto exposer = std::make_unique<HttpExposer>(registry, "127.0.0.1", port);
  EXPECT_EQ(http_get(port, "/metrics").status, 200);
  // A client that connects and never sends does not hold up the stop.
  Socket silent;
  ASSERT_EQ(connect_to(silent, port), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto start = std::chrono::steady_clock::now();
  exposer.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));

  Socket s;
  EXPECT_NE(connect_to(s, port), 0);
  EXPECT_EQ(errno, ECONNREFUSED);
  // And the port can be served again.
  HttpExposer again(registry, "127.0.0.1", port);
  EXPECT_EQ(http_get(port, "/metrics").status, 200);
}

TEST(HttpExposer, RefusesBadAddressAndPort) {
  Registry registry;
  EXPECT_EQ(error_of<std::invalid_argument>([&] { HttpExposer e(registry, "localhost", 9100); }),
            "metrics bind address 'localhost' is not a numeric IPv4 or IPv6 address; use e.g. "
            "'127.0.0.1' (this machine only) or '0.0.0.0' (all interfaces)");
  EXPECT_EQ(error_of<std::invalid_argument>([&] { HttpExposer e(registry, "127.0.0.1", 0); }),
            "metrics HTTP port 0 is out of range: use a port from 1 to 65535");
  EXPECT_THROW(HttpExposer(registry, "127.0.0.1", 65536), std::invalid_argument);
}

}  // namespace

// Many clients at once: 20 idle connections, one trickling a byte a second,
// one sending 1 MB of garbage, one holding a 2 MB header line open; every
// scrape beside them still answers within 100 ms, and the misbehaving ones
// get a 4xx or a closed connection.
TEST(HttpExposer, MisbehavingClientsNeverDelayAScrape) {
  Registry r;
  r.gauge("hp_test_value", "A value.").set(7);
  const int port = free_port();
  HttpExposer exposer(r, "127.0.0.1", port);
  std::vector<std::unique_ptr<Socket>> idle;
  for (int i = 0; i < 20; ++i) {
    idle.push_back(std::make_unique<Socket>());
    ASSERT_EQ(connect_to(*idle.back(), port), 0);
  }
  std::atomic<bool> stop{false};
  std::string garbage_status, header_status;
  std::thread trickle([&] {
    Socket s;
    if (connect_to(s, port) != 0) return;
    const std::string request = "GET /metrics HTTP/1.1\r\n";
    for (std::size_t i = 0; i < request.size() && !stop; ++i) {
      if (::send(s.fd(), &request[i], 1, MSG_NOSIGNAL) != 1) return;  // closed by the server: fine
      for (int t = 0; t < 10 && !stop; ++t) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  auto flood = [&](const std::string& payload, std::string& status) {
    Socket s;
    timeval timeout{10, 0};
    ::setsockopt(s.fd(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    if (connect_to(s, port) != 0) return;
    std::size_t sent = 0;
    while (sent < payload.size()) {
      const ssize_t n = ::send(s.fd(), payload.data() + sent, payload.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;  // the server answered and stopped reading
      sent += static_cast<std::size_t>(n);
    }
    char buffer[64] = {0};
    const ssize_t n = ::recv(s.fd(), buffer, sizeof buffer - 1, 0);
    status = n > 12 ? std::string(buffer, 12) : "closed";
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // held open
  };
  std::thread garbage(flood, std::string(1 << 20, 'x'), std::ref(garbage_status));
  std::thread header(flood, "GET /metrics HTTP/1.1\r\nX-Long: " + std::string(2 << 20, 'y'), std::ref(header_status));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int i = 0; i < 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const Response resp = http_get(port, "/metrics");
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(resp.status, 200);
    EXPECT_NE(resp.body.find("hp_test_value 7"), std::string::npos);
    EXPECT_LT(ms, 100.0) << "scrape " << i << " took " << ms << " ms";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop = true;
  trickle.join();
  garbage.join();
  header.join();
  EXPECT_EQ(garbage_status, "HTTP/1.1 431") << "1 MB without a request head";
  EXPECT_EQ(header_status, "HTTP/1.1 431") << "a 2 MB header line";
}


// Past 64 clients at once, a new one is told so (503) rather than queued.
TEST(HttpExposer, TooManyClientsAreAnswered503) {
  Registry r;
  const int port = free_port();
  HttpExposer exposer(r, "127.0.0.1", port);
  std::vector<std::unique_ptr<Socket>> held;
  for (int i = 0; i < 64; ++i) {
    held.push_back(std::make_unique<Socket>());
    ASSERT_EQ(connect_to(*held.back(), port), 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // all accepted
  const Response resp = http_get(port, "/metrics");
  EXPECT_EQ(resp.status, 503);
  EXPECT_EQ(resp.body, "too many clients\n");
  held.clear();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(http_get(port, "/metrics").status, 200) << "served again once they left";
}
}  // namespace hp::metrics
