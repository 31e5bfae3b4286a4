#include "backends/comm/rank_files.h"

#include <cctype>
#include <cstdio>

namespace hp::dist {

namespace {
constexpr std::string_view kRank = "rank";
constexpr std::size_t kDigits = 5;
}  // namespace

std::string rank_file_name(std::string_view stem, int rank, std::string_view ext) {
  char digits[16];
  std::snprintf(digits, sizeof digits, "%05d", rank);
  std::string out;
  out.reserve(stem.size() + kRank.size() + kDigits + ext.size());
  out.append(stem).append(kRank).append(digits).append(ext);
  return out;
}

int rank_of_file_name(std::string_view name, std::string_view stem, std::string_view ext) {
  const std::size_t head = stem.size() + kRank.size();
  if (name.size() < head + kDigits + ext.size() || name.substr(0, stem.size()) != stem ||
      name.substr(stem.size(), kRank.size()) != kRank || name.substr(name.size() - ext.size()) != ext) {
    return -1;
  }
  const std::string_view digits = name.substr(head, name.size() - head - ext.size());
  if (digits.size() < kDigits || digits.size() > 9) return -1;
  int rank = 0;
  for (char ch : digits) {
    if (!std::isdigit(static_cast<unsigned char>(ch))) return -1;
    rank = rank * 10 + (ch - '0');
  }
  return rank;
}

}  // namespace hp::dist
