#!/usr/bin/env bash
# Runs scripts/bench.sh small (64 MiB, metadata with small counts is not run) on the
# binaries of this build and checks that its JSON has every key issue 4 asks for,
# each a positive number.
set -euo pipefail
SRC="$1" BIN="$2"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
bash "$SRC/scripts/bench.sh" --size 0.0625 --no-metadata --dir "$OUT" --json "$OUT/bench.json" --binaries "$BIN"
/usr/bin/python3 - "$OUT/bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
keys = ["bytes", "raw_write_gbps", "raw_read_gbps", "memcpy_gbps", "stall_s", "save_gbps", "restore_gbps",
        "reshard_restore_gbps", "grpc_save_gbps", "stall_vs_memcpy", "save_vs_raw_write", "restore_vs_raw_read",
        "reshard_restore_vs_raw_read", "grpc_save_vs_shm_save"]
bad = [k for k in keys if not isinstance(r.get(k), (int, float)) or r[k] <= 0]
if bad:
    sys.exit(f"bench.json: missing or not positive: {bad}")
if r["bytes"] < (60 << 20):
    sys.exit(f"bench.json: bytes {r['bytes']} is not the 64 MiB asked for")
print("bench_smoke: every key present")
PY
