#!/bin/bash
# The API compatibility rule, kept: a Python client generated from the ckptd.v1 proto
# as it stood when the rule was written (tests/compat/golden/) saves, waits, lists and
# restores against the daemon built now. A change to the proto that breaks an older
# client (a field renumbered, a message's meaning changed) fails here.
#   golden_client_test.sh SOURCE_DIR CKPTD_BINARY MPIEXEC PYTHON
set -euo pipefail
src="$1" ckptd="$2" mpiexec="$3" python="$4"
tmp="$(mktemp -d)"
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/stubs"
protoc -I "$src/tests/compat/golden" --python_out="$tmp/stubs" --grpc_out="$tmp/stubs" \
  --plugin=protoc-gen-grpc="$(command -v grpc_python_plugin)" "$src/tests/compat/golden/ckptd/v1/ckptd.proto"
touch "$tmp/stubs/ckptd/__init__.py" "$tmp/stubs/ckptd/v1/__init__.py"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$mpiexec" --allow-run-as-root --oversubscribe -np 1 \
  "$ckptd" --root "$tmp/root" --socket "$tmp/sock/ckptd.sock" > "$tmp/daemon.log" 2>&1 &
pid=$!
# The daemon is ready once its socket accepts; the client's own deadlines bound the rest.
"$python" - "$tmp/sock/ckptd.sock" <<'PY'
import sys, grpc
grpc.channel_ready_future(grpc.insecure_channel("unix:" + sys.argv[1])).result(timeout=60)
PY
if ! "$python" "$src/tests/compat/golden_client.py" "$tmp/sock/ckptd.sock" "$tmp/stubs"; then
  cat "$tmp/daemon.log" >&2
  exit 1
fi
