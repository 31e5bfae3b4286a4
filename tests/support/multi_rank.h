#pragma once
// Multi-rank tests in one process: one thread per rank, a FileStore in a
// fresh temporary file, real Gloo process groups on 127.0.0.1.
#include <chrono>
#include <functional>

#include "hp/comm/context.h"
#include "tools/hp_ckpt/layout.h"

namespace hp::test {

/// Runs `fn` on `mesh.world_size()` threads, each with its own
/// DistributedContext. An exception on any rank fails the call (rethrown
/// after every thread has ended); ranks that still wait are released by the
/// timeout.
void run_ranks(const dist::ProcessMesh& mesh,
               const std::function<void(dist::DistributedContext&)>& fn,
               std::chrono::milliseconds timeout = std::chrono::seconds(30));
/// As above, every rank's context made with `options` (its store file and
/// timeout set here).
void run_ranks(const dist::ProcessMesh& mesh, const dist::ContextOptions& options,
               const std::function<void(dist::DistributedContext&)>& fn,
               std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// The mesh the shipped features build for these sizes (tp fastest, then
/// dp, then pp; ep carved out of dp).
inline dist::ProcessMesh grid(int pp, int dp, int tp, int ep = 1) {
  return ckpt_tool::layout_mesh({{"pp", pp}, {"dp", dp}, {"tp", tp}, {"ep", ep}});
}

/// A world of `n` ranks, data parallel only.
inline void run_ranks(int n, const std::function<void(dist::DistributedContext&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  run_ranks(grid(1, n, 1), fn, timeout);
}

}  // namespace hp::test
