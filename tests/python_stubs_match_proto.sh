#!/bin/bash
# The Python stubs shipped in client/python/ckptd/v1 must be what the proto generates
# now: regenerates them into a temp directory and compares. On a mismatch, run
# scripts/gen-python-stubs.sh and commit the result.
set -euo pipefail
src="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
bash "$src/scripts/gen-python-stubs.sh" "$tmp"
if ! diff -r -x __pycache__ "$tmp/ckptd/v1" "$src/client/python/ckptd/v1"; then
  echo "client/python/ckptd/v1 is stale: run scripts/gen-python-stubs.sh" >&2
  exit 1
fi
echo "python stubs match proto/ckptd/v1/ckptd.proto"
