#pragma once
// hp-train --dry-run's optimizer-group table: the model's parameters as its
// description builds them (on the meta device: names and shapes, no
// tensors), each in the group the config's rules put it in, with counts.
#include <string>

namespace hp {

class Config;

/// The table for a resolved config: one line per group (tensors, values,
/// the parameter names with block indices folded: blocks.*.ln1.weight x4).
std::string describe_optimizer_groups(const Config& config);

}  // namespace hp
