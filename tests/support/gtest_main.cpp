// The unit tests' main: GoogleTest's, ending the process without the static
// destructors (tools/exit_now.h): CTest starts one process per suite
// (cmake/GtestSuites.cmake), about a hundred in all.
#include <gtest/gtest.h>

#include "tools/exit_now.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  hp::tools::exit_now(RUN_ALL_TESTS());
}
