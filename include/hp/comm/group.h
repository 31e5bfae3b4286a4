#pragma once
// A named communication group and the collectives the parallel layers need,
// built from what c10d's Gloo backend in LibTorch 1.13 actually supports:
//   all_reduce, broadcast, send/recv, barrier, uneven all_to_all  -> native
//   all_gather (flat, along any dim)  -> list all-gather + concatenation
//   reduce_scatter (along any dim)    -> all-to-all of the chunks + local sum
// Members on one host go through a shared-memory segment instead (sums,
// gathers, all-to-all; detail/shm_collectives.h).
// bfloat16 and half move as their own bytes (half the bytes of fp32); their
// sums are an exchange plus a local fp32 sum in member order (all_reduce:
// an all-gather, (n - 1) x the bytes per member; reduce_scatter: the
// all-to-all), cast back, so every member gets the same bits.
// Every op waits with the group's timeout; a failure throws CommError naming
// the group, the op, this rank and the group's ranks.
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
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

/// An operation in flight, as c10d's Work: a Group's *_async calls return
/// one at once and the operation runs on the group's communication thread.
/// wait() blocks until it is complete (with the group's timeout) and
/// returns its result; a failure throws CommError naming the operation, the
/// group and this rank. completed() never blocks. The destructor waits too
/// (errors there are dropped: they surface at wait, or already did), so no
/// tensor is freed while Gloo still uses it. The flight recorder's entry
/// and the profile span of the operation close when it completes (a
/// collective's completion is stamped by the communication thread).
class Work {
 public:
  ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  /// True once the operation has completed, successfully or not.
  bool completed();
  /// Blocks until complete; the result: all_reduce / broadcast / recv the
  /// tensor given (updated), all_gather the concatenation, reduce_scatter
  /// this member's chunk, all_to_all the rows received, send undefined.
  /// Waiting again returns the same result.
  at::Tensor wait();
  /// "all_reduce", "send to member 1", ...
  const std::string& op() const;

 private:
  friend class Group;
  struct Impl;
  explicit Work(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// A send in flight (Group::isend): a Work whose result is empty.
using PendingSend = Work;

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

  // Each operation exists as *_async (returns a Work at once) and as a
  // blocking call (the same operation, waited). Members must issue the
  // collectives of one group in the same order, blocking or not.

  /// In place. kAvg divides the sum by the group size.
  void all_reduce(at::Tensor& t, ReduceKind op = ReduceKind::kSum);
  /// `t` is updated when the Work completes and is waited.
  std::unique_ptr<Work> all_reduce_async(const at::Tensor& t, ReduceKind op = ReduceKind::kSum);
  /// In place; `root` is an index inside the group.
  void broadcast(at::Tensor& t, int root);
  std::unique_ptr<Work> broadcast_async(const at::Tensor& t, int root);
  /// Concatenation of every member's `t` along `dim` (all must have the same shape).
  at::Tensor all_gather(const at::Tensor& t, std::int64_t dim = 0);
  std::unique_ptr<Work> all_gather_async(const at::Tensor& t, std::int64_t dim = 0);
  /// Every member's `t` (shapes may differ along dim 0 only if `sizes` given).
  std::vector<at::Tensor> all_gather_list(const at::Tensor& t);
  /// Every member's `in` (1-D, contiguous; the members' lengths may differ)
  /// written into `out[m]`, member m's pieces in order: contiguous tensors of
  /// in's type whose element counts add up to member m's length (every member
  /// passes pieces of the same sizes; this member's own are filled too). On
  /// shared memory each member's bytes go from the segment straight into the
  /// pieces; on Gloo the inputs are gathered (padded to the longest) and
  /// copied into the pieces when the Work is waited. The pieces must stay
  /// untouched until then; the Work's result is `in`.
  std::unique_ptr<Work> all_gather_into_async(const at::Tensor& in, std::vector<std::vector<at::Tensor>> out);
  /// Sum over members of `t`, split evenly along `dim`; this member's chunk.
  /// `t.size(dim)` must be divisible by the group size.
  at::Tensor reduce_scatter(const at::Tensor& t, std::int64_t dim = 0,
                            ReduceKind op = ReduceKind::kSum);
  std::unique_ptr<Work> reduce_scatter_async(const at::Tensor& t, std::int64_t dim = 0,
                                             ReduceKind op = ReduceKind::kSum);
  /// Same with chunks of any length: the rows of `t` (dim 0) are cut into
  /// consecutive chunks of `counts[i]` rows for member i (every member gives
  /// the same counts); the sum of this member's chunks (`counts[rank()]`
  /// rows). The even form above is this with equal counts.
  at::Tensor reduce_scatter(const at::Tensor& t, const std::vector<std::int64_t>& counts,
                            ReduceKind op = ReduceKind::kSum);
  std::unique_ptr<Work> reduce_scatter_async(const at::Tensor& t,
                                             const std::vector<std::int64_t>& counts,
                                             ReduceKind op = ReduceKind::kSum);
  /// Rows of `t` (dim 0) are sent in chunks of `send_counts[i]` to member i;
  /// returns the rows received, `recv_counts[i]` from member i.
  at::Tensor all_to_all(const at::Tensor& t, const std::vector<std::int64_t>& send_counts,
                        const std::vector<std::int64_t>& recv_counts);
  std::unique_ptr<Work> all_to_all_async(const at::Tensor& t, const std::vector<std::int64_t>& send_counts,
                                         const std::vector<std::int64_t>& recv_counts);
  /// `dst`/`src` are indices inside the group.
  void send(const at::Tensor& t, int dst, int tag = 0);
  void recv(at::Tensor& t, int src, int tag = 0);
  /// Starts a send and returns at once (pipeline stage messages: sends never
  /// block a schedule, only receives wait).
  std::unique_ptr<Work> isend(const at::Tensor& t, int dst, int tag = 0);
  /// Posts a receive into `t` (contiguous, the message's exact size) and
  /// returns at once; `t` holds the message once the Work is waited.
  std::unique_ptr<Work> irecv(const at::Tensor& t, int src, int tag = 0);
  void barrier();
  std::unique_ptr<Work> barrier_async();

  /// Per op: calls, bytes and seconds from issue to completion.
  const std::map<std::string, OpStats>& stats() const { return stats_; }
  /// Records every operation of this group in `recorder` (null: none).
  void set_recorder(std::shared_ptr<flight::Recorder> recorder) { recorder_ = std::move(recorder); }

 private:
  friend class Work;
  /// `now`: the caller waits at once, so on shared memory the exchange
  /// runs on the calling thread when the group's thread is idle (no hand-
  /// off to that thread and back, two wake-ups per exchange).
  /// all_reduce of bfloat16/half: every member's bytes gathered, summed
  /// locally in fp32 in member order, cast back.
  std::unique_ptr<Work> all_reduce_narrow(const at::Tensor& t, ReduceKind op);
  std::unique_ptr<Work> start_all_to_all(const at::Tensor& t, const std::vector<std::int64_t>& send_counts,
                                         const std::vector<std::int64_t>& recv_counts, bool now);
  [[noreturn]] void fail(const std::string& op, const std::string& cause) const;
  /// Issues an op with `start()` (returning c10d work) and returns its Work;
  /// `finish` turns the completed op's buffers into its result. Any failure
  /// to issue becomes a CommError.
  template <typename Start>
  std::unique_ptr<Work> launch(const std::string& op, std::uint64_t bytes, Start&& start, flight::Kind kind,
                               int peer, std::function<at::Tensor()> finish);
  /// The blocking form of an op: waits, its span on the caller's track.
  static at::Tensor wait_here(std::unique_ptr<Work> w);
  /// A Work that is complete already (ops of a one-member group).
  std::unique_ptr<Work> local(const std::string& op, at::Tensor result);
  /// Where this group's operations in flight appear in a profile trace.
  int trace_track();
  std::string name_;
  std::vector<int> ranks_;
  int my_global_rank_;
  int my_index_ = 0;
  std::shared_ptr<PgHandle> pg_;
  std::chrono::milliseconds timeout_;
  std::map<std::string, OpStats> stats_;
  std::shared_ptr<flight::Recorder> recorder_;
  int trace_track_ = -1;
  std::int64_t track_busy_until_ns_ = 0;  ///< end of the last span on that track
};

}  // namespace hp::dist
