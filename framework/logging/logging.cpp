#include "hp/logging/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

namespace hp::log {

namespace {
std::mutex g_mutex;
std::shared_ptr<spdlog::logger> g_logger;

std::shared_ptr<spdlog::logger> make(int rank, const std::string& tag, const std::string& level,
                                     const std::string& file) {
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (!file.empty()) {
    sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(
        file + ".rank" + std::to_string(rank), /*truncate=*/false));
  }
  auto lg = std::make_shared<spdlog::logger>("hp", sinks.begin(), sinks.end());
  std::string label = "rank " + std::to_string(rank) + (tag.empty() ? "" : " " + tag);
  lg->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [" + label + "] [%^%l%$] %v");
  std::string lvl = level;
  if (const char* env = std::getenv("HP_LOG_LEVEL")) lvl = env;
  lg->set_level(spdlog::level::from_str(lvl.empty() ? "info" : lvl));
  lg->flush_on(spdlog::level::warn);
  return lg;
}
}  // namespace

void init(int rank, const std::string& mesh_tag, const std::string& level,
          const std::string& file) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_logger = make(rank, mesh_tag, level, file);
  spdlog::drop("hp");
  spdlog::register_logger(g_logger);
}

std::shared_ptr<spdlog::logger> logger() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_logger) {
    g_logger = make(0, "", "info", "");
  }
  return g_logger;
}

}  // namespace hp::log
