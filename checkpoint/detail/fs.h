#pragma once
// POSIX file helpers shared by the checkpoint sources; every failure becomes
// a CheckpointError naming the path and the system's reason.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hp::ckpt::detail {

/// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() noexcept {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  /// Closes now and reports a failed close (it can carry a deferred write error).
  void close_or_throw(const std::string& path);

 private:
  int fd_ = -1;
};

/// `strerror(err)` as a string.
std::string errno_text(int err);

Fd open_for_write(const std::string& path);
Fd open_for_read(const std::string& path);
void write_all(int fd, const void* data, std::size_t n, const std::string& path);
/// Reads up to `n` bytes at `offset`; fewer only at end of file. Returns the count.
std::size_t pread_all(int fd, void* data, std::size_t n, std::uint64_t offset,
                      const std::string& path);
void fsync_fd(int fd, const std::string& path);
void fsync_dir(const std::string& dir);

/// Writes `contents` to `path` (created or truncated) and fsyncs it. The
/// caller fsyncs the directory when the name itself must be durable.
void write_file_durable(const std::string& path, const std::string& contents);
/// Writes `path` through `path.tmp` + fsync + rename + fsync of the directory,
/// so a reader sees either the old contents or the new, never a mix.
void replace_file_atomically(const std::string& path, const std::string& contents);
std::string read_text_file(const std::string& path);

/// "[8, 4]"
std::string format_shape(const std::vector<std::int64_t>& shape);

}  // namespace hp::ckpt::detail
