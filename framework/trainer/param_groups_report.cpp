#include "framework/trainer/param_groups_report.h"

#include <ATen/ATen.h>

#include <cctype>
#include <map>
#include <sstream>

#include "hp/comm/context.h"
#include "hp/config/config.h"
#include "hp/model/layers.h"
#include "hp/model/model.h"
#include "hp/optim/optimizer.h"
#include "framework/model/registry.h"

namespace hp {

namespace {
/// "blocks.12.attn.q.weight" -> "blocks.*.attn.q.weight": indices folded.
std::string fold_indices(const std::string& name) {
  std::string out;
  for (std::size_t i = 0; i < name.size();) {
    const bool starts = (i == 0 || name[i - 1] == '.') && std::isdigit(static_cast<unsigned char>(name[i]));
    if (!starts) {
      out += name[i++];
      continue;
    }
    std::size_t j = i;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (j == name.size() || name[j] == '.') {
      out += '*';
      i = j;
    } else {
      out += name[i++];
    }
  }
  return out;
}
}  // namespace

std::string describe_optimizer_groups(const Config& config) {
  // The whole model on one rank, dense layers, meta tensors: global names
  // and shapes are the same at every layout.
  auto single = dist::DistributedContext::single();
  const LayerRegistry layers = LayerRegistry::dense();
  BuildContext ctx(config, *single, layers, 0);
  ctx.set_meta(true);
  const BuiltModel model = build_model(describe_model(config), ctx);
  const GroupPolicy policy = GroupPolicy::from(config);
  const auto table = resolve_param_groups(policy, model.params);

  struct Group {
    int tensors = 0;
    double values = 0;
    std::map<std::string, int> names;  ///< folded name -> count
  };
  std::map<std::string, Group> groups;
  for (const auto& p : model.params) {
    const ParamHyper& h = table.at(p.spec.name);
    std::ostringstream key;
    key << h.group << " (weight_decay " << h.weight_decay << ", lr x" << h.lr_scale << ")";
    Group& g = groups[key.str()];
    ++g.tensors;
    double n = 1;
    for (auto d : p.spec.global_shape) n *= static_cast<double>(d);
    g.values += n;
    ++g.names[fold_indices(p.spec.name)];
  }
  std::ostringstream out;
  out << "optimizer groups (" << policy.describe() << "):\n";
  for (const auto& [name, g] : groups) {
    out << "  " << name << ": " << g.tensors << " tensors, " << static_cast<long long>(g.values) << " values:";
    for (const auto& [n, count] : g.names) out << " " << n << (count > 1 ? " x" + std::to_string(count) : "");
    out << "\n";
  }
  return out.str();
}

}  // namespace hp
