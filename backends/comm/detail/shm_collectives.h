#pragma once
// Private: the sums and gathers of a group whose members share one host,
// through one shared-memory segment instead of Gloo's TCP loopback (what
// NCCL does between GPUs of a node, and DeepSpeed's CPU backend between
// processes).
//
// Each operation runs on the group's shared-memory thread, in issue order
// (or on the caller's thread, when it waits at once and that thread is
// idle with nothing queued), piece by piece (a piece: at most kSlotBytes of the tensor). An
// all-reduce:
//   1. every member copies its piece into its own slot;   barrier
//   2. member i sums part i of the piece over all slots, in member order
//      (((s0 + s1) + s2) + ...), into its slot and its tensor;   barrier
//   3. every member copies the other members' summed parts into its tensor.
// A reduce-scatter is steps 1 and 2 with member i's part its chunk; an
// all-gather is step 1, then every member copies every slot; an
// all-to-all is an all-gather of the send sizes, then of the send buffers,
// each member copying only its own parts out of the slots. Two sets of
// slots alternate, so the barrier of piece k + 1 also says that every
// member has finished reading the slots of piece k - 1. Every member gets
// the same bits (each part is summed once, in a fixed order: the order of
// Group::reduce_scatter's all-to-all and sum); with two members a sum
// equals Gloo's all-reduce (a + b = b + a in IEEE arithmetic).
// A barrier spins briefly, then sleeps on a futex; waiting fails, naming the
// member, when a peer process has exited, when a peer failed, or after the
// group's timeout.
#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Store;
class Work;
}  // namespace c10d

namespace hp::dist {

class ShmCollectives {
 public:
  /// Bytes of one member's slot: the largest piece reduced at once.
  static constexpr std::size_t kSlotBytes = 2u << 20;

  /// Collective over the group's members (each calls it with its index):
  /// agrees through `store` whether all members run on this host and can
  /// map one segment. Null when not (every member gets null then, so they
  /// all stay on Gloo); `why_not` says why.
  static std::shared_ptr<ShmCollectives> create(const c10::intrusive_ptr<c10d::Store>& store, int member, int size,
                                              std::chrono::milliseconds timeout, std::string* why_not);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  /// Whether a sum of `t` can go through shared memory: contiguous, on the
  /// CPU, not empty, float or double. (Members decide alike: they pass
  /// tensors of one type and size.)
  static bool supports_sum(const at::Tensor& t);
  /// Whether `t` can be gathered through shared memory: contiguous, on the
  /// CPU, not empty; any type.
  static bool supports_copy(const at::Tensor& t);

  // Each runs on the shared-memory thread, in issue order; the returned
  // c10d work completes (a future, as Gloo's) when it is done. The tensors
  // must stay untouched until then.

  /// Sums `t` over the members in place.
  c10::intrusive_ptr<c10d::Work> all_reduce_sum(const at::Tensor& t);
  /// `out` (offsets[m + 1] - offsets[m] elements, m this member) = the
  /// member-order sum of elements [offsets[m], offsets[m + 1]) of every
  /// member's `in` (as Group::reduce_scatter's all-to-all and sum).
  c10::intrusive_ptr<c10d::Work> reduce_scatter_sum(const at::Tensor& in, const at::Tensor& out,
                                                    std::vector<std::int64_t> offsets);
  /// `out` (size × in's elements) = member 0's `in`, member 1's, ...
  c10::intrusive_ptr<c10d::Work> all_gather(const at::Tensor& in, const at::Tensor& out);
  /// Member m's `in` (lengths may differ between members) written into
  /// `out[m]`, its pieces in order (contiguous; their bytes add up to member
  /// m's), straight from the slots: no gathered copy in between.
  c10::intrusive_ptr<c10d::Work> all_gather_into(const at::Tensor& in, std::vector<std::vector<at::Tensor>> out);
  /// Uneven all-to-all of bytes: `in` holds this member's parts for
  /// members 0, 1, ... (send_bytes[d] for member d), `out` receives member
  /// j's part for this member at the sum of recv_bytes[< j]. The members'
  /// send sizes go through the segment first, so a receiver finds its part
  /// in each sender's stream; a size that disagrees with recv_bytes fails
  /// the operation naming both members.
  /// `now`: run it on the calling thread if the shared-memory thread is
  /// idle with nothing queued (the returned work is then complete), for a
  /// caller that waits at once.
  c10::intrusive_ptr<c10d::Work> all_to_all(const at::Tensor& in, const at::Tensor& out,
                                            std::vector<std::int64_t> send_bytes,
                                            std::vector<std::int64_t> recv_bytes, bool now = false);

 private:
  struct Impl;
  explicit ShmCollectives(std::unique_ptr<Impl> impl);
  c10::intrusive_ptr<c10d::Work> enqueue(int kind, at::Tensor in, at::Tensor out, std::vector<std::int64_t> offsets,
                                         std::vector<std::vector<at::Tensor>> pieces = {},
                                         std::vector<std::int64_t> more = {}, bool now = false);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hp::dist
