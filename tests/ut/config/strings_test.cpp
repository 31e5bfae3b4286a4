#include <gtest/gtest.h>

#include "framework/util/strings.h"

TEST(Strings, EditDistance) {
  EXPECT_EQ(hp::edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(hp::edit_distance("", "abc"), 3u);
  EXPECT_EQ(hp::edit_distance("same", "same"), 0u);
}

TEST(Strings, DidYouMeanPicksClosePlausibleWord) {
  std::vector<std::string> c{"training", "optimizer", "model"};
  EXPECT_EQ(hp::did_you_mean("traning", c), "training");
  EXPECT_EQ(hp::did_you_mean("optimiser", c), "optimizer");
  EXPECT_EQ(hp::did_you_mean("zzzzzzzz", c), "");
}
