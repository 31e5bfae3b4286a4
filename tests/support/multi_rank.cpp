#include "tests/support/multi_rank.h"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <atomic>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hp::test {

void run_ranks(const dist::ProcessMesh& mesh,
               const std::function<void(dist::DistributedContext&)>& fn,
               std::chrono::milliseconds timeout) {
  run_ranks(mesh, dist::ContextOptions(), fn, timeout);
}

void run_ranks(const dist::ProcessMesh& mesh, const dist::ContextOptions& options,
               const std::function<void(dist::DistributedContext&)>& fn,
               std::chrono::milliseconds timeout) {
  static std::atomic<int> counter{0};
  const std::string file = (std::filesystem::temp_directory_path() /
                            ("hp_test_store_" + std::to_string(::getpid()) + "_" +
                             std::to_string(counter++)))
                               .string();
  std::filesystem::remove(file);
  at::set_num_threads(1);
  const int world = mesh.world_size();
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        dist::DistEnv env;
        env.rank = r;
        env.world_size = world;
        env.local_rank = r;
        env.local_world_size = world;
        env.source = "test";
        auto ctx = dist::DistributedContext::create(env, mesh, dist::ContextOptions(options).with_file(file).with_timeout(timeout));
        fn(*ctx);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::filesystem::remove(file);
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace hp::test
