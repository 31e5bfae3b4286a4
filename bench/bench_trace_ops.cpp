// The profiler's cost per span, printed for bench_observability.sh: a span
// (with two arguments, as a collective's) while recording is off and on.
#include <chrono>
#include <cstdio>
#include <string>

#include "hp/profile/trace.h"

namespace {

double ns_per_span(bool on, int n) {
  hp::profile::set_recording(on);
  const std::string group = "dp";
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    hp::profile::Span s("comm", "all_reduce");
    s.arg("group", group).arg("bytes", i);
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
  hp::profile::set_recording(false);
  hp::profile::take_events();
  return ns;
}

}  // namespace

int main() {
  ns_per_span(true, 10000);  // warm-up: allocator, thread id
  const double off = ns_per_span(false, 10000000);
  const double on = ns_per_span(true, 200000);
  std::printf("%.2f ns per span with profile off, %.0f ns per span with profile on\n", off, on);
  return 0;
}
