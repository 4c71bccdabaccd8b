#!/usr/bin/env bash
# Checks that scripts/bench.sh refuses a size its directory cannot hold, then runs it
# small (64 MiB, metadata with small counts is not run) on the binaries of this build
# and checks that its JSON has every key issue 4 asks for,
# each a positive number. As root it adds --hosts 2 and checks where the bytes went:
# with local storage a resharded restore brings half of each host's bytes from the
# other host, with a shared root too (read_once: each file is read by one daemon), but
# saves to a shared root send nothing across; with one replica, or parity over both
# hosts, a save sends each host's file.
set -euo pipefail
SRC="$1" BIN="$2"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
# A size the directory cannot hold is refused before anything runs or is written.
REFUSED=0
bash "$SRC/scripts/bench.sh" --size 1000000 --dir "$OUT" --binaries "$BIN" 2> "$OUT/refused.txt" || REFUSED=$?
if [ "$REFUSED" != 2 ] || ! grep -q "GiB free; --size 1000000 needs about" "$OUT/refused.txt" ||
  [ -n "$(ls -A "$OUT" | grep -v '^refused.txt$')" ]; then
  echo "bench_smoke: --size 1000000 was not refused up front (exit $REFUSED):" >&2
  cat "$OUT/refused.txt" >&2
  exit 1
fi
HOSTS=()
[ "$(id -u)" = 0 ] && HOSTS=(--hosts 2)
bash "$SRC/scripts/bench.sh" --size 0.0625 --no-metadata --dir "$OUT" --json "$OUT/bench.json" --binaries "$BIN" \
  "${HOSTS[@]}"
/usr/bin/python3 - "$OUT/bench.json" "${#HOSTS[@]}" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
if sys.argv[2] != "0":
    for mode in ("shared", "local"):
        m = r["hosts"][mode]
        bad = [k for k in ("save_gbps", "restore_gbps", "reshard_restore_gbps") if not m.get(k, 0) > 0]
        if bad:
            sys.exit(f"bench.json hosts.{mode}: missing or not positive: {bad}")
    # Each host's trainers want both row halves; a host holds one.
    half = r["hosts"]["local"]["bytes"] // 2
    got = r["hosts"]["local"]["net_per_host"]["reshard_restore"]["received"]
    if got < half:
        sys.exit(f"local storage: a host received {got} bytes in a resharded restore, expected >= {half}")
    # A shared root: saves send nothing across; restores (read_once) get the other
    # host's file from the daemon that reads it, as on local disks.
    shared = r["hosts"]["shared"]["net_per_host"]["save"]["received"]
    if shared > half // 8:
        sys.exit(f"shared root: a host received {shared} bytes in a save; data should not cross")
    shared = r["hosts"]["shared"]["net_per_host"]["reshard_restore"]["received"]
    if shared < half:
        sys.exit(f"shared root, read_once: a host received {shared} bytes in a resharded restore, expected >= {half}")
    # With one replica each host sends its whole data file (half the step) to the other.
    sent = r["hosts"]["replicas"]["net_per_host"]["save"]["sent"]
    if sent < half:
        sys.exit(f"1 replica: a host sent {sent} bytes in a save, expected >= {half}")
    if not r["hosts"]["replicas_host1_lost"].get("restore_gbps", 0) > 0:
        sys.exit("bench.json: no restore figure after host 1 lost its data file")
    # Parity on 2 hosts (G=2, P=1) is one segment per file: each host sends its whole
    # file to the other and stores the other's as parity, P/(G-P) = 1 of its data.
    sent = r["hosts"]["parity"]["net_per_host"]["save"]["sent"]
    if sent < half:
        sys.exit(f"parity: a host sent {sent} bytes in a save, expected >= {half}")
    overhead = r["redundancy"]["stored_overhead"]["parity"]
    if not 0.99 <= overhead <= 1.01:
        sys.exit(f"parity on 2 hosts stored {overhead:.3f}x the data beside it, expected 1.0")
    if not r["hosts"]["parity_host1_lost"].get("restore_gbps", 0) > 0:
        sys.exit("bench.json: no restore figure after host 1 lost its data and parity files")
    print("bench_smoke: hosts figures present; peer bytes as expected")
keys = ["bytes", "raw_write_gbps", "raw_read_gbps", "memcpy_gbps", "stall_s", "save_gbps", "restore_gbps",
        "reshard_restore_gbps", "grpc_save_gbps", "stall_vs_memcpy", "save_vs_raw_write", "restore_vs_raw_read",
        "reshard_restore_vs_raw_read", "grpc_save_vs_shm_save", "first_touch_memcpy_gbps",
        "stream_save_vs_plain_grpc", "stream_restore_vs_plain_grpc",
        "first_stall_vs_first_touch", "memory_tier_restore_gbps", "memory_tier_host_buffer_restore_gbps",
        "memory_tier_host_buffer_restore_vs_memcpy", "read_fresh_gbps", "read_prefaulted_gbps",
        "first_restore_vs_fresh_read", "restore_vs_prefaulted_read", "first_host_buffer_restore_vs_fresh_read",
        "python_first_restore_gbps", "python_restore_gbps", "python_first_restore_vs_fresh_read"]
bad = [k for k in keys if not isinstance(r.get(k), (int, float)) or r[k] <= 0]
# As root, on this host, the daemon writes the Python trainers' arrays itself.
if os.geteuid() == 0 and r.get("python_into_trainer_memory") is not True:
    bad.append("python_into_trainer_memory")
if bad:
    sys.exit(f"bench.json: missing or not positive: {bad}")
# The ceiling is the configuration that won fio's sweep, named and measured again.
if r["raw_tool"] == "fio":
    best = max(r["fio_configs"], key=lambda c: c["write_gbps"])
    if r["raw_write_config"] != best["config"]:
        sys.exit(f"bench.json: raw write {r['raw_write_config']} is not the sweep's best {best['config']}")
    if len({c["engine"] for c in r["fio_configs"]}) < 3:
        sys.exit("bench.json: the fio sweep did not try psync, libaio and io_uring")
    # Buffers in huge pages too, where they could be reserved (ckptd's own I/O uses them).
    in_huge = {c["huge_pages"] for c in r["fio_configs"]}
    if in_huge != ({False, True} if r["huge_pages"] else {False}):
        sys.exit(f"bench.json: huge_pages {r['huge_pages']} but the sweep's buffers were {in_huge}")
    # A write's figure counts its fdatasync, as save-to-durable counts the daemon's.
    for c in r["fio_configs"]:
        counted = c["write_bytes"] / (c["write_s"] + c["write_fsync_s"]) / 1e9
        if not c["write_fsync_s"] >= 0 or abs(c["write_gbps"] - counted) > 1e-9 * counted:
            sys.exit(f"bench.json: {c['config']} write {c['write_gbps']} GB/s leaves out its fdatasync")
    if not r["raw_write_fsync_s"] >= 0 or r["raw_write_s"] <= 0:
        sys.exit("bench.json: the ceiling's write carries no write and fdatasync times")
    # Every run's save is also held to the winning configuration's write just before it.
    for run in r["runs"]:
        if not run.get("raw_write_beside_gbps", 0) > 0 or not run.get("save_vs_raw_write_beside", 0) > 0:
            sys.exit("bench.json: a ckptd run without the write measured beside it")
# Every restore figure carries bytes read from storage beside bytes delivered.
for phase, times in (("restore", 1), ("reshard_restore", 2), ("dp_restore", r["trainers"])):
    x = r["restores"][phase]
    if x["delivered_bytes"] != times * r["bytes"] or not x["read_bytes"] > 0:
        sys.exit(f"bench.json restores.{phase}: read {x['read_bytes']}, delivered {x['delivered_bytes']}")
if r["bytes"] < (60 << 20):
    sys.exit(f"bench.json: bytes {r['bytes']} is not the 64 MiB asked for")
print("bench_smoke: every key present")
PY
