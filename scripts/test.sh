#!/usr/bin/env bash
# Installs missing dependencies, builds, and runs the whole test suite with ctest:
# unit tests, and integration tests that start real daemons under mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# Open MPI refuses root without these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
