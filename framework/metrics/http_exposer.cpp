#include "framework/metrics/http_exposer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include "framework/metrics/exposition.h"
#include "framework/metrics/registry.h"

namespace hp::metrics {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kMetricsPath = "/metrics";
constexpr const char* kPlainText = "text/plain; charset=utf-8";
// A request line and a few headers; anything longer is not a scraper.
constexpr std::size_t kMaxRequestHead = std::size_t{16} * 1024;
// One thread serves every client, so none may hold it for long.
constexpr std::chrono::seconds kClientTimeout{5};
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
  FileDescriptor& operator=(FileDescriptor&&) = delete;
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

// Owns the listening socket and the thread that serves it, one client at a
// time (Prometheus scrapes sequentially). An eventfd wakes the thread to stop.
class HttpExposer::Server {
 public:
  Server(const Registry& registry, FileDescriptor listener, FileDescriptor wake)
      : registry_(registry),
        listener_(std::move(listener)),
        wake_(std::move(wake)),
        thread_([this] { run(); }) {}

  ~Server() {
    const std::uint64_t one = 1;
    // An eventfd write only fails when the counter would overflow.
    [[maybe_unused]] const ssize_t written = ::write(wake_.get(), &one, sizeof one);
    thread_.join();
  }

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

 private:
  enum class Ready { kYes, kTimeout, kStop };

  // Waits until `fd` has `events`, the deadline passes or stop is requested.
  Ready wait_for(int fd, short events, std::optional<Clock::time_point> deadline) const {
    for (;;) {
      int timeout_ms = -1;
      if (deadline) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
        if (left.count() <= 0) return Ready::kTimeout;
        timeout_ms = static_cast<int>(left.count());
      }
      pollfd fds[2] = {{fd, events, 0}, {wake_.get(), POLLIN, 0}};
      const int ready = ::poll(fds, 2, timeout_ms);
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0 || fds[1].revents != 0) return Ready::kStop;
      if (ready == 0) return Ready::kTimeout;
      return Ready::kYes;  // errors and hang-ups show up in the next recv/send
    }
  }

  void run() {
    pthread_setname_np(pthread_self(), "hp-metrics-http");
    for (;;) {
      if (wait_for(listener_.get(), POLLIN, std::nullopt) != Ready::kYes) return;
      FileDescriptor client(
          ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (client.get() < 0) {
        // Out of descriptors or memory: back off rather than spin on a
        // listener that stays readable.
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          if (wait_for(wake_.get(), POLLIN, Clock::now() + std::chrono::milliseconds(100)) ==
              Ready::kStop) {
            return;
          }
        }
        continue;
      }
      try {
        serve(client.get());
      } catch (...) {
        // Out of memory while answering: drop this client, keep serving.
      }
    }
  }

  void serve(int client) const {
    const Clock::time_point deadline = Clock::now() + kClientTimeout;
    std::string head;
    char buffer[4096];
    for (;;) {
      const bool complete =
          head.find("\r\n\r\n") != std::string::npos || head.find("\n\n") != std::string::npos;
      if (head.size() > kMaxRequestHead) {
        const std::string reply = response(431, "Request Header Fields Too Large", kPlainText,
                                           "request head too large\n", true);
        if (send_all(client, reply, deadline)) drain(client);
        return;
      }
      if (complete) break;
      if (wait_for(client, POLLIN, deadline) != Ready::kYes) return;
      const ssize_t n = ::recv(client, buffer, sizeof buffer, 0);
      if (n == 0) return;
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        return;
      }
      head.append(buffer, static_cast<std::size_t>(n));
    }
    std::string reply;
    try {
      reply = answer(registry_, head);
    } catch (const std::exception& e) {
      reply = response(
          500, "Internal Server Error", kPlainText,
          std::string("internal error rendering metrics, please report: ") + e.what() + "\n", true);
    }
    if (send_all(client, reply, deadline)) drain(client);
  }

  bool send_all(int client, const std::string& data, Clock::time_point deadline) const {
    std::size_t sent = 0;
    while (sent < data.size()) {
      const ssize_t n = ::send(client, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (wait_for(client, POLLOUT, deadline) != Ready::kYes) return false;
      } else {
        return false;
      }
    }
    return true;
  }

  // Half-closes, then reads until the client closes too (or briefly times out).
  void drain(int client) const {
    ::shutdown(client, SHUT_WR);
    const Clock::time_point deadline = Clock::now() + kDrainTimeout;
    char buffer[4096];
    while (wait_for(client, POLLIN, deadline) == Ready::kYes) {
      const ssize_t n = ::recv(client, buffer, sizeof buffer, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
    }
  }

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
  if (::listen(listener.get(), 16) != 0) fail("listen", errno);
  FileDescriptor wake(::eventfd(0, EFD_CLOEXEC));
  if (wake.get() < 0) fail("eventfd", errno);
  server_ = std::make_unique<Server>(registry, std::move(listener), std::move(wake));
}

HttpExposer::~HttpExposer() = default;

std::string HttpExposer::url() const {
  return "http://" + host_ + ":" + std::to_string(port_) + kMetricsPath;
}

}  // namespace hp::metrics
