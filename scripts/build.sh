#!/usr/bin/env bash
# Installs missing dependencies and builds ckptd into build/. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_TYPE="${CKPTD_BUILD_TYPE:-RelWithDebInfo}"
cmake -S . -B build -DCMAKE_BUILD_TYPE="$BUILD_TYPE" ${CKPTD_CMAKE_ARGS:-} > build.cmake.log 2>&1 \
  || { cat build.cmake.log; exit 1; }
cmake --build build -j "$(nproc)"
