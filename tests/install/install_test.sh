#!/bin/bash
# cmake --install of a build into a temp prefix, then what a user does with it: run the
# installed ckptd and ckptctl, build a project outside the tree against
# find_package(ckptd), run it against an installed daemon, and check the example
# systemd unit points at this install (systemd-analyze verify when present).
#   install_test.sh SOURCE_DIR BUILD_DIR MPIEXEC [SANITIZERS]
# SANITIZERS: the build's CKPTD_SANITIZE; the consumer is built with them too, as a
# user linking an instrumented library would.
set -euo pipefail
src="$1"
build="$2"
mpiexec="$3"
sanitize="${4:-}"
flags=()
if [ -n "$sanitize" ]; then
  flags=(-DCMAKE_CXX_FLAGS="-fsanitize=$sanitize" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$sanitize")
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"  # Open MPI's plugins leak
fi
tmp="$(mktemp -d)"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ]; then kill -TERM "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" > "$tmp/install.log"
for f in bin/ckptd bin/ckptctl include/ckptd/client.h include/ckptd/v1/ckptd.grpc.pb.h \
         lib/cmake/ckptd/ckptdConfig.cmake share/ckptd/ckptd.yaml lib/systemd/system/ckptd.service; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f" >&2; exit 1; }
done
"$prefix/bin/ckptd" --version
"$prefix/bin/ckptctl" --version

cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release "${flags[@]}" > "$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer" -j2 > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }

# The installed daemon, one rank, and the consumer against it.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$mpiexec" -np 1 "$prefix/bin/ckptd" --root "$tmp/root" --socket "$tmp/sock/ckptd-{rank}.sock" \
  > "$tmp/daemon.log" 2>&1 &
daemon_pid=$!
"$tmp/consumer/consumer" "$tmp/sock/ckptd-0.sock" || { cat "$tmp/daemon.log"; exit 1; }
"$prefix/bin/ckptctl" verify "$tmp/root/consumer" -q

unit="$prefix/lib/systemd/system/ckptd.service"
exec_start="$(sed -n 's/^ExecStart=//p' "$unit")"
binary="$(echo "$exec_start" | awk '{print $4}')"
[ "$binary" = "$prefix/bin/ckptd" ] || { echo "unit runs '$binary', not $prefix/bin/ckptd" >&2; exit 1; }
if command -v systemd-analyze > /dev/null; then
  systemd-analyze verify "$unit"
fi
echo "install test: installed tree, find_package(ckptd) consumer and systemd unit all good"
