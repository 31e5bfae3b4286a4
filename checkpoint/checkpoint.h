#pragma once
// The checkpoint layer: named tensors, whole or sharded, and JSON state in
// safetensors files under a manifest, committed atomically.
#include "checkpoint/error.h"
#include "hp/checkpoint/file_names.h"
#include "hp/checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "hp/checkpoint/writer.h"
