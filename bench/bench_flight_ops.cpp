// The flight recorder's own cost per recorded operation: issue + finish of
// one collective, one thread and four threads at once (the heartbeat and
// training threads share one lock). Prints nanoseconds per operation.
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "hp/comm/flight_recorder.h"

namespace flight = hp::dist::flight;

int main() {
  constexpr int kOps = 1000000;
  flight::Recorder r(0, 4096);
  r.add_group("dp", {0, 1});
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kOps; ++i) r.finish(r.issue("dp", "all_reduce", flight::Kind::kCollective, -1, 4096), true);
  const double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kOps * 1e9;
  std::vector<std::thread> ts;
  t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&r] {
      for (int i = 0; i < kOps / 4; ++i) r.finish(r.issue("dp", "all_reduce", flight::Kind::kCollective, -1, 8), true);
    });
  }
  for (auto& t : ts) t.join();
  const double four = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kOps * 1e9;
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) (void)flight::to_json(r.heartbeat());
  const double beat = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1000 * 1e6;
  std::printf("recorder: %.0f ns per recorded operation (1 thread), %.0f ns (4 threads contending); "
              "a heartbeat's JSON %.1f us\n", one, four, beat);
  return 0;
}
