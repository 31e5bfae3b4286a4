#include "backends/comm/detail/shm_collectives.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

namespace hp::dist {

namespace {

// One cache line per member: the barriers it has passed, its process, and
// whether its shared-memory thread failed (peers stop waiting for it).
struct alignas(64) MemberControl {
  std::atomic<std::uint32_t> barriers;
  std::int32_t pid;
  std::atomic<std::uint32_t> failed;
};
static_assert(sizeof(std::atomic<std::uint32_t>) == 4 && std::atomic<std::uint32_t>::is_always_lock_free,
              "the futex word must be a plain 32-bit integer");

constexpr std::size_t kPage = 4096;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::string link_target(const char* path) {
  char buf[256];
  const ssize_t n = ::readlink(path, buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

/// What two processes must share to map one segment and see each other's
/// process ids: the host (its boot), the pid and mount namespaces.
std::string host_identity() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return std::string(host) + "|" + read_first_line("/proc/sys/kernel/random/boot_id") + "|" +
         link_target("/proc/self/ns/pid") + "|" + link_target("/proc/self/ns/mnt");
}

bool process_alive(std::int32_t pid) {
  if (pid <= 0 || pid == ::getpid()) return true;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // An exited process its parent has not reaped yet still answers kill().
  const std::string stat = read_first_line("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  return !(paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z');
}

void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t seen, long nanoseconds) {
  timespec ts{0, nanoseconds};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// out[k] = ((s[0][k] + s[1][k]) + s[2][k]) + ... for k in [0, n).
template <typename T>
void sum_in_member_order(T* __restrict out, const std::vector<const T*>& s, std::size_t n) {
  const T* __restrict a = s[0];
  const T* __restrict b = s[1];
  for (std::size_t k = 0; k < n; ++k) out[k] = a[k] + b[k];
  for (std::size_t j = 2; j < s.size(); ++j) {
    const T* __restrict c = s[j];
    for (std::size_t k = 0; k < n; ++k) out[k] += c[k];
  }
}

/// The c10d work of one operation: complete when its future is.
class ShmWork : public c10d::Work {
 public:
  explicit ShmWork(c10::intrusive_ptr<c10::ivalue::Future> future)
      : c10d::Work(-1, c10d::OpType::ALLREDUCE), future_(std::move(future)) {}
  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override {
    return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
  }
  // The shared-memory thread enforces the group's timeout itself.
  bool wait(std::chrono::milliseconds) override {
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

struct ShmCollectives::Impl {
  int member = 0, size = 0;
  std::chrono::milliseconds timeout{0};
  void* base = nullptr;
  std::size_t bytes = 0;
  MemberControl* control = nullptr;
  char* data = nullptr;
  std::uint32_t barriers = 0;  ///< passed by this member (its thread only)
  std::uint64_t pieces = 0;    ///< reduced so far: picks the slot set

  enum class Kind { kAllReduce, kReduceScatter, kAllGather, kAllGatherInto, kAllToAll };
  struct Op {
    Kind kind = Kind::kAllReduce;
    at::Tensor in, out;  ///< all_reduce: in place in `in`
    std::vector<std::int64_t> offsets;  ///< reduce_scatter: member m's chunk is elements [offsets[m], offsets[m + 1]); all_to_all: send bytes
    std::vector<std::int64_t> more;     ///< all_to_all: receive bytes per member
    std::vector<std::vector<at::Tensor>> pieces;  ///< all_gather_into: member m's destination pieces
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Op> queue;
  bool stopping = false;
  bool running = false;  ///< an operation is running (on the thread or a caller's)
  std::atomic<bool> stop_waiting{false};
  std::string broken;  ///< why this member's segment can no longer be used
  std::thread thread;

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
    if (base) ::munmap(base, bytes);
  }

  char* slot(int set, int m) const {
    return data + (static_cast<std::size_t>(set) * size + m) * ShmCollectives::kSlotBytes;
  }

  void wait_for(int peer, std::uint32_t target) {
    MemberControl& c = control[peer];
    const auto start = std::chrono::steady_clock::now();
    auto next_check = start + std::chrono::milliseconds(100);
    for (int spins = 0;; ++spins) {
      const std::uint32_t seen = c.barriers.load(std::memory_order_acquire);
      if (static_cast<std::int32_t>(seen - target) >= 0) return;
      if (c.failed.load(std::memory_order_relaxed)) {
        throw std::runtime_error("member " + std::to_string(peer) + " failed an earlier shared-memory operation");
      }
      if (spins < 512) {
        cpu_relax();
        continue;
      }
      if (stop_waiting.load(std::memory_order_relaxed)) throw std::runtime_error("the group is shutting down");
      futex_wait(&c.barriers, seen, 1000000);
      const auto now = std::chrono::steady_clock::now();
      if (now < next_check) continue;
      next_check = now + std::chrono::milliseconds(100);
      if (!process_alive(c.pid)) {
        throw std::runtime_error("member " + std::to_string(peer) + " (pid " + std::to_string(c.pid) +
                                 ") has exited: the process of that rank ended");
      }
      if (now - start > timeout) {
        throw std::runtime_error("member " + std::to_string(peer) + " did not reach the shared-memory operation within " +
                                 std::to_string(timeout.count() / 1000.0).substr(0, 6) + " s");
      }
    }
  }

  void barrier() {
    const std::uint32_t k = ++barriers;
    control[member].barriers.store(k, std::memory_order_release);
    futex_wake(&control[member].barriers);
    for (int j = 0; j < size; ++j) {
      if (j != member) wait_for(j, k);
    }
  }

  template <typename T>
  void reduce(const at::Tensor& t) {
    T* mine = t.data_ptr<T>();
    const std::size_t numel = static_cast<std::size_t>(t.numel());
    const std::size_t per_slot = ShmCollectives::kSlotBytes / sizeof(T);
    std::vector<const T*> slots(static_cast<std::size_t>(size));
    for (std::size_t off = 0; off < numel; off += per_slot) {
      const std::size_t piece = std::min(per_slot, numel - off);
      const int set = static_cast<int>(pieces++ & 1);
      T* own = reinterpret_cast<T*>(slot(set, member));
      std::memcpy(own, mine + off, piece * sizeof(T));
      barrier();
      // Member i sums part i; parts are whole 64-byte lines but the last.
      const std::size_t line = 64 / sizeof(T);
      const std::size_t part = round_up((piece + size - 1) / size, line);
      auto lo = [&](int m) { return std::min(piece, part * static_cast<std::size_t>(m)); };
      for (int j = 0; j < size; ++j) slots[static_cast<std::size_t>(j)] = reinterpret_cast<const T*>(slot(set, j)) + lo(member);
      const std::size_t my_lo = lo(member), my_n = lo(member + 1) - my_lo;
      if (my_n > 0) {
        sum_in_member_order(mine + off + my_lo, slots, my_n);
        std::memcpy(own + my_lo, mine + off + my_lo, my_n * sizeof(T));
      }
      barrier();
      for (int j = 0; j < size; ++j) {
        if (j == member) continue;
        const std::size_t jl = lo(j), jn = lo(j + 1) - jl;
        if (jn > 0) std::memcpy(mine + off + jl, reinterpret_cast<const T*>(slot(set, j)) + jl, jn * sizeof(T));
      }
    }
  }

  /// Member m gets the member-order sum of elements [offsets[m],
  /// offsets[m + 1]) of everyone's `in`, in `out`. One barrier a piece:
  /// a slot set is written again two pieces later, after every member has
  /// passed the next piece's barrier (so has read this one).
  template <typename T>
  void reduce_scatter(const at::Tensor& in, const at::Tensor& out, const std::vector<std::int64_t>& offsets) {
    const T* src = in.data_ptr<T>();
    T* dst = out.data_ptr<T>();
    const std::size_t numel = static_cast<std::size_t>(in.numel());
    const std::size_t per_slot = ShmCollectives::kSlotBytes / sizeof(T);
    const std::size_t first = static_cast<std::size_t>(offsets[static_cast<std::size_t>(member)]);
    const std::size_t last = static_cast<std::size_t>(offsets[static_cast<std::size_t>(member) + 1]);
    std::vector<const T*> slots(static_cast<std::size_t>(size));
    for (std::size_t off = 0; off < numel; off += per_slot) {
      const std::size_t piece = std::min(per_slot, numel - off);
      const int set = static_cast<int>(pieces++ & 1);
      std::memcpy(slot(set, member), src + off, piece * sizeof(T));
      barrier();
      const std::size_t lo = std::max(first, off), hi = std::min(last, off + piece);
      if (lo >= hi) continue;
      for (int j = 0; j < size; ++j) slots[static_cast<std::size_t>(j)] = reinterpret_cast<const T*>(slot(set, j)) + (lo - off);
      sum_in_member_order(dst + (lo - first), slots, hi - lo);
    }
  }

  /// `out` = every member's `in` one after the other (bytes; any type).
  void all_gather(const at::Tensor& in, const at::Tensor& out) {
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    const std::size_t bytes = in.nbytes();
    std::memcpy(dst + bytes * static_cast<std::size_t>(member), src, bytes);
    for (std::size_t off = 0; off < bytes; off += ShmCollectives::kSlotBytes) {
      const std::size_t piece = std::min(ShmCollectives::kSlotBytes, bytes - off);
      const int set = static_cast<int>(pieces++ & 1);
      std::memcpy(slot(set, member), src + off, piece);
      barrier();
      for (int j = 0; j < size; ++j) {
        if (j != member) std::memcpy(dst + bytes * static_cast<std::size_t>(j) + off, slot(set, j), piece);
      }
    }
  }

  /// Bytes [off, off + n) of a member's stream, from `src`, into its
  /// destination pieces (`ends`: each piece's end in the stream).
  static void scatter_bytes(const std::vector<at::Tensor>& pieces, const std::vector<std::size_t>& ends,
                            std::size_t off, const char* src, std::size_t n) {
    std::size_t k = static_cast<std::size_t>(std::upper_bound(ends.begin(), ends.end(), off) - ends.begin());
    while (n > 0 && k < pieces.size()) {
      const std::size_t begin = ends[k] - pieces[k].nbytes();
      const std::size_t take = std::min(n, ends[k] - off);
      std::memcpy(static_cast<char*>(pieces[k].data_ptr()) + (off - begin), src, take);
      src += take;
      off += take;
      n -= take;
      ++k;
    }
  }

  /// Every member's `in` into its pieces: each member copies its own piece
  /// of the stream into its slot, then every other member's from theirs
  /// straight into the destination (its own bytes it copies directly).
  void all_gather_into(const at::Tensor& in, const std::vector<std::vector<at::Tensor>>& dests) {
    std::vector<std::vector<std::size_t>> ends(static_cast<std::size_t>(size));
    std::vector<std::size_t> lens(static_cast<std::size_t>(size), 0);
    for (int j = 0; j < size; ++j) {
      for (const auto& p : dests[static_cast<std::size_t>(j)]) {
        lens[static_cast<std::size_t>(j)] += p.nbytes();
        ends[static_cast<std::size_t>(j)].push_back(lens[static_cast<std::size_t>(j)]);
      }
    }
    const char* src = static_cast<const char*>(in.data_ptr());
    const std::size_t mine = lens[static_cast<std::size_t>(member)];
    scatter_bytes(dests[static_cast<std::size_t>(member)], ends[static_cast<std::size_t>(member)], 0, src, mine);
    const std::size_t longest = *std::max_element(lens.begin(), lens.end());
    auto part = [](std::size_t len, std::size_t off, std::size_t piece) {
      return off >= len ? std::size_t{0} : std::min(piece, len - off);
    };
    for (std::size_t off = 0; off < longest; off += ShmCollectives::kSlotBytes) {
      const std::size_t piece = std::min(ShmCollectives::kSlotBytes, longest - off);
      const int set = static_cast<int>(pieces++ & 1);
      const std::size_t own = part(mine, off, piece);
      if (own > 0) std::memcpy(slot(set, member), src + off, own);
      barrier();
      for (int j = 0; j < size; ++j) {
        const std::size_t n = part(lens[static_cast<std::size_t>(j)], off, piece);
        if (j != member && n > 0) {
          scatter_bytes(dests[static_cast<std::size_t>(j)], ends[static_cast<std::size_t>(j)], off, slot(set, j), n);
        }
      }
    }
  }

  /// Round 0 puts every member's send sizes in its slot (so member m's
  /// part of member j's stream starts at the sum of j's sizes for members
  /// below m); then the streams go piece by piece as in all_gather_into,
  /// each member copying from a slot only the bytes meant for it. Its own
  /// part it copies directly.
  void all_to_all(const at::Tensor& in, const at::Tensor& out, const std::vector<std::int64_t>& send,
                  const std::vector<std::int64_t>& recv) {
    const auto n = static_cast<std::size_t>(size), me = static_cast<std::size_t>(member);
    const int head = static_cast<int>(pieces++ & 1);
    std::memcpy(slot(head, member), send.data(), n * sizeof(std::int64_t));
    barrier();
    std::vector<std::size_t> from(n, 0), len(n, 0), at(n, 0);
    for (std::size_t j = 0; j < n; ++j) {
      const auto* sizes = reinterpret_cast<const std::int64_t*>(slot(head, static_cast<int>(j)));
      for (std::size_t d = 0; d < n; ++d) {
        if (d < me) from[j] += static_cast<std::size_t>(sizes[d]);
        len[j] += static_cast<std::size_t>(sizes[d]);
      }
      if (sizes[me] != recv[j]) {
        throw std::runtime_error("all_to_all: member " + std::to_string(j) + " sends " + std::to_string(sizes[me]) +
                                 " bytes to member " + std::to_string(member) + ", which expects " +
                                 std::to_string(recv[j]));
      }
      if (j > 0) at[j] = at[j - 1] + static_cast<std::size_t>(recv[j - 1]);
    }
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    if (recv[me] > 0) std::memcpy(dst + at[me], src + from[me], static_cast<std::size_t>(recv[me]));
    const std::size_t longest = *std::max_element(len.begin(), len.end());
    for (std::size_t off = 0; off < longest; off += ShmCollectives::kSlotBytes) {
      const std::size_t piece = std::min(ShmCollectives::kSlotBytes, longest - off);
      const int set = static_cast<int>(pieces++ & 1);
      if (off < len[me]) std::memcpy(slot(set, member), src + off, std::min(piece, len[me] - off));
      barrier();
      for (std::size_t j = 0; j < n; ++j) {
        // Bytes [from[j], from[j] + recv[j]) of member j's stream are mine.
        const std::size_t lo = std::max(off, from[j]), hi = std::min(off + piece, from[j] + static_cast<std::size_t>(recv[j]));
        if (j != me && lo < hi) std::memcpy(dst + at[j] + (lo - from[j]), slot(set, static_cast<int>(j)) + (lo - off), hi - lo);
      }
    }
  }

  void run_op(const Op& op) {
    const bool dbl = op.in.scalar_type() == at::kDouble;
    switch (op.kind) {
      case Kind::kAllReduce: dbl ? reduce<double>(op.in) : reduce<float>(op.in); break;
      case Kind::kReduceScatter:
        dbl ? reduce_scatter<double>(op.in, op.out, op.offsets) : reduce_scatter<float>(op.in, op.out, op.offsets);
        break;
      case Kind::kAllGather: all_gather(op.in, op.out); break;
      case Kind::kAllGatherInto: all_gather_into(op.in, op.pieces); break;
      case Kind::kAllToAll: all_to_all(op.in, op.out, op.offsets, op.more); break;
    }
  }

  /// Runs one operation and completes its future (`running` is set: only
  /// one operation at a time touches the segment and `broken`).
  void execute(Op& op) {
    if (!broken.empty()) {
      op.future->setError(std::make_exception_ptr(std::runtime_error(broken)));
      return;
    }
    try {
      run_op(op);
    } catch (const std::exception& e) {
      // The members' barrier counts no longer agree: every later operation
      // of this group fails too, and the peers stop waiting for this one.
      broken = std::string("shared memory: ") + e.what();
      control[member].failed.store(1, std::memory_order_relaxed);
      futex_wake(&control[member].barriers);
      op.future->setError(std::make_exception_ptr(std::runtime_error(broken)));
      return;
    }
    op.future->markCompleted(c10::IValue());
  }

  void run() {
    for (;;) {
      Op op;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || (!queue.empty() && !running); });
        if (queue.empty()) return;
        op = std::move(queue.front());
        queue.pop_front();
        running = true;
      }
      execute(op);
      std::lock_guard<std::mutex> lock(mu);
      running = false;
    }
  }

  /// Runs `op` on the calling thread if nothing is queued or running (so
  /// issue order holds); false leaves it to the thread.
  bool run_here(Op& op) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (running || !queue.empty() || stopping) return false;
      running = true;
    }
    execute(op);
    {
      std::lock_guard<std::mutex> lock(mu);
      running = false;
    }
    cv.notify_one();  // an operation queued meanwhile
    return true;
  }
};

ShmCollectives::ShmCollectives(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ShmCollectives::~ShmCollectives() {
  // Pending operations fail rather than wait for peers that may be gone.
  impl_->stop_waiting = true;
}

bool ShmCollectives::supports_sum(const at::Tensor& t) {
  return supports_copy(t) && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble);
}

bool ShmCollectives::supports_copy(const at::Tensor& t) {
  return t.device().is_cpu() && t.is_contiguous() && t.numel() > 0;
}

c10::intrusive_ptr<c10d::Work> ShmCollectives::enqueue(int kind, at::Tensor in, at::Tensor out,
                                                     std::vector<std::int64_t> offsets,
                                                     std::vector<std::vector<at::Tensor>> pieces,
                                                     std::vector<std::int64_t> more, bool now) {
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
  Impl::Op op;
  op.kind = static_cast<Impl::Kind>(kind);
  op.in = std::move(in);
  op.out = std::move(out);
  op.offsets = std::move(offsets);
  op.pieces = std::move(pieces);
  op.more = std::move(more);
  op.future = future;
  if (now && impl_->run_here(op)) return c10::make_intrusive<ShmWork>(future);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->queue.push_back(std::move(op));
  }
  impl_->cv.notify_one();
  return c10::make_intrusive<ShmWork>(future);
}

c10::intrusive_ptr<c10d::Work> ShmCollectives::all_reduce_sum(const at::Tensor& t) {
  return enqueue(static_cast<int>(Impl::Kind::kAllReduce), t, t, {});
}

c10::intrusive_ptr<c10d::Work> ShmCollectives::reduce_scatter_sum(const at::Tensor& in, const at::Tensor& out,
                                                                std::vector<std::int64_t> offsets) {
  return enqueue(static_cast<int>(Impl::Kind::kReduceScatter), in, out, std::move(offsets));
}

c10::intrusive_ptr<c10d::Work> ShmCollectives::all_gather(const at::Tensor& in, const at::Tensor& out) {
  return enqueue(static_cast<int>(Impl::Kind::kAllGather), in, out, {});
}

c10::intrusive_ptr<c10d::Work> ShmCollectives::all_gather_into(const at::Tensor& in,
                                                             std::vector<std::vector<at::Tensor>> out) {
  return enqueue(static_cast<int>(Impl::Kind::kAllGatherInto), in, at::Tensor(), {}, std::move(out));
}

c10::intrusive_ptr<c10d::Work> ShmCollectives::all_to_all(const at::Tensor& in, const at::Tensor& out,
                                                         std::vector<std::int64_t> send_bytes,
                                                         std::vector<std::int64_t> recv_bytes, bool now) {
  return enqueue(static_cast<int>(Impl::Kind::kAllToAll), in, out, std::move(send_bytes), {}, std::move(recv_bytes),
                 now);
}

std::shared_ptr<ShmCollectives> ShmCollectives::create(const c10::intrusive_ptr<c10d::Store>& store, int member, int size,
                                                   std::chrono::milliseconds timeout, std::string* why_not) {
  auto text = [](const std::vector<std::uint8_t>& v) { return std::string(v.begin(), v.end()); };
  auto bytes_of = [](const std::string& s) { return std::vector<std::uint8_t>(s.begin(), s.end()); };
  auto say = [&](const std::string& why) {
    if (why_not) *why_not = why;
    return std::shared_ptr<ShmCollectives>();
  };
  // 1. All on one host?
  const std::string me = host_identity();
  store->set("shm/host/" + std::to_string(member), bytes_of(me));
  for (int m = 0; m < size; ++m) {
    if (text(store->get("shm/host/" + std::to_string(m))) != me) {
      return say("member " + std::to_string(m) + " runs on another host (or in other namespaces)");
    }
  }
  // 2. Member 0 makes the segment; everyone maps it and says whether it could.
  const std::size_t control_bytes = round_up(sizeof(MemberControl) * static_cast<std::size_t>(size), kPage);
  const std::size_t total = control_bytes + 2 * static_cast<std::size_t>(size) * kSlotBytes;
  if (member == 0) {
    std::random_device rd;
    const std::string name = "/hp-shm-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
    std::string made = name;
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      made = "!shm_open " + name + ": " + std::strerror(errno);
    } else {
      // Reserved, not only sized: touching a page a full /dev/shm cannot
      // give would kill the process (SIGBUS); a refusal here leaves the
      // group on Gloo instead.
      const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(total));
      if (err != 0) {
        made = "!reserving " + std::to_string(total) + " bytes for " + name + " in /dev/shm: " + std::strerror(err);
        ::shm_unlink(name.c_str());
      }
      ::close(fd);
    }
    store->set("shm/name", bytes_of(made));
  }
  const std::string name = text(store->get("shm/name"));
  if (!name.empty() && name[0] == '!') return say(name.substr(1));
  void* base = MAP_FAILED;
  std::string mine = "1";
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    mine = std::string("shm_open: ") + std::strerror(errno);
  } else {
    base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) mine = std::string("mmap: ") + std::strerror(errno);
    ::close(fd);
  }
  if (base != MAP_FAILED) static_cast<MemberControl*>(base)[member].pid = ::getpid();
  store->set("shm/ok/" + std::to_string(member), bytes_of(mine));
  std::string failed;
  for (int m = 0; m < size; ++m) {
    const std::string ok = text(store->get("shm/ok/" + std::to_string(m)));
    if (ok != "1" && failed.empty()) failed = "member " + std::to_string(m) + " could not map " + name + ": " + ok;
  }
  // Every member has mapped it (or failed to): the name can go, so nothing
  // is left in /dev/shm whatever happens to the job.
  if (member == 0) ::shm_unlink(name.c_str());
  if (!failed.empty()) {
    if (base != MAP_FAILED) ::munmap(base, total);
    return say(failed);
  }
  auto impl = std::make_unique<Impl>();
  impl->member = member;
  impl->size = size;
  impl->timeout = timeout;
  impl->base = base;
  impl->bytes = total;
  impl->control = static_cast<MemberControl*>(base);
  impl->data = static_cast<char*>(base) + control_bytes;
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::shared_ptr<ShmCollectives>(new ShmCollectives(std::move(impl)));
}

}  // namespace hp::dist
