#pragma once
// Everything for reporting metrics: the registry and its metric types, the
// Prometheus text format, the HTTP endpoint and the JSON-lines file.
#include "framework/metrics/exposition.h"
#include "framework/metrics/http_exposer.h"
#include "framework/metrics/jsonl_writer.h"
#include "hp/metrics/metric_types.h"
#include "framework/metrics/naming.h"
#include "hp/metrics/registry.h"
