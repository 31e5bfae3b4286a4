#pragma once
// Private: the c10d process group behind a Group (kept out of group.h so the
// public header stays light).
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <memory>

namespace hp::dist {
class ShmCollectives;  // detail/shm_collectives.h
struct PgHandle {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  /// The group's all-reduces of float tensors, when its members share a
  /// host (ContextOptions::shm_collectives); null: all through `pg`.
  std::shared_ptr<ShmCollectives> shm;
};
}  // namespace hp::dist
