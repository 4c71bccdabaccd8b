#!/usr/bin/env bash
# Installs every build and test dependency of ckptd from Debian 12's archive.
# Idempotent: packages already present are skipped, so a second run costs one dpkg query.
#   scripts/install-deps.sh            what building and testing need
#   scripts/install-deps.sh --peers    also the peer scripts/bench.sh --peers runs
#                                      beside PyTorch (parallel HDF5: bench only)
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libopenmpi-dev openmpi-bin
  libspdlog-dev libfmt-dev
  libleveldb-dev libsnappy-dev
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  libssl-dev openssl util-linux iproute2 clang clang-format libclang-rt-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-numpy python3-grpcio python3-protobuf python3-mpi4py python3-pytest fio
  python3-pip python3-venv python3-setuptools python3-wheel python3-mypy jq
  libcpp-httplib-dev prometheus liburing-dev libisal-dev
  python3-torch
)
if [ "${1:-}" = --peers ]; then PACKAGES+=(python3-h5py-mpi); fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
