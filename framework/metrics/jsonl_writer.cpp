#include "framework/metrics/jsonl_writer.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>

namespace hp::metrics {
namespace {

constexpr const char* kStepKey = "step";
constexpr const char* kTimeKey = "time";

double unix_seconds() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::chrono::duration<double>(now).count();
}

}  // namespace

JsonlWriter::JsonlWriter(const std::string& path) : path_(path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code error;
    std::filesystem::create_directories(parent, error);
    if (error) {
      throw std::runtime_error("cannot create the directory " + parent.string() +
                               " for the metrics file " + path + ": " + error.message());
    }
  }
  file_ = std::fopen(path.c_str(), "a");
  if (file_ == nullptr) {
    throw std::runtime_error("cannot open the metrics file " + path +
                             " for appending: " + std::strerror(errno));
  }
}

JsonlWriter::~JsonlWriter() { std::fclose(file_); }

void JsonlWriter::write(const std::map<std::string, double>& fields, std::int64_t step,
                        const std::map<std::string, std::string>& texts) {
  nlohmann::ordered_json line;
  line[kStepKey] = step;
  std::map<std::string, nlohmann::ordered_json> all;
  for (const auto& [key, value] : fields) all[key] = value;
  for (const auto& [key, value] : texts) all[key] = value;  // a string field (a sample's text)
  for (const auto& [key, value] : all) {
    if (key == kStepKey || key == kTimeKey) {
      throw std::invalid_argument("metrics field '" + key + "' for " + path_ +
                                  " is reserved: every line carries its own '" + std::string(key) +
                                  "'; rename the field");
    }
    line[key] = value;
  }
  line[kTimeKey] = unix_seconds();
  // Invalid UTF-8 in a key is replaced rather than thrown: losing a plot
  // line is worse than one odd character.
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';

  std::lock_guard<std::mutex> lock(mutex_);
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0) {
    throw std::runtime_error("cannot write to the metrics file " + path_ + ": " +
                             std::strerror(errno));
  }
}

}  // namespace hp::metrics
