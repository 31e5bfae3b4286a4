#pragma once
// The one spelling of a file (or directory) that belongs to one rank:
// "<stem>rank<5 digits><ext>", e.g. "model-rank00003.safetensors",
// "trace/rank00003.json", "rank00003.json". Checkpoints, gradient and tensor
// dumps, traces, flight records and hp-ckpt's exported layout all name their
// per-rank files with it, so a listing sorts by rank and a tool reads the
// rank back from any of them the same way.
#include <string>
#include <string_view>

namespace hp::dist {

/// "<stem>rank00003<ext>".
std::string rank_file_name(std::string_view stem, int rank, std::string_view ext);

/// The rank of a name rank_file_name(stem, r, ext) spelled; -1 for any
/// other name.
int rank_of_file_name(std::string_view name, std::string_view stem, std::string_view ext);

}  // namespace hp::dist
