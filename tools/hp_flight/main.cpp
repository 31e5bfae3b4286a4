// hp-flight: compares the flight records the ranks of a failed or stalled
// run wrote (<run.output_dir>/flight/rank<RRRRR>.json): why each rank wrote
// its record, and per group who entered and completed which operation,
// who is behind and which calls do not match. Exit 0 after printing, 2 on
// bad input.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "backends/comm/flight_analysis.h"

namespace fs = std::filesystem;
namespace flight = hp::dist::flight;

int main(int argc, char** argv) {
  CLI::App app{"hp-flight: compare the flight records of a run's ranks"};
  std::string dir;
  int last = 8;
  app.add_option("dir", dir, "The run's flight directory (<run.output_dir>/flight)")->required();
  app.add_option("--last", last, "Operations of each rank's ring to list (0: none)");
  CLI11_PARSE(app, argc, argv);
  std::map<int, flight::Heartbeat> beats;
  std::map<int, nlohmann::json> records;
  double newest = 0, heartbeat_seconds = 1.0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind("rank", 0) != 0 || e.path().extension() != ".json") continue;
    try {
      std::ifstream in(e.path());
      auto j = nlohmann::json::parse(in);
      const int rank = j.at("rank").get<int>();
      beats[rank] = flight::heartbeat_from_json(j.at("heartbeat").dump());
      newest = std::max(newest, j.value("written", 0.0));
      heartbeat_seconds = j.value("heartbeat_seconds", heartbeat_seconds);
      records[rank] = std::move(j);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "hp-flight: %s is not a flight record: %s\n", e.path().c_str(), ex.what());
      return 2;
    }
  }
  if (ec || records.empty()) {
    std::fprintf(stderr, "hp-flight: no flight records (rank<RRRRR>.json) in %s\n", dir.c_str());
    return 2;
  }
  std::printf("%zu flight records in %s\n", records.size(), dir.c_str());
  for (const auto& [rank, j] : records) {
    std::printf("rank %d: %s; %s\n", rank, j.value("reason", std::string("?")).c_str(),
                flight::describe(beats.at(rank).action).c_str());
  }
  for (const auto& line : flight::compare_records(beats, newest, heartbeat_seconds)) std::printf("%s\n", line.c_str());
  if (last > 0) {
    for (const auto& [rank, j] : records) {
      const auto& entries = j.at("entries");
      const std::size_t n = entries.size(), from = n > static_cast<std::size_t>(last) ? n - last : 0;
      std::printf("rank %d, last %zu of %llu operations:\n", rank, n - from,
                  static_cast<unsigned long long>(j.value("recorded", std::uint64_t{0})));
      for (std::size_t i = from; i < n; ++i) {
        const flight::Entry e = flight::entry_from_json(entries[i].dump());
        const double secs = (e.end > 0 ? e.end : newest) - e.start;
        std::printf("  %-6s %-14s #%-6llu %10llu bytes  %-7s %.3f s  %s\n", e.group.c_str(), e.op.c_str(),
                    static_cast<unsigned long long>(e.seq), static_cast<unsigned long long>(e.bytes),
                    flight::to_string(e.state), secs, flight::describe(e.action).c_str());
      }
    }
  }
  return 0;
}
