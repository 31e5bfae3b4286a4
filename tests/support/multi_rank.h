#pragma once
// Multi-rank tests in one process: one thread per rank, a FileStore in a
// fresh temporary file, real Gloo process groups on 127.0.0.1.
#include <chrono>
#include <functional>

#include "backends/dist/context.h"

namespace hp::test {

/// Runs `fn` on `mesh.world_size()` threads, each with its own
/// DistributedContext. An exception on any rank fails the call (rethrown
/// after every thread has ended); ranks that still wait are released by the
/// timeout.
void run_ranks(const dist::ProcessMesh& mesh,
               const std::function<void(dist::DistributedContext&)>& fn,
               std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// A world of `n` ranks, data parallel only.
inline void run_ranks(int n, const std::function<void(dist::DistributedContext&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  run_ranks(dist::ProcessMesh(1, n, 1), fn, timeout);
}

}  // namespace hp::test
