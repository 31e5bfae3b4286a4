#include <gtest/gtest.h>

#include "hp/config/schema.h"

TEST(Schema, LegalTextNamesTheRange) {
  hp::Schema s;
  auto& a = s.add_int("a.b", 3).range(1, 8);
  EXPECT_EQ(a.legal(), "an integer in [1, 8]");
  auto& e = s.add_enum("a.c", "x", {"x", "y"});
  EXPECT_EQ(e.legal(), "one of: x, y");
  auto& f = s.add_float("a.d", 0.5).at_least(0).note("0 turns it off");
  EXPECT_EQ(f.legal(), "a number >= 0; 0 turns it off");
}

TEST(Schema, DuplicateDeclarationIsOurBug) {
  hp::Schema s;
  s.add_int("x.y", 1);
  try {
    s.add_int("x.y", 2);
    FAIL() << "expected a throw";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("internal error: option 'x.y' declared twice"),
              std::string::npos);
  }
}

TEST(Schema, MarkdownTableHasEveryColumnAndOption) {
  hp::Schema s;
  hp::declare_core_options(s);
  std::string md = s.to_markdown("training.");
  EXPECT_NE(md.find("| key | type | default | required | meaning | legal range | error behaviour |"),
            std::string::npos);
  EXPECT_NE(md.find("| `training.micro_batch_size` | int | `4` | no |"), std::string::npos);
  EXPECT_EQ(md.find("optimizer.lr"), std::string::npos);
}
