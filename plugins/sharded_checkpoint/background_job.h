#pragma once
// One job at a time on a background thread: a checkpoint written while
// training goes on. Starting a job waits for the previous one; a failure is
// kept and thrown by the next wait() (or seen without blocking by
// failure()), so it stops the run at the next step boundary rather than
// vanishing with the thread.
#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace hp::sharded_checkpoint {

class BackgroundJob {
 public:
  BackgroundJob() = default;
  /// Waits for a job still running; a failure not yet reported is dropped
  /// (the run is ending anyway).
  ~BackgroundJob();
  BackgroundJob(const BackgroundJob&) = delete;
  BackgroundJob& operator=(const BackgroundJob&) = delete;

  /// Waits for the previous job (throwing its failure), then runs `job`.
  void start(std::function<void()> job);
  /// Waits for the running job, if any; throws std::runtime_error with its
  /// failure's message (once).
  void wait();
  /// The failure of a finished job, "" if none; does not block.
  std::string failure() const;
  bool running() const { return running_.load(); }

 private:
  std::thread thread_;
  std::atomic<bool> running_{false};
  mutable std::mutex mutex_;
  std::string failure_;
};

}  // namespace hp::sharded_checkpoint
