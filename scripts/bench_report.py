#!/usr/bin/env python3
"""The report of scripts/bench.sh, and the small JSON steps the script needs.

  bench_report.py report INPUTS.json [--json OUT]   the tables, from what bench.sh measured
  bench_report.py merge A.json B.json               A's keys updated with B's (as JSON text)
  bench_report.py beside RUN BESIDE                 a run's save held to the write beside it
  bench_report.py median RUN...                     each float the median of the runs
  bench_report.py get JSON KEY                      one key's value
  bench_report.py gib SIZE                          SIZE GiB in bytes

INPUTS.json holds one object: base (ckptd-bench raw and the fio ceiling), ckptd (the
median run), metadata, raw_tool, hosts (the multi-host runs, {} without --hosts),
host_count, memory (the memory-tier run), peers ({} without --peers), grpc and
segment_huge_pages. The report prints markdown tables with each figure beside its
baseline from the same run and its target; --json writes every number and ratio.
tests/bench/bench_report_test.py runs it on a saved input.
"""
import json
import statistics
import sys


def row(what, value, unit, baseline="", ratio=None, target=""):
    ratio_text = f"{ratio:.2f}x" if ratio is not None else ""
    print(f"| {what:<34} | {value:>8.3f} {unit:<4} | {baseline:<28} | {ratio_text:>6} | {target:<9} |")


def report(inputs):
    """Prints the report of one bench.sh run; returns every number and ratio."""
    base, ckptd, meta = inputs["base"], inputs["ckptd"], inputs["metadata"]
    tool = inputs["raw_tool"]
    multi, hosts = inputs["hosts"], inputs["host_count"]
    memory, peers, grpc = inputs["memory"], inputs["peers"], inputs["grpc"]
    r = dict(base, **ckptd)
    gb = r["bytes"] / 1e9
    r["memcpy_s"] = gb / r["memcpy_gbps"]
    r["stall_vs_memcpy"] = r["stall_s"] / r["memcpy_s"]
    r["save_vs_raw_write"] = r["save_gbps"] / r["raw_write_gbps"]
    r["restore_vs_raw_read"] = r["restore_gbps"] / r["raw_read_gbps"]
    r["reshard_restore_vs_raw_read"] = r["reshard_restore_gbps"] / r["raw_read_gbps"]
    r["grpc_save_vs_shm_save"] = r["grpc_save_gbps"] / r["save_gbps"]
    r["raw_tool"] = tool
    r["segment_huge_pages"] = int(inputs["segment_huge_pages"])
    r["metadata"] = meta
    by_n = {m["tensors"]: m["total_s"] for m in meta}
    if 10000 in by_n and 100000 in by_n:
        r["metadata_100k_vs_10k"] = by_n[100000] / by_n[10000]

    first_restore_section(r)
    segments = (f"trainer segments in huge pages (up to {r['segment_huge_pages']} of 2 MiB, on demand)"
                if r["segment_huge_pages"] else "trainer segments in ordinary pages")
    print(f"\nckptd benchmark: {gb:.2f} GB, {r['trainers']} trainers, {r['daemons']} daemons; baselines by {tool}; "
          f"{segments}\n")
    print("| measurement                        |         value | baseline (same run)          |  ratio | target    |")
    print("|------------------------------------|---------------|------------------------------|--------|-----------|")
    row("raw write + fdatasync (ceiling)", r["raw_write_gbps"], "GB/s", r.get("raw_write_config", "ckptd-bench, qd1 x2 files"))
    row("raw O_DIRECT read (ceiling, cold)", r["raw_read_gbps"], "GB/s", r.get("raw_read_config", "ckptd-bench, qd1 x2 files"))
    if "read_prefaulted_gbps" in r:
        row("read ceiling: pre-faulted memory", r["read_prefaulted_gbps"], "GB/s",
            f"O_DIRECT, distinct, {r['read_prefaulted_threads']} threads")
        row("read ceiling: fresh memory", r["read_fresh_gbps"], "GB/s",
            f"O_DIRECT, distinct, {r['read_fresh_threads']} threads")
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
    if "restore_vs_prefaulted_read" in r:
        row("restore (same cut, warm process)", r["restore_gbps"], "GB/s", "read ceiling, pre-faulted",
            r["restore_vs_prefaulted_read"], ">= 0.9x")
        row("restore (a process's first)", r["cold_restore_gbps"], "GB/s", "read ceiling, fresh",
            r["first_restore_vs_fresh_read"], ">= 0.9x")
    else:  # inputs from before the distinct-memory ceilings
        row("restore (same cut, cold)", r["restore_gbps"], "GB/s", "raw read", r["restore_vs_raw_read"], ">= 0.9x")
        row("restore (a process's first)", r["cold_restore_gbps"], "GB/s", "raw read",
            r["cold_restore_gbps"] / r["raw_read_gbps"])
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
        peers_section(r, peers)
    if multi:
        hosts_section(r, multi, hosts)
    return r


def first_restore_section(r):
    """What a restarted job waits for, first: a process's first restore into the memory
    it holds, against an O_DIRECT read of the same bytes into fresh memory; then a warm
    process's, against the same read into pre-faulted memory."""
    if "read_fresh_gbps" not in r:
        return
    fresh, warm = r["read_fresh_gbps"], r["read_prefaulted_gbps"]
    r["first_restore_vs_fresh_read"] = r["cold_restore_gbps"] / fresh
    r["restore_vs_prefaulted_read"] = r["restore_gbps"] / warm
    r["first_host_buffer_restore_vs_fresh_read"] = r["cold_host_buffer_restore_gbps"] / fresh
    print(f"\nthe restore a restarted trainer waits for: its process's first, into memory it holds "
          f"(read ceilings: the same bytes read with O_DIRECT into distinct memory, fresh {fresh:.3f} GB/s "
          f"with {r['read_fresh_threads']} threads, pre-faulted {warm:.3f} GB/s with "
          f"{r['read_prefaulted_threads']})\n")
    print("| restore                                  |  GB/s   | baseline                 |  ratio | target  |")
    print("|------------------------------------------|---------|--------------------------|--------|---------|")

    def line(what, gbps, baseline, ratio, target):
        print(f"| {what:<40} | {gbps:7.3f} | {baseline:<24} | {ratio:5.2f}x | {target:<7} |")

    line("first, C++ client (plain buffers)", r["cold_restore_gbps"], "fresh read",
         r["first_restore_vs_fresh_read"], ">= 0.9x")
    if "python_first_restore_gbps" in r:
        r["python_first_restore_vs_fresh_read"] = r["python_first_restore_gbps"] / fresh
        line("first, Python client (numpy, out=)", r["python_first_restore_gbps"], "fresh read",
             r["python_first_restore_vs_fresh_read"], ">= 0.9x")
    line("first into HostBuffers", r["cold_host_buffer_restore_gbps"], "fresh read",
         r["first_host_buffer_restore_vs_fresh_read"], ">= 0.9x")
    line("warm process, C++ client", r["restore_gbps"], "pre-faulted read", r["restore_vs_prefaulted_read"],
         ">= 0.9x")
    if "python_restore_gbps" in r:
        line("warm process, Python client", r["python_restore_gbps"], "pre-faulted read",
             r["python_restore_gbps"] / warm, "")
    if "python_into_trainer_memory" in r:
        print(f"\nthe daemon wrote the Python trainers' arrays itself: "
              f"{'yes' if r['python_into_trainer_memory'] else 'no (through the segment)'}")


def peers_section(r, peers):
    """PyTorch DCP and parallel HDF5 on the same bytes, and ckptd's ratios to them."""
    r["peers"] = peers
    print(f"\npeers on the same bytes, {r['daemons']} ranks, page cache dropped before each load "
          f"(median of {len(r.get('runs', [])) or 1}; ratio = ckptd / peer)\n")
    print("| peer                 | save GB/s | ckptd save / peer | load GB/s | first restore / peer |")
    print("|----------------------|-----------|-------------------|-----------|----------------------|")
    names = {"dcp": "PyTorch DCP", "hdf5": "parallel HDF5"}
    through = peers.get("dcp-ckptd")  # ckptd itself, under DCP's calls: not a peer
    peers = {k: v for k, v in peers.items() if k != "dcp-ckptd"}
    for key, peer in peers.items():
        if "error" in peer:
            print(f"| {names.get(key, key):<20} | could not run: {peer['error'][:120]}")
            continue
        peer["ckptd_save_ratio"] = r["save_gbps"] / peer["save_gbps"]
        # A peer's load runs in a fresh process: held to ckptd's first restore.
        peer["ckptd_restore_ratio"] = r["cold_restore_gbps"] / peer["load_gbps"]
        print(f"| {names.get(key, key):<20} | {peer['save_gbps']:9.3f} | {peer['ckptd_save_ratio']:16.2f}x | "
              f"{peer['load_gbps']:9.3f} | {peer['ckptd_restore_ratio']:19.2f}x |")
    loads = [p["load_gbps"] for p in peers.values() if "error" not in p]
    if loads:
        r["restore_vs_fastest_peer"] = r["cold_restore_gbps"] / max(loads)
        print(f"\na process's first restore is {r['restore_vs_fastest_peer']:.2f}x the faster peer's cold load "
              f"(target >= 1.2x)")
    if through is not None:
        dcp_section(r, peers.get("dcp"), through)


def dcp_section(r, files, through):
    """DCP's own calls on its FileSystemWriter and on ckptd: the loop's stall, durable,
    cold load."""
    r["dcp_through_ckptd"] = through
    print("\nPyTorch DCP's save_state_dict / load_state_dict: on files, and with ckptd as its storage "
          "(seconds; page cache dropped before each load)\n")
    print("| storage                  | save blocks the loop | save to durable | load      |")
    print("|--------------------------|----------------------|-----------------|-----------|")
    for name, x in [("FileSystemWriter (fsync)", files), ("ckptd.torch", through)]:
        if x is None:
            continue
        if "error" in x:
            print(f"| {name:<24} | could not run: {x['error'][:120]}")
            continue
        print(f"| {name:<24} | {x['blocked_s']:20.3f} | {x['save_s']:15.3f} | {x['load_s']:9.3f} |")
    if files and through and "error" not in files and "error" not in through:
        through["blocked_vs_files"] = through["blocked_s"] / files["blocked_s"]
        print(f"\nwith ckptd, save_state_dict holds the loop {through['blocked_vs_files']:.2f}x as long as on files")


def hosts_section(r, multi, hosts):
    """The simulated hosts' runs: storage modes, read amplification, network bytes."""
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
    if "parity" in multi:
        redundancy_section(r, multi, hosts)


def redundancy_section(r, multi, hosts):
    """Local storage with no redundancy, 1 replica and parity (P=1, one group of every
    host): what a save costs, what it stores and sends, and a restore after host 1 lost
    its files, each against the issue's targets."""
    parity = 1
    stored = {m: multi[f"stored_{m}"] for m in ("local", "replicas", "parity")}
    overhead = {m: s["redundant"] / s["data"] for m, s in stored.items()}
    r["redundancy"] = {
        "stored_overhead": overhead,
        "parity_overhead_target": parity / hosts,
        "parity_overhead_least": parity / (hosts - parity),
        "parity_save_vs_replica": multi["parity"]["save_gbps"] / multi["replicas"]["save_gbps"],
        "parity_rebuild_vs_restore": multi["parity_host1_lost"]["restore_gbps"] / multi["parity"]["restore_gbps"],
        "replica_lost_vs_restore": multi["replicas_host1_lost"]["restore_gbps"] / multi["replicas"]["restore_gbps"],
    }
    x = r["redundancy"]
    print(f"\nredundancy on {hosts} hosts, local storage (parity: one group of {hosts}, P={parity})\n")
    print("| measurement                          |     none |  1 replica |   parity | target (parity)                  |")
    print("|--------------------------------------|----------|------------|----------|----------------------------------|")
    def row(what, values, target=""):
        print(f"| {what:<36} | " + " | ".join(values) + f" | {target:<32} |")
    row("save to durable, GB/s", [f"{multi[m]['save_gbps']:8.3f}" for m in ("local",)]
        + [f"{multi['replicas']['save_gbps']:10.3f}", f"{multi['parity']['save_gbps']:8.3f}"],
        f">= 0.8x replica: {x['parity_save_vs_replica']:.2f}x")
    row("bytes stored beyond the data, x", [f"{overhead['local']:8.3f}", f"{overhead['replicas']:10.3f}",
                                            f"{overhead['parity']:8.3f}"],
        f"P/G {x['parity_overhead_target']:.3f}; least P/(G-P) {x['parity_overhead_least']:.3f}")
    row("MB sent per host in a save", [f"{multi[m]['net_per_host']['save']['sent'] / 1e6:8.1f}" for m in ("local",)]
        + [f"{multi['replicas']['net_per_host']['save']['sent'] / 1e6:10.1f}",
           f"{multi['parity']['net_per_host']['save']['sent'] / 1e6:8.1f}"])
    row("restore (same cut), GB/s", [f"{multi['local']['restore_gbps']:8.3f}", f"{multi['replicas']['restore_gbps']:10.3f}",
                                     f"{multi['parity']['restore_gbps']:8.3f}"])
    row("restore, host 1's files lost, GB/s", ["       -", f"{multi['replicas_host1_lost']['restore_gbps']:10.3f}",
                                               f"{multi['parity_host1_lost']['restore_gbps']:8.3f}"],
        f">= 0.5x restore: {x['parity_rebuild_vs_restore']:.2f}x")


def median_of_runs(runs):
    """The last run with each float replaced by the median over the runs; the runs kept."""
    out = dict(runs[-1])
    for key, value in runs[-1].items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in runs)
    out["runs"] = runs
    return out


def held_to_beside(run, beside):
    """A run's save beside the raw write measured just before it (the disk drifts)."""
    if beside:
        run["raw_write_beside_gbps"] = beside["raw_write_gbps"]
        run["raw_write_beside_fsync_s"] = beside["raw_write_fsync_s"]
        run["save_vs_raw_write_beside"] = run["save_gbps"] / beside["raw_write_gbps"]
    return run


def main(argv):
    command, args = argv[1], argv[2:]
    if command == "report":
        with open(args[0]) as f:
            r = report(json.load(f))
        if len(args) == 3 and args[1] == "--json" and args[2]:
            with open(args[2], "w") as f:
                json.dump(r, f, indent=1)
            print(f"wrote {args[2]}")
    elif command == "merge":
        merged = json.loads(args[0])
        merged.update(json.loads(args[1]))
        print(json.dumps(merged))
    elif command == "beside":
        print(json.dumps(held_to_beside(json.loads(args[0]), json.loads(args[1]))))
    elif command == "median":
        print(json.dumps(median_of_runs([json.loads(a) for a in args])))
    elif command == "get":
        print(json.loads(args[0])[args[1]])
    elif command == "gib":
        print(int(float(args[0]) * (1 << 30)))
    else:
        print(f"bench_report.py: unknown command {command}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
