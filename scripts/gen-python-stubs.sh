#!/bin/bash
# Regenerates the Python stubs shipped in client/python/ckptd/v1 from
# proto/ckptd/v1/ckptd.proto with Debian's protoc and grpc_python_plugin, so that the
# package installs and imports without a C++ build tree. Run it after changing the
# proto; the test python_stubs_match_proto fails until you do.
#   scripts/gen-python-stubs.sh [OUT_DIR]   (default: client/python)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-client/python}"
plugin="$(command -v grpc_python_plugin)" || { echo "grpc_python_plugin not found (apt-get install protobuf-compiler-grpc)" >&2; exit 2; }
mkdir -p "$out/ckptd/v1"
protoc -I proto --python_out="$out" --pyi_out="$out" --grpc_out="$out" --plugin=protoc-gen-grpc="$plugin" \
  proto/ckptd/v1/ckptd.proto
printf '"""Generated gRPC and protobuf stubs of ckptd/v1/ckptd.proto (scripts/gen-python-stubs.sh)."""\n' \
  > "$out/ckptd/v1/__init__.py"
