// hp_print_schedule KIND P M V RANK: the compute actions of pipeline rank
// RANK as the pipeline_parallel plugin's schedule makes them ("F0.0 F0.1
// B0.0 ..."), for the level1 profile test to hold a trace against.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "plugins/pipeline_parallel/schedule.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: hp_print_schedule gpipe|1f1b|interleaved_1f1b|zb_h1|zbv P M V RANK\n");
    return 2;
  }
  try {
    using namespace hp::pipeline;
    const auto actions = make_schedule(parse_schedule(argv[1]), std::atoi(argv[2]),
                                       std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
    for (std::size_t i = 0; i < actions.size(); ++i)
      std::printf("%s%s", i ? " " : "", actions[i].str().c_str());
    std::printf("\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp_print_schedule: %s\n", e.what());
    return 2;
  }
  return 0;
}
