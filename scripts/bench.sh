#!/usr/bin/env bash
# ckptd's benchmark: ckptd against the machine's own limits, measured in one run.
#   scripts/bench.sh [--size GiB] [--dir DIR] [--json FILE] [--inputs-json FILE] [--no-metadata] [--binaries DIR]
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
#              it are reported beside the bytes delivered (read amplification). The
#              report leads with a process's first restore (into memory the trainer
#              holds: C++ client, Python client in new processes, HostBuffers) against
#              the restore's read ceiling, an O_DIRECT read of the same bytes into
#              distinct fresh memory (ckptd-bench raw), and a warm process's restore
#              against the same read into pre-faulted memory
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
#              ratios to them; and DCP's own calls with ckptd as its storage
#              (ckptd.torch.StorageWriter/Reader): how long save blocks the loop,
#              the time to durable and the load, beside DCP on files
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
#              bytes through their daemons), local with 1 replica and local with
#              parity (one group of every host, P=1; each then again after host 1 lost
#              its files), the bytes each host's NIC carried and each mode's bytes
#              stored; then
#              local storage with drain_to a shared directory: how fast the committed
#              step reaches the drain in the background (every host copying its share);
#              and local storage with read_once off and no read cache (the read
#              amplification before read_once).
#              Every host's "disk" is a directory on this machine's disk.
# Prints a table (scripts/bench_report.py); --json FILE writes one object with every
# number and ratio; --inputs-json FILE keeps what the report was made from
# (bench_report.py report FILE prints it again).
# --binaries DIR uses ckptd and ckptd-bench from DIR as they are (no install, no build).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_GIB=2 DIR=/var/tmp JSON_OUT="" INPUTS_OUT="" METADATA=1 BIN="" HOSTS=0 REPEAT=1 PEERS=0 HUGE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE_GIB="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --json) JSON_OUT="$2"; shift 2 ;;
    --inputs-json) INPUTS_OUT="$2"; shift 2 ;;
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
REPORT=(/usr/bin/python3 scripts/bench_report.py)
BYTES=$("${REPORT[@]}" gib "$SIZE_GIB")
# At most one root of 6 steps is on disk at a time, beside one baseline file: refuse
# up front (before any build) rather than fail with ENOSPC minutes into the run.
NEED_KIB=$(( BYTES / 1024 * 7 + (1 << 20) ))
FREE_KIB=$(df -Pk "$DIR" | awk 'NR == 2 {print $4}')
if [ "$FREE_KIB" -lt "$NEED_KIB" ]; then
  echo "bench.sh: $DIR has $((FREE_KIB >> 20)) GiB free; --size $SIZE_GIB needs about" \
    "$(( (NEED_KIB + (1 << 20) - 1) >> 20 )) GiB (6 checkpoints of the size and a baseline file): free" \
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
  BASE=$("${REPORT[@]}" merge "$BASE" "$CEILING")
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
  WRITE_CONFIG=$("${REPORT[@]}" get "$BASE" raw_write_config)
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
  # The Python client's first and second restore, each trainer in a new process, into
  # numpy arrays it holds (where mpi4py and numpy are installed).
  if /usr/bin/python3 -c 'import mpi4py, numpy' 2> /dev/null; then
    PY_JSON=$("${MPIRUN[@]}" -np 4 -x PYTHONPATH="$BIN/python" /usr/bin/python3 scripts/bench_python_restore.py \
      --socket "$SOCK" --bytes "$BYTES" --daemons 2) || { cat "$WORK/daemons.log" >&2; exit 1; }
    RUN_JSON=$("${REPORT[@]}" merge "$RUN_JSON" "$PY_JSON")
  fi
  RUNS+=("$("${REPORT[@]}" beside "$RUN_JSON" "$BESIDE")")
done
# Each figure is the median of the runs; the runs themselves go into the JSON.
CKPTD=$("${REPORT[@]}" median "${RUNS[@]}")
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
  echo "== peers: PyTorch DCP (on files, and on ckptd), parallel HDF5, 2 ranks, the same bytes" >&2
  # DCP with ckptd as its storage saves through daemons of its own.
  DCP_SOCK="$WORK/sock/dcp-{rank}.sock"
  "${MPIRUN[@]}" -np 2 "$BIN/ckptd" --root "$WORK/root-dcp" --socket "$DCP_SOCK" --commit-timeout 600s \
    > "$WORK/daemons-dcp.log" 2>&1 &
  MPIRUN_PID=$!
  PEER=$("${MPIRUN[@]}" -np 2 -x PYTHONPATH="$BIN/python" /usr/bin/python3 scripts/bench_peers.py --dir "$WORK" \
    --bytes "$BYTES" --repeat "$REPEAT" --ckptd-socket "$DCP_SOCK") || {
    cat "$WORK/daemons-dcp.log" >&2; echo "bench.sh: the peers' run failed" >&2; exit 1; }
  stop_daemons
  rm -rf "$WORK/root-dcp"
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
  # The newest step's files on every host of a local-storage mode: each host's own data
  # file ("data") and what it keeps for redundancy ("redundant": copies, parity).
  stored_bytes() {
    local data=0 redundant=0 h dir f size
    for h in $(seq 0 $((HOSTS - 1))); do
      dir="$H/host$h/root-$1/bench/$(ls "$H/host$h/root-$1/bench" | grep '^step-' | sort | tail -1)"
      for f in "$dir"/ckpt.data-* "$dir"/ckpt.parity-*; do
        [ -e "$f" ] || continue
        size=$(stat -c %s "$f")
        if [ "${f##*/}" = "$(printf 'ckpt.data-%05d-of-%05d' "$h" "$HOSTS")" ]; then
          data=$((data + size))
        else
          redundant=$((redundant + size))
        fi
      done
    done
    printf '{"data": %s, "redundant": %s}' "$data" "$redundant"
  }
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
  # parity: local storage with Reed-Solomon parity (one group of all the hosts, P=1);
  # after its run host 1 loses its data and parity files, and the restores read its
  # bytes rebuilt from the others.
  for MODE in shared local replicas parity drain each; do
    echo "== $HOSTS hosts, $MODE: 1 daemon and 2 trainers per host" >&2
    ROOT="$H/disk/root-$MODE"  # each host's own directory
    CONFIG="$WORK/tls/ckptd.yaml"
    [ "$MODE" = each ] && CONFIG="$WORK/tls/each.yaml"
    FLAGS=(--storage local)
    [ "$MODE" = shared ] && ROOT="$H/shared/root-$MODE" FLAGS=(--storage shared)
    [ "$MODE" = replicas ] && FLAGS+=(--replicas 1)
    [ "$MODE" = parity ] && FLAGS+=(--redundancy parity --parity-group "$HOSTS" --parity 1)
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
    case "$MODE" in local | replicas | parity) MULTI="$MULTI\"stored_$MODE\": $(stored_bytes "$MODE")," ;; esac
    if [ "$MODE" = replicas ] || [ "$MODE" = parity ]; then
      for STEP in 1 2 3 4 5 6; do
        for NAME in data parity; do
          rm -f "$H/host1/root-$MODE/bench/step-0000000$STEP/$(printf 'ckpt.%s-%05d-of-%05d' "$NAME" 1 "$HOSTS")"
        done
      done
      OUT=$("${TRAINERS[@]}" --restore-only) || { cat "$WORK/daemons-$MODE.log" >&2; exit 1; }
      MULTI="$MULTI\"${MODE}_host1_lost\": $OUT,"
    fi
    stop_daemons
  done
  # Rank 0 logs each drained step: "... drained to DIR: B bytes copied in S s ...".
  DRAINED=$(grep -o "step-[0-9]*: [0-9]* bytes copied in [0-9.]* s" "$WORK/daemons-drain.log" | tail -1 |
    awk '{printf "{\"bytes\": %s, \"seconds\": %s}", $2, $6}')
  MULTI="$MULTI\"drained\": ${DRAINED:-null},"
  MULTI="${MULTI%,}}"
fi

# Everything measured, in one file; the report is made from it (and can be made again
# from a copy: --inputs-json).
printf '{"base": %s, "ckptd": %s, "metadata": %s, "raw_tool": "%s", "hosts": %s, "host_count": %s, ' \
  "$BASE" "$CKPTD" "$META" "$RAW_TOOL" "$MULTI" "$HOSTS" > "$WORK/report-inputs.json"
printf '"memory": %s, "peers": %s, "grpc": %s, "segment_huge_pages": %s}\n' \
  "$MEMORY" "$PEER" "$GRPC" "$SEGMENT_HUGE_PAGES" >> "$WORK/report-inputs.json"
[ -n "$INPUTS_OUT" ] && cp "$WORK/report-inputs.json" "$INPUTS_OUT"
"${REPORT[@]}" report "$WORK/report-inputs.json" --json "$JSON_OUT"
