#pragma once
// Private: the c10d process group behind a Group (kept out of group.h so the
// public header stays light).
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace hp::dist {
struct PgHandle {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
};
}  // namespace hp::dist
