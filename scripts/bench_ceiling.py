#!/usr/bin/python3
"""The disk's ceiling for scripts/bench.sh: the best of several fio configurations.

    bench_ceiling.py DIR BYTES [--quick]
    bench_ceiling.py DIR BYTES --write-only "io_uring qd16 x2 jobs"

Writes then reads min(BYTES, 256 MiB) in DIR with O_DIRECT and 8 MiB blocks, split
evenly over the jobs, for each of: psync with 1, 2 and 4 jobs; libaio and io_uring with queue depth 1,
4, 16 and 32 and 1, 2 and 4 jobs (--quick: queue depth 1 and 16, 1 and 2 jobs), from
buffers in huge pages (--iomem=shmhuge), and the quick set again from fio's ordinary
buffers. The huge pages matter on a virtual disk: a request is built from the
physical runs of pages behind its buffer, and whole 2 MiB pages let the disk take
4 MiB requests; ckptd's own O_DIRECT I/O goes through huge pages for that reason, so
its baseline must too. Where huge pages cannot be reserved (not root, or no memory for
them), the whole sweep runs from ordinary buffers and the output says so. Every
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
raw_write_config and raw_read_config (which one won, e.g. "io_uring qd16 x2 jobs" or
"io_uring qd16 x2 jobs, huge pages"), page_cache_dropped, huge_pages (whether the
configurations in huge pages ran), and every configuration's figures under fio_configs.
With --write-only, measures only that configuration's write (and flush) of BYTES and
prints raw_write_gbps, raw_write_s, raw_write_fsync_s and raw_write_config: bench.sh
runs it beside every ckptd run, because this disk's speed drifts within a run.
Exits 3 (and prints nothing) when fio is missing or cannot use O_DIRECT in DIR.
"""

import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HUGE_PAGES = "/proc/sys/vm/nr_hugepages"
HUGE_SUFFIX = ", huge pages"
BLOCK = 8 << 20


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


def huge_pages_free():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("HugePages_Free:"):
                return int(line.split()[1])
    return 0


@contextlib.contextmanager
def huge_pages(count):
    """Yields True with at least `count` free huge pages reserved (root), False where
    they cannot be; where it raised the system's reservation, it puts it back after."""
    try:
        with open(HUGE_PAGES) as f:
            before = int(f.read())
    except (OSError, ValueError):
        yield False
        return
    raised = False
    try:
        if huge_pages_free() < count:
            raised = True
            with open(HUGE_PAGES, "w") as f:
                f.write(f"{before + count}\n")
        reserved = huge_pages_free() >= count
    except OSError:
        reserved = False
    try:
        yield reserved
    finally:
        if raised:
            try:
                with open(HUGE_PAGES, "w") as f:
                    f.write(f"{before}\n")
            except OSError:
                pass


def huge_pages_needed(iodepth, jobs):
    """2 MiB pages for every job's buffers, with one block of slack each."""
    return jobs * (iodepth + 1) * BLOCK // (2 << 20)


def fio(directory, rw, engine, iodepth, jobs, total, huge=False):
    """{"gbps": GB/s, "bytes": ...}; a write's also carries write_s (fio's time) and
    fsync_s (the fdatasync after it), and its gbps is bytes over both."""
    per_job = total // jobs // BLOCK * BLOCK
    args = ["fio", "--name=ceiling", f"--directory={directory}", f"--rw={rw}", f"--bs={BLOCK}", "--direct=1",
            f"--ioengine={engine}", f"--iodepth={iodepth}", f"--numjobs={jobs}", f"--size={per_job}",
            "--group_reporting", "--output-format=json"] + (["--iomem=shmhuge"] if huge else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"fio {' '.join(args[1:])}: {out.stderr.strip()[-500:]}")
    job = json.loads(out.stdout)["jobs"][0]
    bandwidth, nbytes = job[rw]["bw_bytes"], per_job * jobs
    if rw != "write":
        return {"gbps": bandwidth / 1e9, "bytes": nbytes}
    write_s, fsync_s = nbytes / bandwidth, sync_files(directory)
    return {"gbps": nbytes / (write_s + fsync_s) / 1e9, "bytes": nbytes, "write_s": write_s, "fsync_s": fsync_s}


def configs(quick, huge):
    """(engine, iodepth, jobs, in huge pages) to sweep. With huge pages, ordinary buffers
    get the quick set only, which keeps the bytes written near a sweep without them."""
    def of(quick):
        depths, jobs = ((1, 16), (1, 2)) if quick else ((1, 4, 16, 32), (1, 2, 4))
        out = [("psync", 1, j) for j in jobs]
        for engine in ("libaio", "io_uring"):
            out += [(engine, d, j) for d in depths for j in jobs]
        return out
    if not huge:
        return [(e, d, j, False) for e, d, j in of(quick)]
    return [(e, d, j, False) for e, d, j in of(True)] + [(e, d, j, True) for e, d, j in of(quick)]


def name(engine, iodepth, jobs, huge):
    return f"{engine} qd{iodepth} x{jobs} job{'s' if jobs > 1 else ''}{HUGE_SUFFIX if huge else ''}"


def parse_name(config):
    """(engine, iodepth, jobs, huge) from a name() such as "io_uring qd16 x2 jobs" or
    "io_uring qd16 x2 jobs, huge pages"; ValueError if not one."""
    huge = config.endswith(HUGE_SUFFIX)
    engine, depth, jobs = config.removesuffix(HUGE_SUFFIX).split()[:3]
    return engine, int(depth.removeprefix("qd")), int(jobs.removeprefix("x")), huge


def main():
    if len(sys.argv) < 3 or shutil.which("fio") is None:
        return 3
    directory, total, quick = sys.argv[1], int(sys.argv[2]), "--quick" in sys.argv[3:]
    if sys.argv[3:4] == ["--write-only"]:
        config = sys.argv[4] if len(sys.argv) > 4 else ""
        try:
            engine, iodepth, jobs, huge = parse_name(config)
        except ValueError:
            print(f"bench_ceiling: --write-only takes a configuration like 'io_uring qd16 x2 jobs', not '{config}'",
                  file=sys.stderr)
            return 2
        try:
            with huge_pages(huge_pages_needed(iodepth, jobs) if huge else 0) as reserved:
                if huge and not reserved:
                    raise RuntimeError(f"cannot reserve the huge pages '{config}' needs")
                write = fio(directory, "write", engine, iodepth, jobs, total, huge)
        except RuntimeError as e:
            print(f"bench_ceiling: {e}", file=sys.stderr)
            return 3
        finally:
            remove_fio_files(directory)
        print(json.dumps({"raw_write_gbps": write["gbps"], "raw_write_s": write["write_s"],
                          "raw_write_fsync_s": write["fsync_s"],
                          "raw_write_config": name(engine, iodepth, jobs, huge)}))
        return 0
    sweep_bytes = min(total, 256 << 20)
    results, dropped = [], True

    def measure(engine, iodepth, jobs, huge, nbytes):
        nonlocal dropped
        write = fio(directory, "write", engine, iodepth, jobs, nbytes, huge)
        dropped = drop_page_cache() and dropped
        read = fio(directory, "read", engine, iodepth, jobs, nbytes, huge)
        remove_fio_files(directory)
        return write, read

    # Enough huge pages for the deepest configuration, reserved for the whole sweep.
    most = max(huge_pages_needed(d, j) for _, d, j, _ in configs(quick, False))
    try:
        with huge_pages(most) as huge:
            for engine, iodepth, jobs, in_huge in configs(quick, huge):
                write, read = measure(engine, iodepth, jobs, in_huge, sweep_bytes)
                results.append({"config": name(engine, iodepth, jobs, in_huge), "engine": engine,
                                "iodepth": iodepth, "jobs": jobs, "huge_pages": in_huge,
                                "write_gbps": write["gbps"], "write_bytes": write["bytes"],
                                "write_s": write["write_s"], "write_fsync_s": write["fsync_s"],
                                "read_gbps": read["gbps"]})
            best_write = max(results, key=lambda r: r["write_gbps"])
            best_read = max(results, key=lambda r: r["read_gbps"])
            # The winners again, on all the bytes: the figures the ckptd runs are held to.
            write = measure(*(best_write[k] for k in ("engine", "iodepth", "jobs", "huge_pages")), total)[0]
            read_gbps = measure(*(best_read[k] for k in ("engine", "iodepth", "jobs", "huge_pages")), total)[1]["gbps"]
    except RuntimeError as e:
        print(f"bench_ceiling: {e}", file=sys.stderr)
        return 3
    print(json.dumps({"raw_write_gbps": write["gbps"], "raw_write_config": best_write["config"],
                      "raw_write_s": write["write_s"], "raw_write_fsync_s": write["fsync_s"],
                      "raw_read_gbps": read_gbps, "raw_read_config": best_read["config"],
                      "page_cache_dropped": dropped, "huge_pages": huge, "sweep_bytes": sweep_bytes,
                      "fio_configs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
