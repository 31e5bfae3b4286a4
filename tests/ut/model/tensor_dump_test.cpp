// Tensor dumps (framework/model/tensor_dump.h): what a training forward
// records, under which key, and what it leaves out (evaluation, a forward
// replayed by recompute, steps that asked for nothing, what was not asked).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hp/model/aux_loss.h"
#include "hp/model/dropout.h"
#include "framework/model/tensor_dump.h"

namespace td = hp::tensor_dump;

TEST(TensorDump, RecordsTrainingForwardsByLayerWhatAndFirstSample) {
  td::begin_step(td::kRouting);
  torch::Tensor t = torch::arange(6, torch::kFloat);
  {
    hp::DropoutSiteGuard site({3, 4});
    EXPECT_FALSE(td::recording(td::kRouting)) << "evaluation (no auxiliary-loss scope) records";
    hp::AuxLossScope training;
    EXPECT_TRUE(td::recording(td::kRouting));
    EXPECT_FALSE(td::recording(td::kActivations)) << "activations were not asked for";
    td::record("blocks.0.moe", "probs", t);
    td::record("blocks.0.moe", "probs", t * 2);  // the same key again
    {
      hp::AuxLossScope replay(/*replay=*/true);
      EXPECT_FALSE(td::recording(td::kRouting)) << "a recompute replay records";
    }
  }
  t.add_(1);  // a record is a copy, not a view of the layer's tensor
  const auto records = td::end_step();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].first, "blocks.0.moe:probs@s4");
  EXPECT_EQ(records[1].first, "blocks.0.moe:probs@s4#2");
  EXPECT_TRUE(torch::equal(records[0].second, torch::arange(6, torch::kFloat)));
  EXPECT_TRUE(torch::equal(records[1].second, torch::arange(6, torch::kFloat) * 2));
  hp::AuxLossScope training;
  EXPECT_FALSE(td::recording(td::kRouting)) << "recording after the step's collection closed";
  td::begin_step(td::kActivations);
  EXPECT_TRUE(td::recording(td::kRouting)) << "activation dumps hold the routing too";
  EXPECT_TRUE(td::end_step().empty());
}
