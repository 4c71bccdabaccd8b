#!/usr/bin/env bash
# End-to-end demo: 2 daemons under mpirun, 4 trainers (2 per daemon) save a ~256 MiB
# model (float32, bfloat16, int64; sharded and replicated tensors) for 3 steps, restore
# the newest in another partition, compare every byte, inspect and verify the result.
#   scripts/demo.sh [--root DIR] [--model-mib N]
# With --root the checkpoints stay in DIR; otherwise a temp directory is removed.
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT="" MODEL_MIB=256
while [ $# -gt 0 ]; do
  case "$1" in
    --root) ROOT="$2"; shift 2 ;;
    --model-mib) MODEL_MIB="$2"; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

bash scripts/build.sh > /dev/null

WORK="$(mktemp -d /tmp/ckptd-demo-XXXXXX)"
KEEP_ROOT=1
if [ -z "$ROOT" ]; then ROOT="$WORK/root"; KEEP_ROOT=0; fi
mkdir -p "$ROOT"
ROOT="$(cd "$ROOT" && pwd)"
SOCK="$WORK/sock/ckptd-{rank}.sock"
RUN="demo-$(date +%Y%m%d-%H%M%S)"
MPIRUN_PID=""

cleanup() {
  if [ -n "$MPIRUN_PID" ] && kill -0 "$MPIRUN_PID" 2>/dev/null; then
    kill -TERM -- "$MPIRUN_PID" 2>/dev/null || true
    wait "$MPIRUN_PID" 2>/dev/null || true
  fi
  if [ "$KEEP_ROOT" = 0 ]; then rm -rf "$WORK"; else rm -rf "$WORK/sock"; fi
}
trap cleanup EXIT

echo "== starting 2 daemons under mpirun (root $ROOT)"
mpirun --allow-run-as-root --oversubscribe -np 2 build/ckptd --config config/ckptd.yaml \
  --root "$ROOT" --socket "$SOCK" > "$WORK/daemons.log" 2>&1 &
MPIRUN_PID=$!

echo "== 4 trainers save $MODEL_MIB MiB x 3 steps, restore, compare"
PIDS=()
for t in 0 1 2 3; do
  build/ckptd-demo-trainer --address "$WORK/sock/ckptd-$((t / 2)).sock" --run "$RUN" \
    --trainer-id $t --trainer-count 4 --steps 3 --model-mib "$MODEL_MIB" > "$WORK/trainer-$t.json" &
  PIDS+=($!)
done
FAILED=0
for pid in "${PIDS[@]}"; do wait "$pid" || FAILED=1; done
if [ "$FAILED" != 0 ]; then
  echo "demo: a trainer failed; daemon log:" >&2
  cat "$WORK/daemons.log" >&2
  exit 1
fi

LATEST="$ROOT/$RUN"
echo "== ckptctl inspect $LATEST"
build/ckptctl inspect "$LATEST"
echo "== ckptctl verify"
build/ckptctl verify "$LATEST"

# Stop: SIGTERM to one daemon stops every rank together; mpirun then exits 0.
DAEMON_PID=$(build/ckptctl status --address "$WORK/sock/ckptd-0.sock" --json \
  | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["ranks"][j["asked_rank"]]["pid"])')
kill -TERM "$DAEMON_PID"
wait "$MPIRUN_PID"
MPIRUN_PID=""

/usr/bin/python3 - "$WORK" "$LATEST" <<'PY'
import glob, json, os, sys
work, run_dir = sys.argv[1], sys.argv[2]
trainers = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(work, "trainer-*.json")))]
step_dir = sorted(d for d in glob.glob(os.path.join(run_dir, "step-*")))[-1]
ckpt_bytes = sum(os.path.getsize(p) for p in glob.glob(os.path.join(step_dir, "ckpt.*")))
steps = trainers[0]["steps"]
save_s = max(t["save_s"] for t in trainers)
restore_s = max(t["restore_s"] for t in trainers)
restored = sum(t["bytes_restored"] for t in trainers)
stall = max(t["max_stall_s"] for t in trainers)
gb = 1e9
print()
print("== summary")
print(f"  checkpoint         {ckpt_bytes / 2**20:8.1f} MiB per step, {steps} steps committed, in {run_dir}")
print(f"  trainer stall      {stall:8.3f} s  (longest Save call: bytes handed to the daemon)")
print(f"  save to durable    {save_s:8.3f} s for {steps} steps = {ckpt_bytes * steps / save_s / gb:.2f} GB/s")
print(f"  restore            {restore_s:8.3f} s for {restored / 2**20:.1f} MiB (4 trainers, resharded) = {restored / restore_s / gb:.2f} GB/s")
print(f"  bytes compared     all equal: {all(t['bytes_equal'] for t in trainers)}")
PY
if [ "$KEEP_ROOT" = 0 ]; then echo "  (temp root removed; pass --root DIR to keep it)"; fi
