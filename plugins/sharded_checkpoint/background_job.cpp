#include "plugins/sharded_checkpoint/background_job.h"

#include <exception>
#include <stdexcept>
#include <utility>

namespace hp::sharded_checkpoint {

BackgroundJob::~BackgroundJob() {
  if (thread_.joinable()) thread_.join();
}

void BackgroundJob::start(std::function<void()> job) {
  wait();
  running_ = true;
  thread_ = std::thread([this, job = std::move(job)] {
    std::string why;
    try {
      job();
    } catch (const std::exception& e) {
      why = e.what();
      if (why.empty()) why = "unknown error";
    } catch (...) {
      why = "unknown error";
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      failure_ = why;
    }
    running_ = false;
  });
}

void BackgroundJob::wait() {
  if (thread_.joinable()) thread_.join();
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    why = std::exchange(failure_, std::string());
  }
  if (!why.empty()) throw std::runtime_error(why);
}

std::string BackgroundJob::failure() const {
  if (running_) return "";
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

}  // namespace hp::sharded_checkpoint
