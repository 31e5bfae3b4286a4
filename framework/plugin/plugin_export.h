#pragma once
// Include in the one .cpp of a plugin that uses HP_FEATURE_PLUGIN.
#include <boost/dll/alias.hpp>

#include "framework/plugin/api_hash.h"
#include "framework/plugin/feature.h"
