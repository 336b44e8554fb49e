#!/usr/bin/env bash
# Installs the build dependencies of gpt2-attention on Debian/Ubuntu (apt). Does nothing, and
# does not touch apt, when they are all installed already.
set -euo pipefail

# python3-numpy: test_npy exchanges .npy files with numpy itself (that test is skipped without it).
# libstb-dev: stb_image_write, the PNG writer of `gpt2-attention ... --png` (and stb_image, which
# its tests decode the pictures with).
# clang, libclang-rt-14-dev, libomp-dev: the fuzz targets and the asan stage are built with clang
# (Debian bookworm's clang is 14; its sanitizer and libFuzzer runtimes are in libclang-rt-14-dev,
# which clang only recommends, and its OpenMP runtime in libomp-dev). ThreadSanitizer's runtime
# comes with g++ (libtsan2).
# pkgconf: pkg-config, for the test of the installed gpt2-attention.pc (package_pkg_config).
# libopenmpi-dev, openmpi-bin: the tensor-parallel component (gpt2::mpi) and mpiexec, which runs
# its tests on 2 and 3 ranks.
packages=(libeigen3-dev nlohmann-json3-dev libgtest-dev libbenchmark-dev cmake g++ ninja-build
          python3-numpy libstb-dev clang libclang-rt-14-dev libomp-dev pkgconf libopenmpi-dev
          openmpi-bin)

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all dependencies installed"
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "install-deps: missing ${missing[*]}; run as root or install sudo" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
