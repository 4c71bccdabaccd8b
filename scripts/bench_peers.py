#!/usr/bin/python3
"""The peers ckptd is compared with in scripts/bench.sh --peers, on the same bytes.

    mpirun -np R /usr/bin/python3 scripts/bench_peers.py --dir DIR --bytes B

Every rank holds its row slab of 8 float32 tensors of 1024 columns (B bytes over all
ranks), as ckptd-bench's trainers do, and each peer saves them durably and loads them
back from a cold page cache (dropped before each load where this process may):

  dcp   PyTorch Distributed Checkpoint (Debian's python3-torch): each tensor is a
        ShardedTensor split by rows over the ranks; save_state_dict with
        FileSystemWriter(sync_files=True), then load_state_dict into ShardedTensors of
        the same layout.
  dcp-ckptd  the same DCP calls with ckptd.torch.StorageWriter(durable=False) and
        StorageReader against the daemons of --ckptd-socket: blocked_s is how long
        save_state_dict holds the training loop (until every rank's bytes are staged),
        save_s adds the wait until the step is committed (durable); for plain DCP
        both are the same.
  hdf5  parallel HDF5 (Debian's python3-h5py-mpi): one file, one dataset per tensor,
        each rank writes and then reads its row slab collectively (MPI-IO); the file is
        fsynced before the save counts as done.

Prints one JSON object from rank 0: for each peer, save_s, save_gbps, load_s, load_gbps
(the slowest rank's time, bytes over all ranks), page_cache_dropped and ranks; a peer
that cannot run here carries "error" instead. Each figure is the median of --repeat runs.

torch 1.13 (where DCP is torch.distributed._shard.checkpoint) cannot import it on Python 3.11: a dataclass in
torch/distributed/_shard/sharded_tensor/metadata.py has a mutable default. import ckptd.torch (PYTHONPATH: the
build's python/) loads that module with the fix, in this process only; the installed files are never changed.
"""

import argparse
import json
import os
import shutil
import statistics
import time

from mpi4py import MPI

from bench_ceiling import drop_page_cache

COMM = MPI.COMM_WORLD
RANK, RANKS = COMM.Get_rank(), COMM.Get_size()
TENSORS, COLS = 8, 1024


def slowest(seconds):
    return COMM.allreduce(seconds, op=MPI.MAX)


def slab_rows(total_bytes):
    rows = total_bytes // TENSORS // (COLS * 4) // RANKS * RANKS
    return rows, rows // RANKS


def timed(fn):
    COMM.Barrier()
    start = time.perf_counter()
    fn()
    return slowest(time.perf_counter() - start)


def dcp_job():
    """torch.distributed over gloo and DCP's module, for the DCP peers."""
    import ckptd.torch  # noqa: F401 - first: it makes torch.distributed._shard importable here
    import torch.distributed as dist
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError:  # torch 1.13 ships DCP under its earlier name
        import torch.distributed._shard.checkpoint as dcp
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(COMM.bcast(29500 + os.getpid() % 1000 if RANK == 0 else None)))
        dist.init_process_group("gloo", rank=RANK, world_size=RANKS)
    return dcp


def run_dcp(total_bytes, repeat, save, wait, load):
    """save(state, run) / wait(run) / load(into, run) with ShardedTensors split by rows, as
    ckptd-bench's trainers hold them; (blocked, durable, load) seconds of each run."""
    import torch
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

    rows, mine = slab_rows(total_bytes)

    def row_sharded(local):  # this rank's rows of a [rows, COLS] tensor, as DCP shards it
        meta = ShardMetadata(shard_offsets=[RANK * mine, 0], shard_sizes=[mine, COLS], placement=f"rank:{RANK}/cpu")
        return init_from_local_shards([Shard(local, meta)], rows, COLS)

    saved = {f"layer{i}/kernel": row_sharded(torch.rand(mine, COLS)) for i in range(TENSORS)}
    into = {name: row_sharded(torch.zeros(mine, COLS)) for name in saved}
    local = lambda t: t.local_shards()[0].tensor
    blocked, saves, loads, dropped = [], [], [], True
    for run in range(repeat):
        COMM.Barrier()
        start = time.perf_counter()
        save(saved, run)
        blocked.append(slowest(time.perf_counter() - start))
        wait(run)
        saves.append(slowest(time.perf_counter() - start))
        if RANK == 0:
            dropped = drop_page_cache() and dropped
        loads.append(timed(lambda: load(into, run)))
        if not all(torch.equal(local(saved[n]), local(into[n])) for n in saved):
            raise RuntimeError("DCP loaded other bytes than it saved")
    return blocked, saves, loads, dropped, rows * COLS * 4 * TENSORS


def bench_dcp(directory, total_bytes, repeat, socket):
    dcp = dcp_job()
    path = lambda run: os.path.join(directory, f"dcp-{run}")
    return run_dcp(total_bytes, repeat,
                   lambda sd, run: dcp.save_state_dict(sd, dcp.FileSystemWriter(path(run), sync_files=True)),
                   lambda run: None,
                   lambda sd, run: dcp.load_state_dict(sd, dcp.FileSystemReader(path(run))))


def bench_dcp_ckptd(directory, total_bytes, repeat, socket):
    """DCP's calls, ckptd as its storage (the daemon of this rank's index on the socket)."""
    if not socket:
        raise RuntimeError("no --ckptd-socket: no daemons to save through")
    dcp = dcp_job()
    import ckptd
    import ckptd.torch
    client = ckptd.Client(socket.replace("{rank}", str(RANK)))
    try:
        return run_dcp(total_bytes, repeat,
                       lambda sd, run: dcp.save_state_dict(
                           sd, ckptd.torch.StorageWriter("dcp-bench", run, client=client, durable=False)),
                       lambda run: ckptd.torch.wait("dcp-bench", run, client=client),
                       lambda sd, run: dcp.load_state_dict(
                           sd, ckptd.torch.StorageReader("dcp-bench", run, client=client)))
    finally:
        client.close()


def bench_hdf5(directory, total_bytes, repeat, socket):
    import h5py
    import numpy as np

    rows, mine = slab_rows(total_bytes)
    first = RANK * mine
    rng = np.random.default_rng(RANK)
    slabs = [rng.random((mine, COLS), dtype=np.float32) for _ in range(TENSORS)]
    into = [np.zeros((mine, COLS), dtype=np.float32) for _ in range(TENSORS)]
    saves, loads, dropped = [], [], True
    for run in range(repeat):
        path = os.path.join(directory, f"hdf5-{run}.h5")

        def save():
            with h5py.File(path, "w", driver="mpio", comm=COMM) as f:
                for i, slab in enumerate(slabs):
                    dset = f.create_dataset(f"layer{i}/kernel", (rows, COLS), dtype=np.float32)
                    with dset.collective:
                        dset[first:first + mine] = slab
            if RANK == 0:  # durable, as the other savers' figures are
                fd = os.open(path, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)

        def load():
            with h5py.File(path, "r", driver="mpio", comm=COMM) as f:
                for i in range(TENSORS):
                    dset = f[f"layer{i}/kernel"]
                    with dset.collective:
                        dset.read_direct(into[i], np.s_[first:first + mine])

        saves.append(timed(save))
        if RANK == 0:
            dropped = drop_page_cache() and dropped
        loads.append(timed(load))
        if not all(np.array_equal(a, b) for a, b in zip(slabs, into)):
            raise RuntimeError("HDF5 read other bytes than it wrote")
    return saves, saves, loads, dropped, rows * COLS * 4 * TENSORS


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peers", default="dcp,dcp-ckptd,hdf5")
    parser.add_argument("--ckptd-socket", default="", help="the daemons dcp-ckptd saves through ({rank}: the rank's)")
    args = parser.parse_args()
    out = {}
    for peer in args.peers.split(","):
        work = os.path.join(args.dir, f"peer-{peer}")
        if RANK == 0:
            os.makedirs(work, exist_ok=True)
        COMM.Barrier()
        try:
            bench = {"dcp": bench_dcp, "dcp-ckptd": bench_dcp_ckptd, "hdf5": bench_hdf5}[peer]
            blocked, saves, loads, dropped, nbytes = bench(work, args.bytes, args.repeat, args.ckptd_socket)
            save_s, load_s = statistics.median(saves), statistics.median(loads)
            out[peer] = {"ranks": RANKS, "bytes": nbytes, "blocked_s": statistics.median(blocked),
                         "save_s": save_s, "save_gbps": nbytes / save_s / 1e9,
                         "load_s": load_s, "load_gbps": nbytes / load_s / 1e9, "page_cache_dropped": dropped,
                         "blocked_runs_s": blocked, "save_runs_s": saves, "load_runs_s": loads}
        except Exception as e:  # noqa: BLE001 - a peer that cannot run here is reported, not fatal
            out[peer] = {"error": f"{type(e).__name__}: {e}"}
        COMM.Barrier()
        if RANK == 0:
            shutil.rmtree(work, ignore_errors=True)
    if RANK == 0:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
