#!/usr/bin/env bash
# Installs missing dependencies, builds, and runs the whole test suite with ctest:
# unit tests, the fault suites, security tests, and integration tests that start real
# daemons under mpirun.
#   scripts/test.sh            # normal build in build/
#   scripts/test.sh --asan     # AddressSanitizer + UBSan build in build-asan/ (the
#                              # suite less the benchmark smoke and packaging checks)
#   scripts/test.sh --tsan     # ThreadSanitizer build in build-tsan/
#   scripts/test.sh --fuzz [SECONDS]  # libFuzzer harnesses (clang) in build-fuzz/, each for SECONDS (default 30)
#   scripts/test.sh --lint     # .clang-format on every tracked source, and clang's
#                              # thread-safety analysis (as errors, each source parsed
#                              # on its own) in build-lint/
# Extra arguments after "--" go to ctest. CKPTD_CMAKE_ARGS adds CMake options to every
# build but the lint one (.ci/run: unity builds).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=normal FUZZ_SECONDS=30
while [ $# -gt 0 ]; do
  case "$1" in
    --asan) MODE=asan; shift ;;
    --tsan) MODE=tsan; shift ;;
    --fuzz) MODE=fuzz; shift; if [[ "${1:-}" =~ ^[0-9]+$ ]]; then FUZZ_SECONDS=$1; shift; fi ;;
    --lint) MODE=lint; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) break ;;
  esac
done

# Twice as many tests as cores: most of a test's time is spent waiting on its daemons
# (process starts, mpirun, commits), so on 2 cores 4 at a time finish the suite in
# about two thirds of the time 2 at a time take.
JOBS=$(( $(nproc) * 2 ))
# Open MPI refuses root without these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
SUPP="$PWD/tests/sanitizers"

case "$MODE" in
  normal)
    bash scripts/build.sh
    ctest --test-dir build --output-on-failure -j "$JOBS" "$@"
    ;;
  asan|tsan)
    bash scripts/install-deps.sh
    if [ "$MODE" = asan ]; then SAN="address,undefined"; else SAN="thread"; fi
    DIR="build-$MODE"
    # -O1, as the sanitizers' own docs advise: reports stay exact, the build is faster.
    cmake -S . -B "$DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTD_SANITIZE="$SAN" ${CKPTD_CMAKE_ARGS:-} \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" > "$DIR.cmake.log" 2>&1 \
      || { cat "$DIR.cmake.log"; exit 1; }
    # Everything, as one goal: CMake's top-level Makefile builds several --target goals
    # one after another (.NOTPARALLEL), leaving a core idle at the end of each, which
    # cost more than the benchmark and demo trainer this builds that no test here runs.
    cmake --build "$DIR" -j "$(nproc)"
    # Leaks and races inside the uninstrumented MPI, gRPC and protobuf libraries are
    # theirs, not ours: suppressed by library, never by our symbols.
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:halt_on_error=1"
    export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    export TSAN_OPTIONS="suppressions=$SUPP/tsan.supp:halt_on_error=1:second_deadlock_stack=1"
    # The SIGKILL loop is about crash consistency, not memory errors: a few rounds suffice.
    export CKPTD_KILL_ITERATIONS="${CKPTD_KILL_ITERATIONS:-5}"
    # Every test that runs our code, less the ones about speed and packaging, which
    # the normal run covers: the benchmark smoke, the install test, pip's install of
    # the Python client, and the checks that compile nothing of ours (the stub diff and
    # the stand-alone scan).
    ctest --test-dir "$DIR" --output-on-failure -j "$JOBS" \
      -E '^(bench_smoke|install_and_find_package|python_packaging\..*|python_stubs_match_proto|repository_stands_alone)$' "$@"
    ;;
  lint)
    bash scripts/install-deps.sh
    files=$(git ls-files '*.cc' '*.h' | wc -l)
    git ls-files -z '*.cc' '*.h' | xargs -0 clang-format --dry-run --Werror
    DIR=build-lint
    CC=clang CXX=clang++ cmake -S . -B "$DIR" -DCMAKE_BUILD_TYPE=Debug -DCKPTD_THREAD_SAFETY=ON \
      -DCKPTD_BUILD_TESTS=OFF -DCKPTD_WITH_CUDA=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > "$DIR.cmake.log" 2>&1 \
      || { cat "$DIR.cmake.log"; exit 1; }
    # The analysis runs while clang parses, so each of our sources is parsed on its own
    # (one that misses an include fails here) with -fsyntax-only: no code, no links.
    # Only the generated proto headers they include are built.
    cmake --build "$DIR" -j "$(nproc)" --target ckptd_proto
    /usr/bin/python3 - "$DIR/compile_commands.json" "$PWD" > "$DIR/syntax-only.cmds" <<'PY'
import json, shlex, sys
for entry in json.load(open(sys.argv[1])):
    if not entry["file"].startswith(sys.argv[2] + "/") or "/proto/" in entry["file"]:
        continue  # generated code is not ours to analyse
    args = shlex.split(entry["command"])
    at = args.index("-o")
    del args[at:at + 2]
    args = [a for a in args if a != "-c"] + ["-fsyntax-only"]
    print(f"cd {shlex.quote(entry['directory'])} && {shlex.join(args)}", end="\0")
PY
    sources=$(tr -cd '\0' < "$DIR/syntax-only.cmds" | wc -c)
    xargs -0 -P "$(nproc)" -n 1 bash -c < "$DIR/syntax-only.cmds"
    echo "lint: $files sources match .clang-format; clang thread-safety analysis passed on $sources translation units"
    ;;
  fuzz)
    bash scripts/install-deps.sh
    DIR=build-fuzz
    CC=clang CXX=clang++ cmake -S . -B "$DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTD_FUZZ=ON ${CKPTD_CMAKE_ARGS:-} \
      -DCKPTD_BUILD_TESTS=OFF -DCKPTD_WITH_CUDA=OFF > "$DIR.cmake.log" 2>&1 || { cat "$DIR.cmake.log"; exit 1; }
    cmake --build "$DIR" -j "$(nproc)" --target fuzzers
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
    for target in fuzz_layout fuzz_index fuzz_save_header; do
      corpus="tests/fuzz/corpus/${target#fuzz_}"
      work="$(mktemp -d)"
      echo "== $target for ${FUZZ_SECONDS}s (seed corpus $corpus)"
      "$DIR/tests/fuzz/$target" -max_total_time="$FUZZ_SECONDS" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
        "$work" "$corpus"
      rm -rf "$work"
    done
    echo "fuzz: 3 targets ran ${FUZZ_SECONDS}s each without a crash"
    ;;
esac
