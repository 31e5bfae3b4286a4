#pragma once
// A named communication group and the collectives the parallel layers need,
// built from what c10d's Gloo backend in LibTorch 1.13 actually supports:
//   all_reduce, broadcast, send/recv, barrier, uneven all_to_all  -> native
//   all_gather (flat, along any dim)  -> list all-gather + concatenation
//   reduce_scatter (along any dim)    -> all-to-all of the chunks + local sum
// Every op waits with the group's timeout; a failure throws CommError naming
// the group, the op, this rank and the group's ranks.
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace hp::dist {

struct PgHandle;  // detail/pg_handle.h
namespace flight {
class Recorder;  // flight_recorder.h
enum class Kind;
}

class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ReduceKind { kSum, kMax, kMin, kAvg };

/// Bytes sent and seconds spent, per op, for metrics.
struct OpStats {
  std::uint64_t calls = 0;
  std::uint64_t bytes = 0;
  double seconds = 0.0;
};

class Group;

/// A send in flight (Group::isend). wait() blocks until the receiver has the
/// data (with the group timeout); the destructor waits too, so a tensor is
/// never freed while Gloo still reads it.
class PendingSend {
 public:
  ~PendingSend();
  PendingSend(const PendingSend&) = delete;
  PendingSend& operator=(const PendingSend&) = delete;
  /// True once the receiver has taken the data (never blocks).
  bool done();
  void wait();

 private:
  friend class Group;
  struct Impl;
  explicit PendingSend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Group {
 public:
  /// `pg` may be null when the group has one member: every op is then local.
  Group(std::string name, std::vector<int> global_ranks, int my_global_rank,
        std::shared_ptr<PgHandle> pg, std::chrono::milliseconds timeout);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const std::string& name() const { return name_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  /// This process's index inside the group.
  int rank() const { return my_index_; }
  const std::vector<int>& global_ranks() const { return ranks_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// In place. kAvg divides the sum by the group size.
  void all_reduce(at::Tensor& t, ReduceKind op = ReduceKind::kSum);
  /// In place; `root` is an index inside the group.
  void broadcast(at::Tensor& t, int root);
  /// Concatenation of every member's `t` along `dim` (all must have the same shape).
  at::Tensor all_gather(const at::Tensor& t, std::int64_t dim = 0);
  /// Every member's `t` (shapes may differ along dim 0 only if `sizes` given).
  std::vector<at::Tensor> all_gather_list(const at::Tensor& t);
  /// Sum over members of `t`, split evenly along `dim`; this member's chunk.
  /// `t.size(dim)` must be divisible by the group size.
  at::Tensor reduce_scatter(const at::Tensor& t, std::int64_t dim = 0,
                            ReduceKind op = ReduceKind::kSum);
  /// Same with chunks of any length: the rows of `t` (dim 0) are cut into
  /// consecutive chunks of `counts[i]` rows for member i (every member gives
  /// the same counts); returns the sum of this member's chunks
  /// (`counts[rank()]` rows).
  at::Tensor reduce_scatter(const at::Tensor& t, const std::vector<std::int64_t>& counts,
                            ReduceKind op = ReduceKind::kSum);
  /// Rows of `t` (dim 0) are sent in chunks of `send_counts[i]` to member i;
  /// returns the rows received, `recv_counts[i]` from member i.
  at::Tensor all_to_all(const at::Tensor& t, const std::vector<std::int64_t>& send_counts,
                        const std::vector<std::int64_t>& recv_counts);
  /// `dst`/`src` are indices inside the group.
  void send(const at::Tensor& t, int dst, int tag = 0);
  void recv(at::Tensor& t, int src, int tag = 0);
  /// Starts a send and returns at once (pipeline stage messages: sends never
  /// block a schedule, only receives wait).
  std::unique_ptr<PendingSend> isend(const at::Tensor& t, int dst, int tag = 0);
  void barrier();

  const std::map<std::string, OpStats>& stats() const { return stats_; }
  /// Records every operation of this group in `recorder` (null: none).
  void set_recorder(std::shared_ptr<flight::Recorder> recorder) { recorder_ = std::move(recorder); }

 private:
  friend class PendingSend;
  [[noreturn]] void fail(const std::string& op, const std::string& cause) const;
  /// Starts an op with `start()` (returning c10d work), waits with the
  /// timeout, records stats; any failure becomes a CommError.
  template <typename Start>
  void run(const std::string& op, std::uint64_t bytes, Start&& start, flight::Kind kind, int peer = -1);
  std::string name_;
  std::vector<int> ranks_;
  int my_global_rank_;
  int my_index_ = 0;
  std::shared_ptr<PgHandle> pg_;
  std::chrono::milliseconds timeout_;
  std::map<std::string, OpStats> stats_;
  std::shared_ptr<flight::Recorder> recorder_;
};

}  // namespace hp::dist
