#pragma once
// The layouts checkpoints of the shipped features are written under, as
// meshes: tensor parallel (tp, split), pipeline parallel (pp, partition),
// expert parallel (ep, split, carved out of the data-parallel dimension with
// edp the rest), data parallel the remainder. The trainer builds its mesh
// from what the enabled features claim; hp-ckpt and the tests build the same
// mesh from a layout's sizes with the same claims.
#include <map>
#include <string>
#include <vector>

#include "hp/comm/mesh.h"

namespace hp::ckpt_tool {

/// The dimensions a layout is given by: tp, dp, ep, pp.
const std::vector<std::string>& layout_dims();

/// The mesh of a layout given as sizes by dimension (a missing one is 1; a
/// view's dimension not given takes what the others leave). With `like`
/// (the mesh a checkpoint's manifest records) every dimension, view and
/// flat group of that mesh is known, with its role and owner, so a
/// dimension any feature registers re-shards; the shipped features'
/// dimensions are known either way. Throws std::invalid_argument naming an
/// unknown dimension, a size below 1, or sizes that do not fit (an
/// expert-parallel size that does not divide the data-parallel one).
dist::ProcessMesh layout_mesh(const std::map<std::string, int>& sizes, const dist::ProcessMesh* like = nullptr);

/// The sizes of `mesh` along layout_dims() and any other dimension it has
/// (what hp-ckpt's messages print; a view's remainder such as edp follows).
std::map<std::string, int> layout_sizes(const dist::ProcessMesh& mesh);

}  // namespace hp::ckpt_tool
