#include "plugins/sharded_checkpoint/background_job.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace hp::sharded_checkpoint {
namespace {

using namespace std::chrono_literals;

TEST(BackgroundJob, RunsWhileTheCallerGoesOn) {
  BackgroundJob job;
  std::atomic<bool> release{false}, done{false};
  job.start([&] {
    while (!release) std::this_thread::sleep_for(1ms);
    done = true;
  });
  EXPECT_TRUE(job.running());
  EXPECT_FALSE(done);
  EXPECT_EQ(job.failure(), "");
  release = true;
  job.wait();
  EXPECT_TRUE(done);
  EXPECT_FALSE(job.running());
}

// The next save waits for the previous one: the second job starts only
// after the first has finished.
TEST(BackgroundJob, TheNextJobWaitsForThePrevious) {
  BackgroundJob job;
  std::atomic<int> order{0};
  int first_at = -1, second_at = -1;
  job.start([&] {
    std::this_thread::sleep_for(100ms);
    first_at = order++;
  });
  job.start([&] { second_at = order++; });
  job.wait();
  EXPECT_EQ(first_at, 0);
  EXPECT_EQ(second_at, 1);
}

// A failure is seen without blocking once the job ended, thrown by wait()
// with its message, and only once.
TEST(BackgroundJob, AFailureSurfacesOnce) {
  BackgroundJob job;
  job.start([] { throw std::runtime_error("rank 3: writing model-rank00003.safetensors failed: disk full"); });
  for (int i = 0; i < 500 && job.running(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(job.failure(), "rank 3: writing model-rank00003.safetensors failed: disk full");
  try {
    job.wait();
    FAIL() << "expected the job's failure";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "rank 3: writing model-rank00003.safetensors failed: disk full");
  }
  EXPECT_EQ(job.failure(), "");
  EXPECT_NO_THROW(job.wait());
}

// Starting the next job after a failed one throws that failure instead of
// writing over it.
TEST(BackgroundJob, StartAfterAFailureThrowsIt) {
  BackgroundJob job;
  bool second_ran = false;
  job.start([] { throw std::runtime_error("first failed"); });
  EXPECT_THROW(job.start([&] { second_ran = true; }), std::runtime_error);
  job.wait();
  EXPECT_FALSE(second_ran);
}

TEST(BackgroundJob, DestructorWaitsForTheJob) {
  std::atomic<bool> done{false};
  {
    BackgroundJob job;
    job.start([&] {
      std::this_thread::sleep_for(50ms);
      done = true;
    });
  }
  EXPECT_TRUE(done);
}

}  // namespace
}  // namespace hp::sharded_checkpoint
