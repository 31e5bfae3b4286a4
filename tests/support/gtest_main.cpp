// The unit tests' main: GoogleTest's, ending the process without the static
// destructors (tools/exit_now.h): each test runs in its own process
// (gtest_discover_tests), several hundred a suite.
#include <gtest/gtest.h>

#include "tools/exit_now.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  hp::tools::exit_now(RUN_ALL_TESTS());
}
