#pragma once
// Serves a Registry over HTTP for Prometheus to scrape: `GET /metrics`
// returns the text exposition format, every other path 404. One background
// thread serves from construction to destruction.
//
// Why not civetweb: Debian's civetweb 1.15 creates its threads with 100 KiB
// stacks, and in a process that has loaded LibTorch + OpenBLAS + glog the
// static TLS alone is larger than that, so pthread_create fails with EINVAL
// and the server cannot start inside the trainer.
#include <memory>
#include <string>

namespace hp::metrics {

class Registry;

class HttpExposer {
 public:
  /// Starts serving `registry`, which must outlive this object, on
  /// `bind_address` (a numeric IPv4 or IPv6 address: "127.0.0.1" keeps it on
  /// this machine, "0.0.0.0" opens it to the network) and `port` (1-65535).
  /// Throws std::invalid_argument for a bad address or port, and
  /// std::runtime_error naming address:port and the cause when the port
  /// cannot be bound (typically another process, or another rank given the
  /// same port, already listens there).
  HttpExposer(Registry& registry, const std::string& bind_address, int port);
  /// Stops serving; a scrape in progress is cut short.
  ~HttpExposer();
  HttpExposer(const HttpExposer&) = delete;
  HttpExposer& operator=(const HttpExposer&) = delete;

  /// "http://127.0.0.1:9100/metrics"
  std::string url() const;
  int port() const { return port_; }

 private:
  class Server;
  std::string host_;  // as it appears in a URL: IPv6 in brackets
  int port_;
  std::unique_ptr<Server> server_;
};

}  // namespace hp::metrics
