#!/usr/bin/env bash
# ckptd's benchmark: ckptd against the machine's own limits, measured in one run.
#   scripts/bench.sh [--size GiB] [--dir DIR] [--json FILE] [--no-metadata] [--binaries DIR]
#                    [--repeat N] [--peers] [--hosts N] [--no-huge-pages]
# Starts 2 daemons and 4 trainers under mpirun with checkpoints in a temp directory
# under DIR (default /var/tmp, so the same file system as the baselines), and measures:
#   baselines  the disk's ceiling: the best O_DIRECT write (with the fdatasync that makes
#              it durable, timed as the save's is) and cold read of the same
#              bytes over a sweep of fio configurations (scripts/bench_ceiling.py:
#              psync, libaio, io_uring; queue depth 1-32; 1-4 jobs; ordinary buffers
#              and buffers in huge pages, as ckptd's own O_DIRECT I/O), named in the
#              report (ckptd-bench's own qd1 figures where fio cannot run); memcpy into
#              reused and into first-touch memory; before every ckptd run, the winning
#              write configuration again (the disk's speed drifts within a run), and
#              each run's save against that write. The page cache is dropped before every
#              read and restore where permitted (root), and the report says whether.
#   ckptd      trainer stall (longest Save call), save-to-durable, restore, resharded
#              restore, a data-parallel restore (every trainer restores everything),
#              and the gRPC-stream save beside the shared-memory one; each restore
#              reads a step of its own, and the bytes the daemons read from storage for
#              it are reported beside the bytes delivered (read amplification)
#   memory     the same save and restores with memory_steps 5: restores from daemon memory
#   grpc       one trainer's Save and Restore over the gRPC stream (restores from daemon
#              memory) against plain gRPC moving the same bytes (at most 1 GiB) over a
#              unix socket to and from a do-nothing service in its own process (medians of 5)
#   metadata   1,000 / 10,000 / 100,000 tensors of 1 KiB: save, commit, restore (each the
#              median of 3 rounds)
#   repeat     --repeat N runs the ckptd measurements N times (fresh daemons and root
#              each time) and reports each figure's median; the runs are in the JSON
#   peers      --peers: PyTorch DCP (save with fsync, cold load) and parallel HDF5
#              (collective write, cold read) on the same bytes with one rank per
#              daemon (scripts/bench_peers.py, median of --repeat runs), and ckptd's
#              ratios to them
#   segments   the trainers' shared-memory segments go in huge pages, as the client
#              makes them where the host allows huge pages: as root the bench lets
#              the kernel hand out huge pages on demand for its runs
#              (vm.nr_overcommit_hugepages: 4x the bytes at most, half of available
#              memory at most; nothing is held idle, so the data-parallel restore
#              needs no more memory than with ordinary pages) and puts the setting
#              back after; the report says so. --no-huge-pages leaves the setting
#              alone and sets CKPTD_HUGE_PAGES=0 (segments in ordinary pages).
#   hosts      with --hosts N (root): the same save and restores again on N simulated
#              hosts (tests/multihost/hosts.sh: network, hostname and mount namespaces,
#              Open MPI over TCP), one daemon and 2 trainers per host, with storage
#              shared (one root), local (a root per host, restores read other hosts'
#              bytes through their daemons) and local with 1 replica (then again after
#              host 1 lost its data file), and the bytes each host's NIC carried; then
#              local storage with drain_to a shared directory: how fast the committed
#              step reaches the drain in the background (every host copying its share);
#              and local storage with read_once off and no read cache (the read
#              amplification before read_once).
#              Every host's "disk" is a directory on this machine's disk.
# Prints a table; --json FILE writes one object with every number and ratio.
# --binaries DIR uses ckptd and ckptd-bench from DIR as they are (no install, no build).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_GIB=2 DIR=/var/tmp JSON_OUT="" METADATA=1 BIN="" HOSTS=0 REPEAT=1 PEERS=0 HUGE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE_GIB="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --json) JSON_OUT="$2"; shift 2 ;;
    --no-metadata) METADATA=0; shift ;;
    --binaries) BIN="$2"; shift 2 ;;
    --hosts) HOSTS="$2"; shift 2 ;;
    --repeat) REPEAT="$2"; shift 2 ;;
    --peers) PEERS=1; shift ;;
    --no-huge-pages) HUGE=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

[[ "$REPEAT" =~ ^[1-9][0-9]*$ ]] || { echo "bench.sh: --repeat takes a count of 1 or more" >&2; exit 2; }
if [ "$HOSTS" != 0 ]; then
  [[ "$HOSTS" =~ ^[0-9]+$ ]] && [ "$HOSTS" -ge 2 ] && [ "$HOSTS" -le 8 ] ||
    { echo "bench.sh: --hosts takes 2 to 8" >&2; exit 2; }
  [ "$(id -u)" = 0 ] || { echo "bench.sh: --hosts needs root (network and mount namespaces)" >&2; exit 2; }
fi
BYTES=$(/usr/bin/python3 -c "print(int(float('$SIZE_GIB') * (1 << 30)))")
# At most one root of 5 steps is on disk at a time, beside one baseline file: refuse
# up front (before any build) rather than fail with ENOSPC minutes into the run.
NEED_KIB=$(( BYTES / 1024 * 6 + (1 << 20) ))
FREE_KIB=$(df -Pk "$DIR" | awk 'NR == 2 {print $4}')
if [ "$FREE_KIB" -lt "$NEED_KIB" ]; then
  echo "bench.sh: $DIR has $((FREE_KIB >> 20)) GiB free; --size $SIZE_GIB needs about" \
    "$(( (NEED_KIB + (1 << 20) - 1) >> 20 )) GiB (5 checkpoints of the size and a baseline file): free" \
    "some space or pass --dir" >&2
  exit 2
fi
if [ -z "$BIN" ]; then
  bash scripts/build.sh > /dev/null
  BIN=build
fi
BIN="$(cd "$BIN" && pwd)"  # the simulated hosts' processes start elsewhere
WORK="$(mktemp -d "$DIR/ckptd-bench-XXXXXX")"
SOCK="$WORK/sock/ckptd-{rank}.sock"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
MPIRUN_PID=""
stop_daemons() {
  if [ -n "$MPIRUN_PID" ] && kill -0 "$MPIRUN_PID" 2>/dev/null; then
    kill -TERM -- "$MPIRUN_PID" 2>/dev/null || true
    wait "$MPIRUN_PID" 2>/dev/null || true
  fi
  MPIRUN_PID=""
}
# The daemons' job and the trainers' job start together on the simulated hosts, which
# share this machine's /tmp: each gets session directories of its own, or their orteds
# race to create the same /tmp/ompi.HOST.UID (seen: "mkdir ... File exists"). Short
# paths: Open MPI puts unix sockets in them.
OMPI_TMP=""
cleanup() {
  stop_daemons
  [ -d "$WORK/hosts" ] && bash tests/multihost/hosts.sh down "$WORK/hosts" 2>/dev/null
  rm -rf "$WORK"
  if [ -n "$OMPI_TMP" ]; then rm -rf "$OMPI_TMP"; fi
  if [ -n "$HUGE_BEFORE" ]; then echo "$HUGE_BEFORE" > /proc/sys/vm/nr_overcommit_hugepages 2>/dev/null || true; fi
}
HUGE_BEFORE=""
trap cleanup EXIT

echo "== baselines: $SIZE_GIB GiB in $WORK" >&2
# ckptd-bench measures memcpy (reused and first-touch memory) and a raw O_DIRECT
# write and read of its own; the disk's ceiling comes from scripts/bench_ceiling.py,
# the best of a sweep of fio configurations (engines, queue depths, job counts), when
# fio is installed and can use O_DIRECT there.
RAW_TOOL=ckptd-bench
BASE=$("$BIN/ckptd-bench" raw --dir "$WORK" --bytes "$BYTES" --files 2)
rm -f "$WORK"/raw-*
QUICK=()
[ "$BYTES" -lt $((1 << 30)) ] && QUICK=(--quick)  # the smoke run: fewer configurations
if CEILING=$(/usr/bin/python3 scripts/bench_ceiling.py "$WORK" "$BYTES" "${QUICK[@]}"); then
  RAW_TOOL=fio
  BASE=$(/usr/bin/python3 -c "import json,sys; j=json.loads(sys.argv[1]); j.update(json.loads(sys.argv[2])); print(json.dumps(j))" "$BASE" "$CEILING")
fi

# Huge pages for the trainers' segments (after the ceiling sweep, which reserves and
# gives back its own): the client puts a segment in them where the kernel has them.
# On demand rather than reserved: a reservation holds its memory whether used or
# not, and beside the data-parallel restore's copies (every trainer holds the whole
# model) that ran this 24 GiB machine out of memory.
SEGMENT_HUGE_PAGES=0
if [ "$HUGE" = 0 ]; then
  export CKPTD_HUGE_PAGES=0
else
  FREE_HUGE=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
  if [ -w /proc/sys/vm/nr_overcommit_hugepages ]; then
    AVAIL_KIB=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
    WANT=$(( BYTES * 4 / (2 << 20) ))
    [ "$WANT" -gt $(( AVAIL_KIB / 2 / 2048 )) ] && WANT=$(( AVAIL_KIB / 2 / 2048 ))
    HUGE_BEFORE=$(cat /proc/sys/vm/nr_overcommit_hugepages)
    [ "$WANT" -gt "$HUGE_BEFORE" ] && { echo "$WANT" > /proc/sys/vm/nr_overcommit_hugepages 2>/dev/null || true; }
  fi
  SEGMENT_HUGE_PAGES=$(( FREE_HUGE + $(cat /proc/sys/vm/nr_overcommit_hugepages) ))
fi
echo "== trainer segments: up to $SEGMENT_HUGE_PAGES huge pages" >&2

# Before every run, the winning write configuration again: this disk's speed drifts
# (it throttles after bursts), so each run's save is also held to a write beside it.
WRITE_CONFIG=""
[ "$RAW_TOOL" = fio ] &&
  WRITE_CONFIG=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["raw_write_config"])' "$BASE")
RUNS=()
for RUN in $(seq "$REPEAT"); do
  echo "== ckptd: 2 daemons, 4 trainers (run $RUN of $REPEAT)" >&2
  stop_daemons
  rm -rf "$WORK/root"
  "${MPIRUN[@]}" -np 2 "$BIN/ckptd" --root "$WORK/root" --socket "$SOCK" --commit-timeout 600s \
    > "$WORK/daemons.log" 2>&1 &
  MPIRUN_PID=$!
  BESIDE="{}"
  [ -n "$WRITE_CONFIG" ] &&
    BESIDE=$(/usr/bin/python3 scripts/bench_ceiling.py "$WORK" "$BYTES" --write-only "$WRITE_CONFIG")
  RUN_JSON=$("${MPIRUN[@]}" -np 4 "$BIN/ckptd-bench" save --socket "$SOCK" --bytes "$BYTES" --daemons 2) || {
    cat "$WORK/daemons.log" >&2; exit 1; }
  RUNS+=("$(/usr/bin/python3 -c '
import json, sys
run, beside = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if beside:
    run["raw_write_beside_gbps"] = beside["raw_write_gbps"]
    run["raw_write_beside_fsync_s"] = beside["raw_write_fsync_s"]
    run["save_vs_raw_write_beside"] = run["save_gbps"] / beside["raw_write_gbps"]
print(json.dumps(run))' "$RUN_JSON" "$BESIDE")")
done
# Each figure is the median of the runs; the runs themselves go into the JSON.
CKPTD=$(/usr/bin/python3 -c '
import json, statistics, sys
runs = [json.loads(a) for a in sys.argv[1:]]
out = dict(runs[-1])
for key, value in runs[-1].items():
    if isinstance(value, float):
        out[key] = statistics.median(r[key] for r in runs)
out["runs"] = runs
print(json.dumps(out))' "${RUNS[@]}")
META="[]"
if [ "$METADATA" = 1 ]; then
  echo "== metadata: 1,000 / 10,000 / 100,000 tensors of 1 KiB" >&2
  META=$("$BIN/ckptd-bench" metadata --socket "$SOCK") || { cat "$WORK/daemons.log" >&2; exit 1; }
fi

# The memory tier: the same run with memory_steps 5 (it saves steps 1-5 and restores
# each of them once), so the same-cut restores read each daemon's own data file from memory.
echo "== memory tier: 2 daemons with memory_steps 5, 4 trainers" >&2
stop_daemons
rm -rf "$WORK/root"  # the last run's 5 steps: not needed past here
"${MPIRUN[@]}" -np 2 "$BIN/ckptd" --root "$WORK/root-memory" --socket "$SOCK" --commit-timeout 600s \
  --memory-steps 5 > "$WORK/daemons-memory.log" 2>&1 &
MPIRUN_PID=$!
# Without the data-parallel restore: the daemons hold 5 steps in memory, and every
# trainer holding the whole model beside them would not fit in this machine's memory.
MEMORY=$("${MPIRUN[@]}" -np 4 "$BIN/ckptd-bench" save --socket "$SOCK" --bytes "$BYTES" --daemons 2 \
  --no-data-parallel) || {
  cat "$WORK/daemons-memory.log" >&2; exit 1; }
stop_daemons
rm -rf "$WORK/root-memory"

# The gRPC stream against plain gRPC (a do-nothing service in a process of its own, on
# a unix socket, 4 MiB messages): one trainer, one daemon keeping 2 steps in memory so
# that restores read memory, not the disk. At most 1 GiB: a ratio of throughputs, and
# the trainer, the baseline server and the daemon each hold the bytes.
GRPC_BYTES=$(( BYTES < 1073741824 ? BYTES : 1073741824 ))
echo "== gRPC stream vs plain gRPC: 1 daemon with memory_steps 2, 1 trainer, $GRPC_BYTES bytes" >&2
"${MPIRUN[@]}" -np 1 "$BIN/ckptd" --root "$WORK/root-grpc" --socket "$SOCK" --commit-timeout 600s \
  --memory-steps 2 > "$WORK/daemons-grpc.log" 2>&1 &
MPIRUN_PID=$!
GRPC=$("$BIN/ckptd-bench" grpc --socket "$SOCK" --dir "$WORK" --bytes "$GRPC_BYTES" --rounds 5) || {
  cat "$WORK/daemons-grpc.log" >&2; exit 1; }
stop_daemons
rm -rf "$WORK/root-grpc"

PEER="{}"
if [ "$PEERS" = 1 ]; then
  bash scripts/install-deps.sh --peers > /dev/null
  echo "== peers: PyTorch DCP and parallel HDF5, 2 ranks, the same bytes" >&2
  PEER=$("${MPIRUN[@]}" -np 2 /usr/bin/python3 scripts/bench_peers.py --dir "$WORK" --bytes "$BYTES" \
    --repeat "$REPEAT") || { echo "bench.sh: the peers' run failed" >&2; exit 1; }
fi

MULTI="{}"
if [ "$HOSTS" != 0 ]; then
  H="$WORK/hosts"
  CKPTD_HOSTS_OWNER=$$ bash tests/multihost/hosts.sh up "$HOSTS" "$H"
  # Local storage restores through peer daemons over TCP, which is mutual TLS only.
  mkdir -p "$WORK/tls"
  (cd "$WORK/tls" &&
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=ca -keyout ca.key -out ca.crt &&
    openssl req -newkey rsa:2048 -nodes -subj /CN=ckptd -keyout d.key -out d.csr &&
    printf 'subjectAltName=%s\n' "$(seq -s, -f 'DNS:host%g' 0 $((HOSTS - 1)))" > san.ext &&
    openssl x509 -req -in d.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext \
      -out d.crt) > /dev/null 2>&1
  printf 'tcp:\n  address: 0.0.0.0:0\n  tls_cert: %s\n  tls_key: %s\n  tls_ca: %s\n' \
    "$WORK/tls/d.crt" "$WORK/tls/d.key" "$WORK/tls/ca.crt" > "$WORK/tls/ckptd.yaml"
  # The "each" run: local storage as before read_once, every daemon reading what its
  # trainers need and no read cache (the read amplification before).
  { cat "$WORK/tls/ckptd.yaml"; printf 'read_once: false\nread_cache: 0\n'; } > "$WORK/tls/each.yaml"
  SUBNET=$(sed -n 's/^SUBNET=//p' tests/multihost/hosts.sh).0/24
  ON_HOSTS=(nsenter -t "$(cat "$H/pid0")" -n -u -m -- "${MPIRUN[@]}" --hostfile "$H/hostfile"
    --mca plm_rsh_agent "$H/agent" --mca btl tcp,self --mca pml ob1
    --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET"
    --mca mpi_yield_when_idle 1)  # all hosts share this machine's cores: waiting ranks yield
  OMPI_TMP="$(mktemp -d /tmp/ckptd-ompi-XXXXXX)"
  mkdir -p "$OMPI_TMP/d" "$OMPI_TMP/t"
  MULTI="{"
  # replicas: local storage with one copy of each data file on the next host; after
  # its run, host 1 loses its own data file of the measured step and the restores run
  # again (host 1 then reads it from the copy).
  for MODE in shared local replicas drain each; do
    echo "== $HOSTS hosts, $MODE: 1 daemon and 2 trainers per host" >&2
    ROOT="$H/disk/root-$MODE"  # each host's own directory
    CONFIG="$WORK/tls/ckptd.yaml"
    [ "$MODE" = each ] && CONFIG="$WORK/tls/each.yaml"
    FLAGS=(--storage local)
    [ "$MODE" = shared ] && ROOT="$H/shared/root-$MODE" FLAGS=(--storage shared)
    [ "$MODE" = replicas ] && FLAGS+=(--replicas 1)
    [ "$MODE" = drain ] && FLAGS+=(--drain-to "$H/shared/drain")
    # Sockets live on each host's own disk, so a trainer reaches only its host's daemon.
    "${ON_HOSTS[@]}" --mca orte_tmpdir_base "$OMPI_TMP/d" -np "$HOSTS" --map-by node "$BIN/ckptd" \
      --config "$CONFIG" "${FLAGS[@]}" \
      --root "$ROOT" --socket "$H/disk/ckptd-{rank}.sock" --commit-timeout 600s \
      --log-level "${CKPTD_BENCH_LOG_LEVEL:-info}" > "$WORK/daemons-$MODE.log" 2>&1 &
    MPIRUN_PID=$!
    TRAINERS=("${ON_HOSTS[@]}" --mca orte_tmpdir_base "$OMPI_TMP/t" -np $((2 * HOSTS)) --map-by ppr:2:node
      "$BIN/ckptd-bench" save
      --socket "$H/disk/ckptd-{rank}.sock" --bytes "$BYTES" --daemons "$HOSTS" --net-interface eth0)
    OUT=$("${TRAINERS[@]}") || { cat "$WORK/daemons-$MODE.log" >&2; exit 1; }
    MULTI="$MULTI\"$MODE\": $OUT,"
    if [ "$MODE" = drain ]; then
      # The drain runs behind the commits: wait for the newest committed step there.
      LAST=$(ls "$H/host0/root-$MODE/bench" | grep '^step-' | sort | tail -1)
      for _ in $(seq 6000); do
        [ -e "$H/shared/drain/bench/$LAST/ckpt.index" ] && break
        sleep 0.1
      done
      [ -e "$H/shared/drain/bench/$LAST/ckpt.index" ] || { echo "bench.sh: $LAST never drained" >&2; exit 1; }
    fi
    if [ "$MODE" = replicas ]; then
      for STEP in 1 2 3 4 5; do
        rm "$H/host1/root-$MODE/bench/step-0000000$STEP/$(printf 'ckpt.data-%05d-of-%05d' 1 "$HOSTS")"
      done
      OUT=$("${TRAINERS[@]}" --restore-only) || { cat "$WORK/daemons-$MODE.log" >&2; exit 1; }
      MULTI="$MULTI\"replicas_host1_lost\": $OUT,"
    fi
    stop_daemons
  done
  # Rank 0 logs each drained step: "... drained to DIR: B bytes copied in S s ...".
  DRAINED=$(grep -o "step-[0-9]*: [0-9]* bytes copied in [0-9.]* s" "$WORK/daemons-drain.log" | tail -1 |
    awk '{printf "{\"bytes\": %s, \"seconds\": %s}", $2, $6}')
  MULTI="$MULTI\"drained\": ${DRAINED:-null},"
  MULTI="${MULTI%,}}"
fi

/usr/bin/python3 - "$BASE" "$CKPTD" "$META" "$RAW_TOOL" "$JSON_OUT" "$MULTI" "$HOSTS" "$MEMORY" "$PEER" "$GRPC" "$SEGMENT_HUGE_PAGES" <<'EOF'
import json, sys
base, ckptd, meta = (json.loads(a) for a in sys.argv[1:4])
tool, out_path = sys.argv[4], sys.argv[5]
multi, hosts = json.loads(sys.argv[6]), int(sys.argv[7])
memory = json.loads(sys.argv[8])
peers = json.loads(sys.argv[9])
grpc = json.loads(sys.argv[10])
r = dict(base, **ckptd)
gb = r["bytes"] / 1e9
r["memcpy_s"] = gb / r["memcpy_gbps"]
r["stall_vs_memcpy"] = r["stall_s"] / r["memcpy_s"]
r["save_vs_raw_write"] = r["save_gbps"] / r["raw_write_gbps"]
r["restore_vs_raw_read"] = r["restore_gbps"] / r["raw_read_gbps"]
r["reshard_restore_vs_raw_read"] = r["reshard_restore_gbps"] / r["raw_read_gbps"]
r["grpc_save_vs_shm_save"] = r["grpc_save_gbps"] / r["save_gbps"]
r["raw_tool"] = tool
r["segment_huge_pages"] = int(sys.argv[11])
r["metadata"] = meta
by_n = {m["tensors"]: m["total_s"] for m in meta}
if 10000 in by_n and 100000 in by_n:
    r["metadata_100k_vs_10k"] = by_n[100000] / by_n[10000]

def row(what, value, unit, baseline="", ratio=None, target=""):
    ratio_text = f"{ratio:.2f}x" if ratio is not None else ""
    print(f"| {what:<34} | {value:>8.3f} {unit:<4} | {baseline:<28} | {ratio_text:>6} | {target:<9} |")

segments = (f"trainer segments in huge pages (up to {r['segment_huge_pages']} of 2 MiB, on demand)"
            if r["segment_huge_pages"] else "trainer segments in ordinary pages")
print(f"\nckptd benchmark: {gb:.2f} GB, {r['trainers']} trainers, {r['daemons']} daemons; baselines by {tool}; "
      f"{segments}\n")
print("| measurement                        |         value | baseline (same run)          |  ratio | target    |")
print("|------------------------------------|---------------|------------------------------|--------|-----------|")
row("raw write + fdatasync (ceiling)", r["raw_write_gbps"], "GB/s", r.get("raw_write_config", "ckptd-bench, qd1 x2 files"))
row("raw O_DIRECT read (ceiling, cold)", r["raw_read_gbps"], "GB/s", r.get("raw_read_config", "ckptd-bench, qd1 x2 files"))
row("memcpy, same bytes", r["memcpy_s"], "s", f"{r['memcpy_gbps']:.1f} GB/s")
row("memcpy into first-touch memory", r["first_touch_memcpy_s"], "s", f"{r['first_touch_memcpy_gbps']:.1f} GB/s")
row("trainer stall (warm, shm)", r["stall_s"], "s", "memcpy time", r["stall_vs_memcpy"], "<= 1.5x")
r["first_stall_vs_first_touch"] = r["cold_stall_s"] / r["first_touch_memcpy_s"]
row("trainer stall (first save)", r["cold_stall_s"], "s", "first-touch memcpy", r["first_stall_vs_first_touch"], "<= 2x")
row("save to durable (shm)", r["save_gbps"], "GB/s", "raw write", r["save_vs_raw_write"], ">= 0.9x")
if "save_vs_raw_write_beside" in r:
    row("  raw write beside each run", r["raw_write_beside_gbps"], "GB/s", "same config, before the run")
    row("  save vs the write beside it", r["save_gbps"], "GB/s", "median of per-run ratios",
        r["save_vs_raw_write_beside"], ">= 0.9x")
row("save to durable (gRPC stream)", r["grpc_save_gbps"], "GB/s", "save over shm", r["grpc_save_vs_shm_save"])
row("restore (same cut, cold)", r["restore_gbps"], "GB/s", "raw read", r["restore_vs_raw_read"], ">= 0.9x")
row("restore (first: segment faults)", r["cold_restore_gbps"], "GB/s", "raw read", r["cold_restore_gbps"] / r["raw_read_gbps"])
row("resharded restore (row halves)", r["reshard_restore_gbps"], "GB/s", "raw read", r["reshard_restore_vs_raw_read"], ">= 0.75x")
row("resharded (first: segment faults)", r["cold_reshard_restore_gbps"], "GB/s", "raw read", r["cold_reshard_restore_gbps"] / r["raw_read_gbps"])
r["memory_tier_restore_gbps"] = memory["restore_gbps"]
r["memory_tier_restore_vs_memcpy"] = memory["restore_gbps"] / r["memcpy_gbps"]
row("restore from memory (memory_steps)", memory["restore_gbps"], "GB/s", "memcpy", r["memory_tier_restore_vs_memcpy"])
row("  the same restore from disk", r["restore_gbps"], "GB/s", "memory tier", r["restore_gbps"] / memory["restore_gbps"])
# Into the client's HostBuffers the daemon copies each kept entry straight into the
# trainer's tensor: one copy, as a memcpy makes. The first restore into a buffer also
# pays the daemon's first access through its new mapping of it.
r["memory_tier_host_buffer_restore_gbps"] = memory["host_buffer_restore_gbps"]
r["memory_tier_host_buffer_restore_vs_memcpy"] = memory["host_buffer_restore_gbps"] / r["memcpy_gbps"]
row("  into HostBuffers", memory["host_buffer_restore_gbps"], "GB/s", "memcpy",
    r["memory_tier_host_buffer_restore_vs_memcpy"], ">= 1x")
r["memory_tier_first_host_buffer_restore_vs_first_touch"] = (
    memory["cold_host_buffer_restore_gbps"] / r["first_touch_memcpy_gbps"])
row("  into HostBuffers, first", memory["cold_host_buffer_restore_gbps"], "GB/s", "first-touch memcpy",
    r["memory_tier_first_host_buffer_restore_vs_first_touch"])
r["grpc"] = grpc
r["stream_save_vs_plain_grpc"] = grpc["stream_save_vs_plain_grpc"]
r["stream_restore_vs_plain_grpc"] = grpc["stream_restore_vs_plain_grpc"]
row("plain gRPC send (unix socket)", grpc["plain_grpc_send_gbps"], "GB/s", f"{grpc['bytes'] / 1e9:.2f} GB, 1 stream")
row("plain gRPC receive", grpc["plain_grpc_receive_gbps"], "GB/s", "")
row("Save over the gRPC stream", grpc["stream_save_gbps"], "GB/s", "plain gRPC send",
    grpc["stream_save_vs_plain_grpc"], ">= 0.8x")
row("Restore over the stream (memory)", grpc["stream_restore_gbps"], "GB/s", "plain gRPC receive",
    grpc["stream_restore_vs_plain_grpc"], ">= 0.8x")
for m in meta:
    row(f"{m['tensors']:,} x 1 KiB: save+commit+restore", m["total_s"], "s",
        f"save {m['save_s']:.2f} commit {m['commit_s']:.2f} restore {m['restore_s']:.2f}")
if "metadata_100k_vs_10k" in r:
    print(f"\n100,000 tensors cost {r['metadata_100k_vs_10k']:.1f}x what 10,000 cost (target <= 10x)")

# Bytes read from storage beside bytes delivered, for every restore figure: a restore
# that delivers each stored byte to several trainers reads it once.
print(f"\nrestores: bytes read from storage and delivered (page cache dropped before each: "
      f"{'yes' if r.get('page_cache_dropped') else 'no, not permitted'})\n")
print("| restore                        | read (GB) | delivered (GB) | read amplification | read GB/s | delivered GB/s |")
print("|--------------------------------|-----------|----------------|--------------------|-----------|----------------|")
delivered_x = {"cold_restore": 1, "restore": 1, "cold_reshard_restore": 2, "reshard_restore": 2,
               "dp_restore": r["trainers"]}
gbps_key = {"cold_restore": "cold_restore_gbps", "restore": "restore_gbps",
            "cold_reshard_restore": "cold_reshard_restore_gbps", "reshard_restore": "reshard_restore_gbps",
            "dp_restore": "dp_restore_gbps"}
r["restores"] = {}
for phase, times in delivered_x.items():
    delivered = times * r["bytes"]
    read = r["storage_bytes"][phase]
    seconds = delivered / 1e9 / r[gbps_key[phase]]
    r["restores"][phase] = {"read_bytes": read, "delivered_bytes": delivered, "seconds": seconds,
                            "read_amplification": read / r["bytes"], "read_gbps": read / 1e9 / seconds,
                            "delivered_gbps": delivered / 1e9 / seconds}
    x = r["restores"][phase]
    print(f"| {phase:<30} | {read / 1e9:9.3f} | {delivered / 1e9:14.3f} | {x['read_amplification']:18.2f} | "
          f"{x['read_gbps']:9.3f} | {x['delivered_gbps']:14.3f} |")
if peers:
    r["peers"] = peers
    print(f"\npeers on the same bytes, {r['daemons']} ranks, page cache dropped before each load "
          f"(median of {len(r.get('runs', [])) or 1}; ratio = ckptd / peer)\n")
    print("| peer                 | save GB/s | ckptd save / peer | load GB/s | ckptd restore / peer |")
    print("|----------------------|-----------|-------------------|-----------|----------------------|")
    names = {"dcp": "PyTorch DCP", "hdf5": "parallel HDF5"}
    for key, peer in peers.items():
        if "error" in peer:
            print(f"| {names.get(key, key):<20} | could not run: {peer['error'][:120]}")
            continue
        peer["ckptd_save_ratio"] = r["save_gbps"] / peer["save_gbps"]
        peer["ckptd_restore_ratio"] = r["restore_gbps"] / peer["load_gbps"]
        print(f"| {names.get(key, key):<20} | {peer['save_gbps']:9.3f} | {peer['ckptd_save_ratio']:16.2f}x | "
              f"{peer['load_gbps']:9.3f} | {peer['ckptd_restore_ratio']:19.2f}x |")
    loads = [p["load_gbps"] for p in peers.values() if "error" not in p]
    if loads:
        r["restore_vs_fastest_peer"] = r["restore_gbps"] / max(loads)
        print(f"\ncold same-cut restore is {r['restore_vs_fastest_peer']:.2f}x the faster peer's cold load "
              f"(target >= 1.5x)")
if multi:
    r["hosts"] = {"count": hosts, **multi}
    def mb(n):
        return f"{n / 1e6:8.1f}"
    print(f"\n{hosts} simulated hosts, 1 daemon and 2 trainers each, beside this machine's "
          f"{r['daemons']} daemons and {r['trainers']} trainers (GB/s; ratio to the single machine)\n")
    modes = ("shared", "local", "replicas")
    print("| measurement                    | one machine |     shared       |      local       | local, 1 replica |")
    print("|--------------------------------|-------------|------------------|------------------|------------------|")
    def cells(key):
        return " | ".join(f"{multi[m][key]:7.3f} {multi[m][key] / r[key]:5.2f}x  " for m in modes)
    for what, key in [("save to durable (shm)", "save_gbps"), ("save to durable (gRPC)", "grpc_save_gbps"),
                      ("restore (same cut)", "restore_gbps"),
                      ("resharded restore (row halves)", "reshard_restore_gbps")]:
        print(f"| {what:<30} | {r[key]:11.3f} | {cells(key)} |")
    lost = multi["replicas_host1_lost"]
    for what, key in [("restore, host 1's file lost", "restore_gbps"),
                      ("resharded, host 1's file lost", "reshard_restore_gbps")]:
        print(f"| {what:<30} | {r[key]:11.3f} | {'':16} | {'':16} | {lost[key]:7.3f} {lost[key] / r[key]:5.2f}x   |")
    # Read amplification: bytes the daemons read from storage over the step's bytes
    # (every restore needs the whole step across the job).
    print(f"\nread amplification (bytes read from storage / the step's bytes; goal 1.0) and GB/s delivered\n")
    print("| restore                        | one machine |  shared  |  local   | 1 replica | local, read_once off, no cache |")
    print("|--------------------------------|-------------|----------|----------|-----------|--------------------------------|")
    amp_modes = ("shared", "local", "replicas", "each")
    for what, phase, key in [("same cut", "restore", "restore_gbps"),
                             ("resharded (row halves)", "reshard_restore", "reshard_restore_gbps"),
                             ("data-parallel (all want all)", "dp_restore", "dp_restore_gbps")]:
        amp = lambda run: run["storage_bytes"][phase] / run["bytes"]
        for m in ("single",) + amp_modes:
            run = r if m == "single" else multi[m]
            r.setdefault("read_amplification", {}).setdefault(m, {})[phase] = amp(run)
        cells = " | ".join(f"{amp(multi[m]):8.2f}" for m in amp_modes[:3])
        print(f"| {what + ' (x)':<30} | {amp(r):11.2f} | {cells} | {amp(multi['each']):30.2f} |")
        cells = " | ".join(f"{multi[m][key]:8.3f}" for m in amp_modes[:3])
        print(f"| {'  GB/s delivered':<30} | {r[key]:11.3f} | {cells} | {multi['each'][key]:30.3f} |")
    r["dp_read_amplification"] = r["read_amplification"]["local"]["dp_restore"]
    r["dp_read_amplification_before"] = r["read_amplification"]["each"]["dp_restore"]
    r["replica_save_overhead"] = multi["local"]["save_gbps"] / multi["replicas"]["save_gbps"]
    print(f"\nsave with 1 replica takes {r['replica_save_overhead']:.2f}x the time of local storage without")
    drained = multi.get("drained")
    if drained and drained["seconds"] > 0:
        r["drain_gbps"] = drained["bytes"] / drained["seconds"] / 1e9
        r["drain_vs_raw_write"] = r["drain_gbps"] / r["raw_write_gbps"]
        print(f"drain of the last step to a shared directory, every host copying its share in the background: "
              f"{drained['bytes'] / 1e9:.2f} GB in {drained['seconds']:.2f} s = {r['drain_gbps']:.3f} GB/s "
              f"({r['drain_vs_raw_write']:.2f}x raw write)")
    print(f"\nnetwork bytes per host per step (MB; the most any host received / sent on eth0)\n")
    print("| phase                          |      shared received / sent |       local received / sent |  1 replica received / sent  |")
    print("|--------------------------------|-----------------------------|-----------------------------|-----------------------------|")
    for phase in ("save", "grpc_save", "restore", "reshard_restore", "dp_restore"):
        cells = " | ".join(f"{mb(multi[m]['net_per_host'][phase]['received'])} / {mb(multi[m]['net_per_host'][phase]['sent'])}         "
                           for m in modes)
        print(f"| {phase:<30} | {cells} |")
if out_path:
    with open(out_path, "w") as f:
        json.dump(r, f, indent=1)
    print(f"wrote {out_path}")
EOF
