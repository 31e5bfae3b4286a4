#pragma once
// Sending Activations between pipeline stages as self-describing messages.
//
// A channel is one direction of one chunk boundary (forward activations from
// chunk b to b + 1, or their gradients back). On its first message the sender
// sends a header (stage_message.h: count, names, dtypes, shapes) and then the
// data: every tensor's bytes back to back plus one trailing int64, the
// header's generation. Later messages are data only; the receiver already
// knows their size. When something changes the sender first sends one
// message of the OLD size whose trailer is -1 ("a new header follows"), then
// the new header, then the data, so a receiver never posts a receive of the
// wrong size.
//
// Sends are non-blocking (a schedule only ever waits on receives); a receive
// waits with the collective timeout and a failure names the stage, the
// micro-batch and what was awaited.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/model/activations.h"
#include "plugins/pipeline_parallel/stage_message.h"

namespace hp::dist {
class Group;
class Work;
}  // namespace hp::dist

namespace hp::pipeline {

enum class Direction { kForward = 0, kBackward = 1 };

/// Where a message goes and what it is, for tags and error messages.
struct MessageId {
  Direction dir;
  int boundary;  ///< from chunk `boundary` to `boundary + 1` (forward), or back
  int mb;
};

class StageLink {
 public:
  /// `pp` is the pipeline group (indices = stage ranks); `chunks` = P * V.
  StageLink(dist::Group& pp, int chunks, int stage);
  ~StageLink();

  /// Sends `a` (tensors in order) to stage `peer`.
  void send(const Activations& a, int peer, const MessageId& id);
  /// Receives the Activations `peer` sent with `id` (blocks).
  Activations recv(int peer, const MessageId& id);

  /// Posts the receive of message `id` from `peer` now, so its data lands
  /// as soon as it is sent and recv() only waits for what is still on the
  /// wire. Only once the channel's header is known (its size): the first
  /// message of a channel is received when asked for. A message of another
  /// size is announced by one of the old size first, so a posted receive
  /// always fits.
  void prepost(int peer, const MessageId& id);

  /// Drops sends that have completed (never blocks).
  void reap();
  /// Waits for every send in flight.
  void wait_all();

  /// Seconds spent blocked in recv and wait_all since the last call.
  double take_wait_seconds();
  /// The same, without resetting.
  double wait_seconds() const { return wait_seconds_; }
  std::int64_t headers_sent() const { return headers_sent_; }

 private:
  struct Channel {
    std::vector<TensorMeta> metas;
    std::int64_t generation = 0;
    std::int64_t payload_bytes = 0;
  };
  int tag(const MessageId& id, int kind) const;
  void post(const at::Tensor& buf, int peer, int tag);
  at::Tensor take(int peer, int tag, std::int64_t bytes, const MessageId& id, const char* what);
  std::string describe(const MessageId& id, int peer) const;

  dist::Group& pp_;
  int chunks_;
  int stage_;
  std::map<std::pair<int, int>, Channel> send_channels_, recv_channels_;  // (dir, boundary)
  std::vector<std::unique_ptr<dist::Work>> in_flight_;
  std::map<int, at::Tensor> local_;  // messages to this same stage (P = 1)
  std::map<int, std::unique_ptr<dist::Work>> posted_;  // tag -> receive posted ahead
  double wait_seconds_ = 0;
  std::int64_t headers_sent_ = 0;
};

/// The metas of `a`, in order.
std::vector<TensorMeta> describe_activations(const Activations& a);

}  // namespace hp::pipeline
