#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU (under 5 minutes on one H200):
#   1. builds with CUDA required (CKPTD_WITH_CUDA=ON) into build-cuda/
#   2. runs the CUDA tests (device memory save/restore, refusals) and the staging and
#      shared-memory tests, with a missing GPU counted as a failure, not a skip
#   3. saves 4 GiB (CKPTD_GPU_CHECK_GIB to change) from device memory through 2
#      daemons and restores it into device memory, printing D2H and H2D GB/s as the
#      daemons measured their copies.
# Exit status: 0 all passed, 1 a test failed, 2 no GPU visible.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
if ! nvidia-smi -L; then
  echo "gpu-check: no NVIDIA GPU visible (nvidia-smi failed)" >&2
  exit 2
fi
bash scripts/install-deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DCKPTD_WITH_CUDA=ON > build-cuda.cmake.log 2>&1 \
  || { cat build-cuda.cmake.log; exit 1; }
cmake --build build-cuda -j "$(nproc)" --target ckptd ckptctl unit_tests integration_tests
echo "gpu-check: built in ${SECONDS}s"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 CKPTD_REQUIRE_GPU=1
build-cuda/tests/unit_tests --gtest_filter='Staging*:DirectWritableFile*' --gtest_brief=1
build-cuda/tests/integration_tests --gtest_filter='DeviceMemory*:SharedMemory*' --gtest_brief=1
GIB="${CKPTD_GPU_CHECK_GIB:-4}"
CKPTD_GPU_CHECK_BYTES=$((GIB << 30)) build-cuda/tests/integration_tests \
  --gtest_filter='DeviceMemoryTest.SavedFromDeviceMemory*' | grep -E "gpu-check:|OK|FAILED|Failure" 
echo "gpu-check: passed in ${SECONDS}s"
