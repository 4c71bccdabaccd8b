#!/usr/bin/python3
"""The disk's ceiling for scripts/bench.sh: the best of several fio configurations.

    bench_ceiling.py DIR BYTES [--quick]
    bench_ceiling.py DIR BYTES --write-only "io_uring qd16 x2 jobs"

Writes then reads min(BYTES, 256 MiB) in DIR with O_DIRECT and 8 MiB blocks, split
evenly over the jobs, for each of: psync with 1, 2 and 4 jobs; libaio and io_uring with queue depth 1,
4, 16 and 32 and 1, 2 and 4 jobs (--quick: queue depth 1 and 16, 1 and 2 jobs). Every
write ends with fdatasync, as a checkpoint's must, and its time counts: a write's figure
is the bytes over fio's write time plus the fdatasync of every file it wrote. (fio's own
bandwidth leaves out the time of --end_fsync. On a disk with a volatile write cache,
this VM's included, O_DIRECT writes complete into that cache and the flush at the end
takes the rest: here 0.8-1.2 s after 2 GiB written in 2 s.) Before each read the
page cache is dropped (sync; echo 3 > /proc/sys/vm/drop_caches) where this process may,
and the output says whether it could. The best configuration of each direction is
then measured again on all BYTES, and that is the ceiling reported. (The sweep is kept
small on purpose: virtual disks throttle after a burst, and writing BYTES for every
configuration, over 100 GiB for a 2 GiB run, left this machine's disk at a tenth of
its speed for the measurements that followed.)

Prints one JSON object: raw_write_gbps and raw_read_gbps (the best configuration of
each), raw_write_s and raw_write_fsync_s (that write's time in fio and in the flush),
raw_write_config and raw_read_config (which one won, e.g. "io_uring qd16 x2 jobs"),
page_cache_dropped, and every configuration's figures under fio_configs.
With --write-only, measures only that configuration's write (and flush) of BYTES and
prints raw_write_gbps, raw_write_s, raw_write_fsync_s and raw_write_config: bench.sh
runs it beside every ckptd run, because this disk's speed drifts within a run.
Exits 3 (and prints nothing) when fio is missing or cannot use O_DIRECT in DIR.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import time


def drop_page_cache():
    """True when the page cache was dropped (root); False where it is not permitted."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def fio_files(directory):
    """The files the fio jobs below write in directory."""
    return glob.glob(os.path.join(directory, "ceiling.*"))


def remove_fio_files(directory):
    for path in fio_files(directory):
        os.unlink(path)


def sync_files(directory):
    """Seconds to fdatasync every file fio wrote in directory (the write's flush)."""
    start = time.monotonic()
    for path in fio_files(directory):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
    return time.monotonic() - start


def fio(directory, rw, engine, iodepth, jobs, total):
    """{"gbps": GB/s, "bytes": ...}; a write's also carries write_s (fio's time) and
    fsync_s (the fdatasync after it), and its gbps is bytes over both."""
    per_job = total // jobs // (8 << 20) * (8 << 20)
    args = ["fio", "--name=ceiling", f"--directory={directory}", f"--rw={rw}", "--bs=8M", "--direct=1",
            f"--ioengine={engine}", f"--iodepth={iodepth}", f"--numjobs={jobs}", f"--size={per_job}",
            "--group_reporting", "--output-format=json"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"fio {' '.join(args[1:])}: {out.stderr.strip()[-500:]}")
    job = json.loads(out.stdout)["jobs"][0]
    bandwidth, nbytes = job[rw]["bw_bytes"], per_job * jobs
    if rw != "write":
        return {"gbps": bandwidth / 1e9, "bytes": nbytes}
    write_s, fsync_s = nbytes / bandwidth, sync_files(directory)
    return {"gbps": nbytes / (write_s + fsync_s) / 1e9, "bytes": nbytes, "write_s": write_s, "fsync_s": fsync_s}


def configs(quick):
    depths, jobs = ((1, 16), (1, 2)) if quick else ((1, 4, 16, 32), (1, 2, 4))
    out = [("psync", 1, j) for j in jobs]
    for engine in ("libaio", "io_uring"):
        out += [(engine, d, j) for d in depths for j in jobs]
    return out


def name(engine, iodepth, jobs):
    return f"{engine} qd{iodepth} x{jobs} job{'s' if jobs > 1 else ''}"


def parse_name(config):
    """(engine, iodepth, jobs) from a name() such as "io_uring qd16 x2 jobs"; ValueError if not one."""
    engine, depth, jobs = config.split()[:3]
    return engine, int(depth.removeprefix("qd")), int(jobs.removeprefix("x"))


def main():
    if len(sys.argv) < 3 or shutil.which("fio") is None:
        return 3
    directory, total, quick = sys.argv[1], int(sys.argv[2]), "--quick" in sys.argv[3:]
    if sys.argv[3:4] == ["--write-only"]:
        config = sys.argv[4] if len(sys.argv) > 4 else ""
        try:
            engine, iodepth, jobs = parse_name(config)
        except ValueError:
            print(f"bench_ceiling: --write-only takes a configuration like 'io_uring qd16 x2 jobs', not '{config}'",
                  file=sys.stderr)
            return 2
        try:
            write = fio(directory, "write", engine, iodepth, jobs, total)
        except RuntimeError as e:
            print(f"bench_ceiling: {e}", file=sys.stderr)
            return 3
        finally:
            remove_fio_files(directory)
        print(json.dumps({"raw_write_gbps": write["gbps"], "raw_write_s": write["write_s"],
                          "raw_write_fsync_s": write["fsync_s"], "raw_write_config": name(engine, iodepth, jobs)}))
        return 0
    sweep_bytes = min(total, 256 << 20)
    results, dropped = [], True

    def measure(engine, iodepth, jobs, nbytes):
        nonlocal dropped
        write = fio(directory, "write", engine, iodepth, jobs, nbytes)
        dropped = drop_page_cache() and dropped
        read = fio(directory, "read", engine, iodepth, jobs, nbytes)
        remove_fio_files(directory)
        return write, read

    try:
        for engine, iodepth, jobs in configs(quick):
            write, read = measure(engine, iodepth, jobs, sweep_bytes)
            results.append({"config": name(engine, iodepth, jobs), "engine": engine, "iodepth": iodepth,
                            "jobs": jobs, "write_gbps": write["gbps"], "write_bytes": write["bytes"],
                            "write_s": write["write_s"], "write_fsync_s": write["fsync_s"],
                            "read_gbps": read["gbps"]})
        best_write = max(results, key=lambda r: r["write_gbps"])
        best_read = max(results, key=lambda r: r["read_gbps"])
        # The winners again, on all the bytes: the figures the ckptd runs are held to.
        write = measure(best_write["engine"], best_write["iodepth"], best_write["jobs"], total)[0]
        read_gbps = measure(best_read["engine"], best_read["iodepth"], best_read["jobs"], total)[1]["gbps"]
    except RuntimeError as e:
        print(f"bench_ceiling: {e}", file=sys.stderr)
        return 3
    print(json.dumps({"raw_write_gbps": write["gbps"], "raw_write_config": best_write["config"],
                      "raw_write_s": write["write_s"], "raw_write_fsync_s": write["fsync_s"],
                      "raw_read_gbps": read_gbps, "raw_read_config": best_read["config"],
                      "page_cache_dropped": dropped, "sweep_bytes": sweep_bytes, "fio_configs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
