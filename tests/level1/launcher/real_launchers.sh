# Shared by the tests of hp-train under the launchers people use (Debian's
# torchrun and Open MPI's mpirun: torchrun_*.sh, mpirun.sh), compared with
# hp-launch. Sourced with the build's bin/ as $1.
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/common.sh"
BIN=$1
# Launchers started in the background run under `timeout`, which leads its own
# process group: on any exit the groups of those we started go too.
STARTED=()
trap 'for p in "${STARTED[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done; rm -rf "$WORK"' EXIT

# Debian 12's torchrun (torch 1.13 on Python 3.11) fails before starting any
# worker ("'NoneType' object has no attribute 'get'") unless --redirects and
# --tee are 1 or 2: Python 3.11 no longer lists Std.NONE and Std.ALL when
# torch iterates its IntFlag. 2 and 2 keep stdout as is and copy each
# worker's stderr (the log) to the console, prefixed, and to --log_dir.
TORCHRUN=(torchrun --redirects 2 --tee 2)
command -v torchrun > /dev/null || fail "torchrun is not installed (scripts/install-deps.sh installs python3-torch)"

# A port free on 127.0.0.1 now (tests may run side by side: no fixed ports).
free_port() { free_ports 1; }

# The reference: the same config under hp-launch, 2 workers of 1 intra-op
# thread each (what torchrun gives its workers with OMP_NUM_THREADS=1).
reference_run() {  # CONFIG OUTPUT_DIR [hp-train args...]
  local config=$1 out=$2
  shift 2
  "$BIN/hp-launch" --nproc-per-node 2 --threads-per-worker 1 -- "$BIN/hp-train" "$config" \
    --set run.output_dir="$out" "$@" > "$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; fail "hp-launch reference run"; }
}

# expect_in FILE TEXT WHAT: FILE holds TEXT (a fixed string), else fail naming WHAT.
expect_in() {
  grep -qF -- "$2" "$1" || { tail -40 "$1"; fail "$3: no line with '$2' in $1"; }
}

# The launch and thread lines rank 0 logs, for a person reading the test's output.
show_start_lines() {
  grep -hE "\] launch: |intra-op threads: " "$@" | sed 's/^.*\] \[info\] /  /' | sort -u
}
