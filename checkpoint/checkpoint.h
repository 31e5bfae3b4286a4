#pragma once
// The checkpoint layer: named tensors, whole or sharded, and JSON state in
// safetensors files under a manifest, committed atomically.
#include "checkpoint/error.h"
#include "checkpoint/file_names.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"
