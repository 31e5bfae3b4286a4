#pragma once
// Include in the one .cpp of a plugin that uses HP_FEATURE_PLUGIN.
#include <boost/dll/alias.hpp>

#include "hp/plugin/api_hash.h"
#include "hp/plugin/feature.h"
