// Stage messages between two real ranks (Gloo): several tensors of mixed
// dtypes and shapes, headers sent once and again only on a change, and a
// receive that times out names the stage, the micro-batch and what it waited for.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <thread>

#include "hp/comm/group.h"
#include "plugins/pipeline_parallel/stage_link.h"
#include "tests/support/multi_rank.h"

namespace {

using hp::pipeline::Direction;
using hp::pipeline::StageLink;

hp::Activations message(std::int64_t batch) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(batch);
  return hp::make_activations({{"h", torch::randn({batch, 8, 16}, g)},
                               {"skip", torch::randn({batch, 16, 8}, g).to(at::kDouble)},
                               {"mask", torch::randint(0, 5, {batch, 8}, g)}});
}

void expect_equal(const hp::Activations& a, const hp::Activations& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].key(), b[i].key());
    EXPECT_EQ(a[i].value().scalar_type(), b[i].value().scalar_type()) << a[i].key();
    EXPECT_TRUE(torch::equal(a[i].value(), b[i].value())) << a[i].key();
  }
}

}  // namespace

TEST(StageLink, MessagesDescribeThemselvesAndHeadersFollowChanges) {
  hp::test::run_ranks(hp::test::grid(2, 1, 1), [](hp::dist::DistributedContext& d) {
    auto& pp = d.group("pp");
    StageLink link(pp, 2, pp.rank());
    // Micro-batch sizes 2, 2, 2, 3 (a change), 3, then 1 (another change).
    const std::vector<std::int64_t> sizes{2, 2, 2, 3, 3, 1};
    for (int mb = 0; mb < static_cast<int>(sizes.size()); ++mb) {
      if (pp.rank() == 0) {
        link.send(message(sizes[mb]), 1, {Direction::kForward, 0, mb});
        // Gradients come back: one tensor.
        auto g = link.recv(1, {Direction::kBackward, 0, mb});
        EXPECT_TRUE(torch::equal(g["h"], message(sizes[mb])["h"] * 2));
      } else {
        auto got = link.recv(0, {Direction::kForward, 0, mb});
        expect_equal(got, message(sizes[mb]));
        link.send(hp::make_activations({{"h", got["h"] * 2}}), 0, {Direction::kBackward, 0, mb});
      }
      link.reap();
    }
    link.wait_all();
    // Forward: the first message and two changes; backward: the same three.
    EXPECT_EQ(link.headers_sent(), 3);
  });
}

TEST(StageLink, ATimeoutNamesStageMicroBatchAndAction) {
  hp::test::run_ranks(
      hp::test::grid(2, 1, 1),
      [](hp::dist::DistributedContext& d) {
        auto& pp = d.group("pp");
        StageLink link(pp, 2, pp.rank());
        if (pp.rank() == 1) {
          try {
            link.recv(0, {Direction::kForward, 0, 5});  // stage 0 never sends
            ADD_FAILURE() << "the receive returned";
          } catch (const hp::dist::CommError& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find("pipeline stage 1 waiting for the activations of micro-batch 5 from stage 0 "
                             "(forward of chunk 0)"),
                      std::string::npos)
                << m;
            EXPECT_NE(m.find("timeout"), std::string::npos) << m;
          }
        }
        // Rank 0 stays connected (never sending) until rank 1 has timed out.
        if (pp.rank() == 0) std::this_thread::sleep_for(std::chrono::seconds(3));
      },
      std::chrono::seconds(2));
}
