#pragma once
// Small string helpers shared by config validation and plugin lookup.
#include <string>
#include <vector>

namespace hp {

/// Edit distance (insert, delete, substitute each cost 1).
std::size_t edit_distance(const std::string& a, const std::string& b);

/// The closest candidate to `word`, or "" when nothing is close enough to be a
/// plausible typo (distance > max(2, |word|/3)).
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

/// "a, b, c"
std::string join(const std::vector<std::string>& items, const std::string& sep = ", ");

std::vector<std::string> split(const std::string& s, char sep);

/// Seconds as "HH:MM:SS" (an ETA; negative or not finite: "00:00:00").
std::string format_hms(double seconds);

}  // namespace hp
