#!/usr/bin/env bash
# ckptd's benchmark: ckptd against the machine's own limits, measured in one run.
#   scripts/bench.sh [--size GiB] [--dir DIR] [--json FILE] [--no-metadata] [--binaries DIR]
# Starts 2 daemons and 4 trainers under mpirun with checkpoints in a temp directory
# under DIR (default /var/tmp, so the same file system as the baselines), and measures:
#   baselines  raw O_DIRECT sequential write and read of the same bytes over 2
#              concurrent files (fio when installed, else ckptd-bench's own), memcpy
#   ckptd      trainer stall (longest Save call), save-to-durable, restore, resharded
#              restore, and the gRPC-stream save beside the shared-memory one
#   metadata   1,000 / 10,000 / 100,000 tensors of 1 KiB: save, commit, restore
# Prints a table; --json FILE writes one object with every number and ratio.
# --binaries DIR uses ckptd and ckptd-bench from DIR as they are (no install, no build).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_GIB=2 DIR=/var/tmp JSON_OUT="" METADATA=1 BIN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE_GIB="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --json) JSON_OUT="$2"; shift 2 ;;
    --no-metadata) METADATA=0; shift ;;
    --binaries) BIN="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [ -z "$BIN" ]; then
  bash scripts/build.sh > /dev/null
  BIN=build
fi
BYTES=$(/usr/bin/python3 -c "print(int(float('$SIZE_GIB') * (1 << 30)))")
WORK="$(mktemp -d "$DIR/ckptd-bench-XXXXXX")"
SOCK="$WORK/sock/ckptd-{rank}.sock"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
MPIRUN_PID=""
cleanup() {
  if [ -n "$MPIRUN_PID" ] && kill -0 "$MPIRUN_PID" 2>/dev/null; then
    kill -TERM -- "$MPIRUN_PID" 2>/dev/null || true
    wait "$MPIRUN_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== baselines: $SIZE_GIB GiB in $WORK" >&2
# ckptd-bench measures the baselines (and memcpy) itself; fio, when installed and
# when it can use O_DIRECT there, replaces its raw disk numbers.
RAW_TOOL=ckptd-bench
BASE=$("$BIN/ckptd-bench" raw --dir "$WORK" --bytes "$BYTES" --files 2)
rm -f "$WORK"/raw.*
fio_gbps() {  # rw=write|read: GB/s over 2 jobs, O_DIRECT, 8 MiB blocks
  fio --name=raw --directory="$WORK" --rw="$1" --bs=8M --direct=1 --ioengine=psync --numjobs=2 \
    --size=$((BYTES / 2)) --end_fsync=1 --group_reporting --output-format=json 2> /dev/null |
    /usr/bin/python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(j['$1']['bw_bytes']/1e9)"
}
if command -v fio > /dev/null && RAW_WRITE=$(fio_gbps write) && RAW_READ=$(fio_gbps read); then
  RAW_TOOL=fio
  BASE=$(/usr/bin/python3 -c "import json,sys; j=json.loads(sys.argv[1]); j['raw_write_gbps']=$RAW_WRITE; j['raw_read_gbps']=$RAW_READ; print(json.dumps(j))" "$BASE")
fi
rm -f "$WORK"/raw.*

echo "== ckptd: 2 daemons, 4 trainers" >&2
"${MPIRUN[@]}" -np 2 "$BIN/ckptd" --root "$WORK/root" --socket "$SOCK" --commit-timeout 600s \
  > "$WORK/daemons.log" 2>&1 &
MPIRUN_PID=$!
CKPTD=$("${MPIRUN[@]}" -np 4 "$BIN/ckptd-bench" save --socket "$SOCK" --bytes "$BYTES" --daemons 2) || {
  cat "$WORK/daemons.log" >&2; exit 1; }
META="[]"
if [ "$METADATA" = 1 ]; then
  echo "== metadata: 1,000 / 10,000 / 100,000 tensors of 1 KiB" >&2
  META=$("$BIN/ckptd-bench" metadata --socket "$SOCK") || { cat "$WORK/daemons.log" >&2; exit 1; }
fi

/usr/bin/python3 - "$BASE" "$CKPTD" "$META" "$RAW_TOOL" "$JSON_OUT" <<'EOF'
import json, sys
base, ckptd, meta = (json.loads(a) for a in sys.argv[1:4])
tool, out_path = sys.argv[4], sys.argv[5]
r = dict(base, **ckptd)
gb = r["bytes"] / 1e9
r["memcpy_s"] = gb / r["memcpy_gbps"]
r["stall_vs_memcpy"] = r["stall_s"] / r["memcpy_s"]
r["save_vs_raw_write"] = r["save_gbps"] / r["raw_write_gbps"]
r["restore_vs_raw_read"] = r["restore_gbps"] / r["raw_read_gbps"]
r["reshard_restore_vs_raw_read"] = r["reshard_restore_gbps"] / r["raw_read_gbps"]
r["grpc_save_vs_shm_save"] = r["grpc_save_gbps"] / r["save_gbps"]
r["raw_tool"] = tool
r["metadata"] = meta
by_n = {m["tensors"]: m["total_s"] for m in meta}
if 10000 in by_n and 100000 in by_n:
    r["metadata_100k_vs_10k"] = by_n[100000] / by_n[10000]

def row(what, value, unit, baseline="", ratio=None, target=""):
    ratio_text = f"{ratio:.2f}x" if ratio is not None else ""
    print(f"| {what:<34} | {value:>8.3f} {unit:<4} | {baseline:<28} | {ratio_text:>6} | {target:<9} |")

print(f"\nckptd benchmark: {gb:.2f} GB, {r['trainers']} trainers, {r['daemons']} daemons; baselines by {tool}\n")
print("| measurement                        |         value | baseline (same run)          |  ratio | target    |")
print("|------------------------------------|---------------|------------------------------|--------|-----------|")
row("raw O_DIRECT write, 2 files", r["raw_write_gbps"], "GB/s")
row("raw O_DIRECT read, 2 files", r["raw_read_gbps"], "GB/s")
row("memcpy, same bytes", r["memcpy_s"], "s", f"{r['memcpy_gbps']:.1f} GB/s")
row("trainer stall (warm, shm)", r["stall_s"], "s", "memcpy time", r["stall_vs_memcpy"], "<= 1.5x")
row("trainer stall (first save)", r["cold_stall_s"], "s", "memcpy time", r["cold_stall_s"] / r["memcpy_s"])
row("save to durable (shm)", r["save_gbps"], "GB/s", "raw write", r["save_vs_raw_write"], ">= 0.9x")
row("save to durable (gRPC stream)", r["grpc_save_gbps"], "GB/s", "save over shm", r["grpc_save_vs_shm_save"])
row("restore (same cut)", r["restore_gbps"], "GB/s", "raw read", r["restore_vs_raw_read"], ">= 0.9x")
row("restore (first, cold segment)", r["cold_restore_gbps"], "GB/s", "raw read", r["cold_restore_gbps"] / r["raw_read_gbps"])
row("resharded restore (row halves)", r["reshard_restore_gbps"], "GB/s", "raw read", r["reshard_restore_vs_raw_read"], ">= 0.75x")
row("resharded (first, cold segment)", r["cold_reshard_restore_gbps"], "GB/s", "raw read", r["cold_reshard_restore_gbps"] / r["raw_read_gbps"])
for m in meta:
    row(f"{m['tensors']:,} x 1 KiB: save+commit+restore", m["total_s"], "s",
        f"save {m['save_s']:.2f} commit {m['commit_s']:.2f} restore {m['restore_s']:.2f}")
if "metadata_100k_vs_10k" in r:
    print(f"\n100,000 tensors cost {r['metadata_100k_vs_10k']:.1f}x what 10,000 cost (target <= 12x)")
if out_path:
    with open(out_path, "w") as f:
        json.dump(r, f, indent=1)
    print(f"wrote {out_path}")
EOF
