#pragma once
// Ending a tool's process (or a unit test's) without the static destructors.
// When a main's own objects are gone, what is left at exit is LibTorch's
// static destructors deregistering its operators one by one: about 150 ms
// of every process that loaded it (measured with perf), and the tests start
// such processes by the hundred. Only for after the caller's own objects are
// destroyed (files closed, threads joined): nothing else runs after this.
#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace hp::tools {

[[noreturn]] inline void exit_now(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace hp::tools
