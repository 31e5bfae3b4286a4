#include "framework/metrics/http_exposer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "framework/metrics/exposition.h"
#include "hp/metrics/registry.h"

namespace hp::metrics {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kMetricsPath = "/metrics";
constexpr const char* kPlainText = "text/plain; charset=utf-8";
// A request line and a few headers; anything longer is not a scraper.
constexpr std::size_t kMaxRequestHead = std::size_t{16} * 1024;
// A client that has not sent its request head by then is closed.
constexpr std::chrono::seconds kClientTimeout{5};
// Clients served at once; one more is answered 503 (through the same
// write-then-drain path, so the answer is not lost to a reset), and past
// twice this many a new connection is closed at once.
constexpr std::size_t kMaxClients = 64;
// After answering, unread input is drained for at most this long: closing
// with unread input makes the kernel send a reset, which can destroy the
// answer before the client has read it.
constexpr std::chrono::seconds kDrainTimeout{1};

std::string error_text(int error) {
  char buffer[256];
  return strerror_r(error, buffer, sizeof buffer);  // GNU variant: returns the text
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string response(int status, const char* reason, const char* content_type,
                     const std::string& body, bool with_body, const char* extra_header = nullptr) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\n";
  out += "Content-Type: ";
  out += content_type;
  out += "\r\nContent-Length: ";
  out += std::to_string(body.size());
  out += "\r\n";
  if (extra_header != nullptr) {
    out += extra_header;
    out += "\r\n";
  }
  out += "Connection: close\r\n\r\n";
  if (with_body) out += body;
  return out;
}

// The answer to a complete request head ("GET /metrics HTTP/1.1\r\n...").
std::string answer(const Registry& registry, const std::string& head) {
  const std::string line = head.substr(0, head.find_first_of("\r\n"));
  const std::size_t method_end = line.find(' ');
  const std::size_t target_end =
      method_end == std::string::npos ? std::string::npos : line.find(' ', method_end + 1);
  if (target_end == std::string::npos || method_end == 0 ||
      line.compare(target_end + 1, 7, "HTTP/1.") != 0) {
    return response(400, "Bad Request", kPlainText,
                    "bad request: expected a request line such as 'GET /metrics HTTP/1.1'\n", true);
  }
  const std::string method = line.substr(0, method_end);
  std::string path = line.substr(method_end + 1, target_end - method_end - 1);
  path = path.substr(0, path.find_first_of("?#"));
  const bool head_only = method == "HEAD";
  if (path != kMetricsPath) {
    return response(404, "Not Found", kPlainText, "not found: metrics are served at /metrics\n",
                    !head_only);
  }
  if (method != "GET" && !head_only) {
    return response(405, "Method Not Allowed", kPlainText, "only GET and HEAD are allowed\n", true,
                    "Allow: GET, HEAD");
  }
  return response(200, "OK", kPrometheusTextContentType, to_prometheus_text(registry), !head_only);
}

}  // namespace

// Owns the listening socket and the thread that serves it. The thread runs
// one poll loop over every client at once, each a small state machine
// (reading its request head, writing the answer, draining), so an idle,
// trickling, garbage-sending or oversized client never delays another
// client's scrape: each is bounded in size (kMaxRequestHead) and time
// (kClientTimeout). An eventfd wakes the loop to stop.
class HttpExposer::Server {
 public:
  Server(const Registry& registry, FileDescriptor listener, FileDescriptor wake)
      : registry_(registry),
        listener_(std::move(listener)),
        wake_(std::move(wake)),
        thread_([this] { run(); }) {}

  ~Server() {
    const std::uint64_t one = 1;
    ssize_t ignored = ::write(wake_.get(), &one, sizeof one);
    (void)ignored;
    thread_.join();
  }

 private:
  enum class Phase { kReading, kWriting, kDraining };
  struct Client {
    explicit Client(int fd) : fd(fd) {}
    FileDescriptor fd;
    Phase phase = Phase::kReading;
    std::string head, reply;
    std::size_t sent = 0;
    bool refused = false;  // answered 503: does not count against kMaxClients
    Clock::time_point deadline = Clock::now() + kClientTimeout;
  };

  void run() {
    pthread_setname_np(pthread_self(), "hp-metrics-http");
    std::vector<std::unique_ptr<Client>> clients;
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake_.get(), POLLIN, 0});
      fds.push_back({listener_.get(), POLLIN, 0});
      auto next = Clock::time_point::max();
      for (const auto& c : clients) {
        fds.push_back({c->fd.get(), static_cast<short>(c->phase == Phase::kWriting ? POLLOUT : POLLIN), 0});
        next = std::min(next, c->deadline);
      }
      int timeout_ms = -1;
      if (!clients.empty()) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now());
        timeout_ms = static_cast<int>(std::max<long long>(0, left.count()));
      }
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
      if (fds[0].revents != 0) return;  // stop requested
      for (std::size_t i = 0; i < clients.size(); ++i) {
        if (fds[i + 2].revents != 0) step(*clients[i]);
      }
      const auto now = Clock::now();
      clients.erase(std::remove_if(clients.begin(), clients.end(),
                                   [&](const auto& c) { return c->fd.get() < 0 || now >= c->deadline; }),
                    clients.end());
      if (fds[1].revents != 0) accept_all(clients);
    }
  }

  void accept_all(std::vector<std::unique_ptr<Client>>& clients) {
    for (;;) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or out of descriptors: the next poll tries again
      const auto serving = static_cast<std::size_t>(
          std::count_if(clients.begin(), clients.end(), [](const auto& c) { return !c->refused; }));
      if (serving >= kMaxClients) {
        if (clients.size() >= 2 * kMaxClients) {
          FileDescriptor dropped(fd);
          continue;
        }
        auto busy = std::make_unique<Client>(fd);
        busy->refused = true;
        start_reply(*busy, response(503, "Service Unavailable", kPlainText, "too many clients\n", true));
        clients.push_back(std::move(busy));
        continue;
      }
      clients.push_back(std::make_unique<Client>(fd));
    }
  }

  // Advances one client as far as its socket allows without blocking.
  void step(Client& c) {
    try {
      if (c.phase == Phase::kReading) read_head(c);
      if (c.phase == Phase::kWriting) write_reply(c);
      if (c.phase == Phase::kDraining) drain(c);
    } catch (...) {
      close(c);  // out of memory while answering: drop this client, keep serving
    }
  }

  void read_head(Client& c) {
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::recv(c.fd.get(), buffer, sizeof buffer, 0);
      if (n == 0) return close(c);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) close(c);
        return;
      }
      c.head.append(buffer, static_cast<std::size_t>(n));
      const std::size_t end = std::min(c.head.find("\r\n\r\n"), c.head.find("\n\n"));
      if (end != std::string::npos && end <= kMaxRequestHead) {
        std::string reply;
        try {
          reply = answer(registry_, c.head);
        } catch (const std::exception& e) {
          reply = response(500, "Internal Server Error", kPlainText,
                           std::string("internal error rendering metrics, please report: ") + e.what() + "\n", true);
        }
        return start_reply(c, std::move(reply));
      }
      if (c.head.size() > kMaxRequestHead) {
        return start_reply(c, response(431, "Request Header Fields Too Large", kPlainText, "request head too large\n",
                                       true));
      }
    }
  }

  void start_reply(Client& c, std::string reply) {
    c.head.clear();
    c.head.shrink_to_fit();
    c.reply = std::move(reply);
    c.phase = Phase::kWriting;
    c.deadline = Clock::now() + kClientTimeout;
  }

  void write_reply(Client& c) {
    while (c.sent < c.reply.size()) {
      const ssize_t n = ::send(c.fd.get(), c.reply.data() + c.sent, c.reply.size() - c.sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.sent += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      } else {
        return close(c);
      }
    }
    // Half-close, then read until the client closes too (or briefly times
    // out): closing with unread input makes the kernel send a reset, which
    // can destroy the answer before the client has read it.
    ::shutdown(c.fd.get(), SHUT_WR);
    c.phase = Phase::kDraining;
    c.deadline = Clock::now() + kDrainTimeout;
  }

  void drain(Client& c) {
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::recv(c.fd.get(), buffer, sizeof buffer, 0);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      return close(c);
    }
  }

  static void close(Client& c) { c.fd = FileDescriptor(-1); }

  const Registry& registry_;
  FileDescriptor listener_;
  FileDescriptor wake_;
  std::thread thread_;  // last: it starts serving as soon as it exists
};

HttpExposer::HttpExposer(Registry& registry, const std::string& bind_address, int port)
    : port_(port) {
  if (port < 1 || port > 65535) {
    throw std::invalid_argument("metrics HTTP port " + std::to_string(port) +
                                " is out of range: use a port from 1 to 65535");
  }
  sockaddr_in v4{};
  sockaddr_in6 v6{};
  const sockaddr* address = nullptr;
  socklen_t address_length = 0;
  if (::inet_pton(AF_INET, bind_address.c_str(), &v4.sin_addr) == 1) {
    v4.sin_family = AF_INET;
    v4.sin_port = htons(static_cast<std::uint16_t>(port));
    address = reinterpret_cast<const sockaddr*>(&v4);
    address_length = sizeof v4;
    host_ = bind_address;
  } else if (::inet_pton(AF_INET6, bind_address.c_str(), &v6.sin6_addr) == 1) {
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(static_cast<std::uint16_t>(port));
    address = reinterpret_cast<const sockaddr*>(&v6);
    address_length = sizeof v6;
    host_ = "[" + bind_address + "]";
  } else {
    throw std::invalid_argument("metrics bind address '" + bind_address +
                                "' is not a numeric IPv4 or IPv6 address; use e.g. "
                                "'127.0.0.1' (this machine only) or '0.0.0.0' (all interfaces)");
  }

  const std::string where = host_ + ":" + std::to_string(port);
  auto fail = [&](const char* step, int error) {
    std::string message =
        "cannot serve metrics on " + where + ": " + step + " failed: " + error_text(error);
    if (error == EADDRINUSE) {
      message += " (is another process, or another rank, using port " + std::to_string(port) +
                 "? choose another port)";
    } else if (error == EADDRNOTAVAIL) {
      message += " (" + bind_address + " is not an address of this machine)";
    } else if (error == EACCES) {
      message += " (ports below 1024 need privileges; choose a higher port)";
    }
    throw std::runtime_error(message);
  };

  FileDescriptor listener(
      ::socket(address->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) fail("socket", errno);
  // Lets a restarted trainer bind while old connections sit in TIME_WAIT;
  // Linux still refuses a second listener on the same port.
  const int on = 1;
  ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (::bind(listener.get(), address, address_length) != 0) fail("bind", errno);
  if (::listen(listener.get(), 128) != 0) fail("listen", errno);
  FileDescriptor wake(::eventfd(0, EFD_CLOEXEC));
  if (wake.get() < 0) fail("eventfd", errno);
  server_ = std::make_unique<Server>(registry, std::move(listener), std::move(wake));
}

HttpExposer::~HttpExposer() = default;

std::string HttpExposer::url() const {
  return "http://" + host_ + ":" + std::to_string(port_) + kMetricsPath;
}

}  // namespace hp::metrics
