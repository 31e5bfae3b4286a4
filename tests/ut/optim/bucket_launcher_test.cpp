// BucketLauncher: when buckets of gradient reductions are launched. Real
// autograd (AccumulateGrad post-hooks), no communication: `launch` records
// the order and the moment (inside backward or at flush).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "hp/optim/buckets.h"
#include "hp/optim/grad_sync.h"

namespace {

struct Chain {
  // y = x * w0 * w1 * w2 * w3: backward reaches w3 first, w0 last.
  std::vector<hp::ParamEntry> params;
  Chain() {
    for (int i = 0; i < 4; ++i) {
      hp::ParamEntry p;
      p.spec.name = "w" + std::to_string(i);
      p.spec.global_shape = {3};
      p.tensor = torch::full({3}, 1.0 + 0.1 * i).requires_grad_(true);
      p.tensor.mutable_grad() = torch::zeros({3});
      params.push_back(p);
    }
  }
  void backward(double scale = 1.0) {
    auto y = torch::ones({3}) * scale;
    for (auto& p : params) y = y * p.tensor;
    y.sum().backward();
  }
};

struct Recorder {
  std::vector<std::string> events;  // "b<k>" launched, "end" backward returned
};

}  // namespace

TEST(BucketLauncher, FirstStepCountsThenHooksLaunchInQueueOrderDuringBackward) {
  Chain c;
  Recorder r;
  // Buckets in reverse parameter order, as the reducers cut them.
  hp::BucketLauncher l(c.params, {{3, 2}, {1}, {0}}, {{0, 1, 2}}, {true}, true, 0,
                       [&](std::size_t b) { r.events.push_back("b" + std::to_string(b)); });
  // Step 1: two micro-batches; hooks only count, flush launches everything.
  c.backward();
  c.backward();
  r.events.push_back("end");
  l.flush();
  EXPECT_EQ(r.events, (std::vector<std::string>{"end", "b0", "b1", "b2"}));
  l.end_step();
  EXPECT_EQ(l.early(), 0u);
  // Step 2: after the second micro-batch's gradients every bucket is
  // launched from inside backward, in queue order.
  r.events.clear();
  c.backward();
  EXPECT_TRUE(r.events.empty()) << "nothing is complete after the first of two micro-batches";
  c.backward();
  r.events.push_back("end");
  l.flush();
  EXPECT_EQ(r.events, (std::vector<std::string>{"b0", "b1", "b2", "end"}));
  l.end_step();
  EXPECT_EQ(l.early(), 3u);
}

TEST(BucketLauncher, ABucketWaitsForTheOnesBeforeItInItsQueue) {
  Chain c;
  Recorder r;
  // w0's bucket first in the queue: it completes last, so nothing can
  // launch before it, and then all three do at once.
  hp::BucketLauncher l(c.params, {{0}, {3, 2}, {1}}, {{0, 1, 2}}, {true}, true, 0,
                       [&](std::size_t b) { r.events.push_back("b" + std::to_string(b)); });
  c.backward();
  l.flush();
  l.end_step();
  r.events.clear();
  c.backward();
  r.events.push_back("end");
  l.flush();
  EXPECT_EQ(r.events, (std::vector<std::string>{"b0", "b1", "b2", "end"}));
}

TEST(BucketLauncher, UnhookedQueuesAndOverlapOffLaunchOnlyAtFlushAfterTheHookedOnes) {
  Chain c;
  Recorder r;
  hp::BucketLauncher l(c.params, {{3, 2}, {1, 0}}, {{0}, {1}}, {true, false}, true, 0,
                       [&](std::size_t b) { r.events.push_back("b" + std::to_string(b)); });
  for (int step = 0; step < 2; ++step) {
    r.events.clear();
    c.backward();
    r.events.push_back("end");
    l.flush();
    l.end_step();
  }
  EXPECT_EQ(r.events, (std::vector<std::string>{"b0", "end", "b1"}));
  EXPECT_EQ(l.early(), 1u);

  Chain c2;
  Recorder r2;
  hp::BucketLauncher off(c2.params, {{3, 2}, {1, 0}}, {{0, 1}}, {true}, false, 0,
                         [&](std::size_t b) { r2.events.push_back("b" + std::to_string(b)); });
  for (int step = 0; step < 2; ++step) {
    r2.events.clear();
    c2.backward();
    r2.events.push_back("end");
    off.flush();
    off.end_step();
  }
  EXPECT_EQ(r2.events, (std::vector<std::string>{"end", "b0", "b1"}));
  EXPECT_EQ(off.early(), 0u);
}

// Rounds (zero's reduce_per_micro_batch): with learn_rounds() and two
// micro-batches a step, every bucket is launched once per micro-batch, from
// inside that micro-batch's backward, in queue order (in the first step on
// guess_first_step's counts, later on the learned ones); a queue whose
// counts have no common divisor (a parameter reached three times, the
// others twice) launches once.
TEST(BucketLauncher, RoundsLaunchEveryBucketOncePerMicroBatchFromItsBackward) {
  Chain c;
  Recorder r;
  hp::BucketLauncher l(c.params, {{3, 2}, {1}, {0}}, {{0, 1, 2}}, {true}, true, 0,
                       [&](std::size_t b) { r.events.push_back("b" + std::to_string(b)); });
  l.learn_rounds();
  for (int step = 0; step < 3; ++step) {
    r.events.clear();
    l.guess_first_step(2);  // only the first step goes by it
    c.backward();
    r.events.push_back("mb");
    c.backward();
    r.events.push_back("end");
    l.flush();
    l.end_step();
    EXPECT_EQ(r.events, (std::vector<std::string>{"b0", "b1", "b2", "mb", "b0", "b1", "b2", "end"})) << step;
    EXPECT_EQ(l.early(), 6u);
  }
  EXPECT_EQ(l.rounds(0), 2);

  Chain odd;
  Recorder r2;
  hp::BucketLauncher once(odd.params, {{3, 2}, {1}, {0}}, {{0, 1, 2}}, {true}, true, 0,
                          [&](std::size_t b) { r2.events.push_back("b" + std::to_string(b)); });
  once.learn_rounds();
  for (int step = 0; step < 2; ++step) {
    r2.events.clear();
    once.guess_first_step(2);
    // Two micro-batches, and w0 used once more (counts 3, 2, 2, 2): their
    // greatest common divisor is 1, so the queue launches once.
    for (int mb = 0; mb < 2; ++mb) odd.backward();
    (odd.params[0].tensor * 2.0).sum().backward();
    r2.events.push_back("end");
    once.flush();
    once.end_step();
    if (step == 0) {
      // w0's third gradient came after its bucket's last round on the
      // guess: the flush sends that bucket once more.
      EXPECT_EQ(r2.events, (std::vector<std::string>{"b0", "b1", "b2", "b0", "b1", "b2", "end", "b2"}));
    }
  }
  EXPECT_EQ(r2.events, (std::vector<std::string>{"b0", "b1", "b2", "end"}));
  EXPECT_EQ(once.rounds(0), 1);

  // Without rounds the guess launches each bucket once, at its last
  // micro-batch's gradient, in the first step already.
  Chain plain;
  Recorder r3;
  hp::BucketLauncher one(plain.params, {{3, 2}, {1}, {0}}, {{0, 1, 2}}, {true}, true, 0,
                         [&](std::size_t b) { r3.events.push_back("b" + std::to_string(b)); });
  one.guess_first_step(2);
  plain.backward();
  r3.events.push_back("mb");
  plain.backward();
  r3.events.push_back("end");
  one.flush();
  EXPECT_EQ(r3.events, (std::vector<std::string>{"mb", "b0", "b1", "b2", "end"}));
}

TEST(BucketLauncher, AGradientAfterItsBucketWasLaunchedIsRefusedNamingTheParameter) {
  Chain c;
  hp::BucketLauncher l(c.params, {{3, 2, 1, 0}}, {{0}}, {true}, true, 3, [](std::size_t) {});
  c.backward();  // the first step: one gradient each
  l.flush();
  l.end_step();
  c.backward();  // launched from the hooks
  try {
    c.backward();  // one more than learned
    FAIL() << "expected the late gradient to be refused";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 3: gradient reduction overlap: w"), std::string::npos) << m;
    EXPECT_NE(m.find("set distributed.overlap: false"), std::string::npos) << m;
  }
}

// The bucketing rule (DDP's): a bucket closes once it holds at least its
// limit; the first bucket's limit is min(1 MiB, cap), the rest the cap;
// every index once, in order; a tensor above the cap closes its bucket.
TEST(CutBuckets, ABucketClosesOnceItReachesItsLimitAndTheFirstAtOneMebibyte) {
  const double mib = 1024.0 * 1024.0;
  using Runs = std::vector<std::vector<std::size_t>>;
  // cap 4 MiB: the first bucket closes at 1 MiB (0.6 + 0.6), the next ones
  // at 4 MiB or more (3 + 2; 9 alone), the rest is the last.
  EXPECT_EQ(hp::cut_buckets({0.6 * mib, 0.6 * mib, 3 * mib, 2 * mib, 9 * mib, 1 * mib, 0.5 * mib}, 4 * mib),
            (Runs{{0, 1}, {2, 3}, {4}, {5, 6}}));
  // A cap below 1 MiB is every bucket's limit, the first's too.
  EXPECT_EQ(hp::cut_buckets({100, 100, 100, 100, 100}, 250), (Runs{{0, 1, 2}, {3, 4}}));
  EXPECT_EQ(hp::cut_buckets({300, 10, 300}, 250), (Runs{{0}, {1, 2}}));
  EXPECT_TRUE(hp::cut_buckets({}, 250).empty());
  // The shipped 4 x 256 GPT's gradients (13 MB) at the default cap of 4 MiB
  // make several buckets, the first of them small.
  std::vector<double> gpt(100, 0.13 * mib);
  const auto runs = hp::cut_buckets(gpt, 4 * mib);
  ASSERT_GE(runs.size(), 4u);
  EXPECT_EQ(runs[0].size(), 8u) << "8 x 0.13 MiB is the first >= 1 MiB";
  std::size_t next = 0;
  for (const auto& r : runs) {
    for (auto i : r) EXPECT_EQ(i, next++);
  }
  EXPECT_EQ(next, gpt.size());
}
