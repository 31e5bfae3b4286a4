#include "checkpoint/detail/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "checkpoint/error.h"

namespace hp::ckpt::detail {

Fd::~Fd() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = other.release();
  }
  return *this;
}

void Fd::close_or_throw(const std::string& path) {
  const int fd = release();
  if (fd >= 0 && ::close(fd) != 0) {
    throw CheckpointError("cannot close " + path + ": " + errno_text(errno));
  }
}

std::string errno_text(int err) { return std::strerror(err); }

Fd open_for_write(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw CheckpointError("cannot create " + path + ": " + errno_text(errno));
  }
  return Fd(fd);
}

Fd open_for_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw CheckpointError("cannot open " + path + ": " + errno_text(errno));
  }
  return Fd(fd);
}

void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) {
        continue;
      }
      throw CheckpointError("cannot write " + path + ": " + errno_text(errno));
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

std::size_t pread_all(int fd, void* data, std::size_t n, std::uint64_t offset,
                      const std::string& path) {
  auto* p = static_cast<char*>(data);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) {
        continue;
      }
      throw CheckpointError("cannot read " + path + ": " + errno_text(errno));
    }
    if (r == 0) {
      break;
    }
    done += static_cast<std::size_t>(r);
  }
  return done;
}

void fsync_fd(int fd, const std::string& path) {
  if (::fsync(fd) != 0) {
    throw CheckpointError("cannot fsync " + path + ": " + errno_text(errno));
  }
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    throw CheckpointError("cannot open directory " + dir + " to fsync it: " + errno_text(errno));
  }
  Fd owner(fd);
  fsync_fd(fd, dir);
  owner.close_or_throw(dir);
}

void write_file_durable(const std::string& path, const std::string& contents) {
  Fd fd = open_for_write(path);
  write_all(fd.get(), contents.data(), contents.size(), path);
  fsync_fd(fd.get(), path);
  fd.close_or_throw(path);
}

void replace_file_atomically(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp";
  write_file_durable(tmp, contents);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    throw CheckpointError("cannot rename " + tmp + " to " + path + ": " + errno_text(errno));
  }
  const auto parent = std::filesystem::path(path).parent_path();
  fsync_dir(parent.empty() ? std::string(".") : parent.string());
}

std::string read_text_file(const std::string& path) {
  Fd fd = open_for_read(path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw CheckpointError("cannot stat " + path + ": " + errno_text(errno));
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  text.resize(pread_all(fd.get(), text.data(), text.size(), 0, path));
  return text;
}

std::string format_shape(const std::vector<std::int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) {
    os << (i ? ", " : "") << shape[i];
  }
  os << ']';
  return os.str();
}

}  // namespace hp::ckpt::detail
