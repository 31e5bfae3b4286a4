#!/usr/bin/env bash
# The example application builds against the INSTALLED package
# (find_package(HyperParallel)) and trains its own model.
source "$(dirname "$0")/../lib/common.sh"
BUILD=$1
SRC=$2
cmake --install "$BUILD" --prefix "$WORK/prefix" > "$WORK/install.log" 2>&1 || { cat "$WORK/install.log"; fail "install"; }
[[ -f "$WORK/prefix/lib/hyperparallel/plugins/libhp_feature_recompute.so" ]] || fail "plugin not installed"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The example's source beside the prefix, and ccache told paths under $WORK
# are relative: the headers' and source's paths (a new temporary directory
# each run) then hash the same, and an unchanged example compiles from the
# cache (20 s a run otherwise); any change to a header still compiles.
cp -r "$SRC/examples/custom_model" "$WORK/src"
export CCACHE_BASEDIR="$WORK"
cmake -S "$WORK/src" -B "$WORK/ex" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$WORK/prefix" "${launcher[@]}" > "$WORK/cfg.log" 2>&1 || { cat "$WORK/cfg.log"; fail "configure against the installed package"; }
cmake --build "$WORK/ex" > "$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; fail "build"; }
# Nothing from the build tree: the plugin must come from the install prefix.
env -u HP_PLUGIN_PATH "$WORK/ex/custom_model" "$WORK/run" > "$WORK/run.log" 2>&1 || { cat "$WORK/run.log"; fail "run"; }
cat "$WORK/run.log" | tail -3
grep -q "custom_model: loss" "$WORK/run.log" || fail "no result line"
echo PASS
