#!/usr/bin/python3
"""The disk's ceiling for scripts/bench.sh: the best of several fio configurations.

    bench_ceiling.py DIR BYTES [--quick]

Writes then reads min(BYTES, 256 MiB) in DIR with O_DIRECT and 8 MiB blocks, split
evenly over the jobs, for each of: psync with 1, 2 and 4 jobs; libaio and io_uring with queue depth 1,
4, 16 and 32 and 1, 2 and 4 jobs (--quick: queue depth 1 and 16, 1 and 2 jobs). Every
write ends with fdatasync (--end_fsync), as a checkpoint's must. Before each read the
page cache is dropped (sync; echo 3 > /proc/sys/vm/drop_caches) where this process may,
and the output says whether it could. The best configuration of each direction is
then measured again on all BYTES, and that is the ceiling reported. (The sweep is kept
small on purpose: virtual disks throttle after a burst, and writing BYTES for every
configuration, over 100 GiB for a 2 GiB run, left this machine's disk at a tenth of
its speed for the measurements that followed.)

Prints one JSON object: raw_write_gbps and raw_read_gbps (the best configuration of
each), raw_write_config and raw_read_config (which one won, e.g. "io_uring qd16 x2
jobs"), page_cache_dropped, and every configuration's figures under fio_configs.
Exits 3 (and prints nothing) when fio is missing or cannot use O_DIRECT in DIR.
"""

import glob
import json
import os
import shutil
import subprocess
import sys


def drop_page_cache():
    """True when the page cache was dropped (root); False where it is not permitted."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def fio(directory, rw, engine, iodepth, jobs, total):
    per_job = total // jobs // (8 << 20) * (8 << 20)
    args = ["fio", "--name=ceiling", f"--directory={directory}", f"--rw={rw}", "--bs=8M", "--direct=1",
            f"--ioengine={engine}", f"--iodepth={iodepth}", f"--numjobs={jobs}", f"--size={per_job}",
            "--group_reporting", "--output-format=json"]
    if rw == "write":
        args.append("--end_fsync=1")
    out = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"fio {' '.join(args[1:])}: {out.stderr.strip()[-500:]}")
    job = json.loads(out.stdout)["jobs"][0]
    return job[rw]["bw_bytes"] / 1e9


def configs(quick):
    depths, jobs = ((1, 16), (1, 2)) if quick else ((1, 4, 16, 32), (1, 2, 4))
    out = [("psync", 1, j) for j in jobs]
    for engine in ("libaio", "io_uring"):
        out += [(engine, d, j) for d in depths for j in jobs]
    return out


def name(engine, iodepth, jobs):
    return f"{engine} qd{iodepth} x{jobs} job{'s' if jobs > 1 else ''}"


def main():
    if len(sys.argv) < 3 or shutil.which("fio") is None:
        return 3
    directory, total, quick = sys.argv[1], int(sys.argv[2]), "--quick" in sys.argv[3:]
    sweep_bytes = min(total, 256 << 20)
    results, dropped = [], True

    def measure(engine, iodepth, jobs, nbytes):
        nonlocal dropped
        write = fio(directory, "write", engine, iodepth, jobs, nbytes)
        dropped = drop_page_cache() and dropped
        read = fio(directory, "read", engine, iodepth, jobs, nbytes)
        for path in glob.glob(os.path.join(directory, "ceiling.*")):
            os.unlink(path)
        return write, read

    try:
        for engine, iodepth, jobs in configs(quick):
            write, read = measure(engine, iodepth, jobs, sweep_bytes)
            results.append({"config": name(engine, iodepth, jobs), "engine": engine, "iodepth": iodepth,
                            "jobs": jobs, "write_gbps": write, "read_gbps": read})
        best_write = max(results, key=lambda r: r["write_gbps"])
        best_read = max(results, key=lambda r: r["read_gbps"])
        # The winners again, on all the bytes: the figures the ckptd runs are held to.
        write_gbps = measure(best_write["engine"], best_write["iodepth"], best_write["jobs"], total)[0]
        read_gbps = measure(best_read["engine"], best_read["iodepth"], best_read["jobs"], total)[1]
    except RuntimeError as e:
        print(f"bench_ceiling: {e}", file=sys.stderr)
        return 3
    print(json.dumps({"raw_write_gbps": write_gbps, "raw_write_config": best_write["config"],
                      "raw_read_gbps": read_gbps, "raw_read_config": best_read["config"],
                      "page_cache_dropped": dropped, "sweep_bytes": sweep_bytes, "fio_configs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
