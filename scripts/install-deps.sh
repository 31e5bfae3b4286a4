#!/usr/bin/env bash
# Installs every Debian package hyperparallel needs to build, test and run.
# Idempotent: packages already present are left alone.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libgloo-dev
  libyaml-cpp-dev
  libboost-dev libboost-filesystem-dev
  libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev
  nlohmann-json3-dev
  libcli11-dev
  libxxhash-dev
  libmimalloc-dev
  libsentencepiece-dev libpcre2-dev python3-regex
  prometheus-cpp-dev
  libopenblas0-openmp
  prometheus
  chromium
  fortunes
  curl python3
  procps
  python3-torch openmpi-bin
  munge slurmctld slurmd slurm-client
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all ${#PACKAGES[@]} packages present"
fi

# LibTorch in Debian calls whatever libblas.so.3 the alternatives point at; the
# reference BLAS is ~20x slower. Installing OpenBLAS normally switches it; make
# sure it did.
blas=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || true)
if [[ -n "$blas" && "$blas" != *openblas* ]]; then
  cand=$(update-alternatives --list libblas.so.3-x86_64-linux-gnu 2>/dev/null | grep openblas | head -1 || true)
  if [[ -n "$cand" ]]; then
    ${SUDO:-} update-alternatives --set libblas.so.3-x86_64-linux-gnu "$cand"
  fi
fi
