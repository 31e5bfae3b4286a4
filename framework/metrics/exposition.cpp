#include "framework/metrics/exposition.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <sstream>
#include <vector>

#include "hp/metrics/registry.h"

namespace hp::metrics {

std::string to_prometheus_text(const Registry& registry) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry.collect());
  return out.str();
}

}  // namespace hp::metrics
