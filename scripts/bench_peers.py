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
  hdf5  parallel HDF5 (Debian's python3-h5py-mpi): one file, one dataset per tensor,
        each rank writes and then reads its row slab collectively (MPI-IO); the file is
        fsynced before the save counts as done.

Prints one JSON object from rank 0: for each peer, save_s, save_gbps, load_s, load_gbps
(the slowest rank's time, bytes over all ranks), page_cache_dropped and ranks; a peer
that cannot run here carries "error" instead. Each figure is the median of --repeat runs.

torch 1.13 (where DCP is torch.distributed._shard.checkpoint) cannot import it on Python 3.11: a dataclass in
torch/distributed/_shard/sharded_tensor/metadata.py has a mutable default. The module is
patched as it is imported, in this process only (an import hook below); the installed
files are never changed.
"""

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import statistics
import sys
import time

from mpi4py import MPI

from bench_ceiling import drop_page_cache

COMM = MPI.COMM_WORLD
RANK, RANKS = COMM.Get_rank(), COMM.Get_size()
TENSORS, COLS = 8, 1024
PATCHED = "torch.distributed._shard.sharded_tensor.metadata"


class MutableDefaultFix(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Loads PATCHED from its installed source with default=X() turned into
    default_factory=X, which is what the dataclass meant and Python 3.11 requires."""

    def find_spec(self, fullname, path, target=None):
        if fullname != PATCHED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname.rsplit(".", 1)[1], path)
        if spec is None:
            return None
        self.origin = spec.origin
        return importlib.util.spec_from_file_location(fullname, spec.origin, loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        with open(self.origin) as f:
            source = f.read()
        source = source.replace("field(default=TensorProperties())", "field(default_factory=TensorProperties)")
        exec(compile(source, self.origin, "exec"), module.__dict__)


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


def bench_dcp(directory, total_bytes, repeat):
    sys.meta_path.insert(0, MutableDefaultFix())
    import torch
    import torch.distributed as dist
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError:  # torch 1.13 ships DCP under its earlier name
        import torch.distributed._shard.checkpoint as dcp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(COMM.bcast(29500 + os.getpid() % 1000 if RANK == 0 else None)))
    dist.init_process_group("gloo", rank=RANK, world_size=RANKS)
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

    rows, mine = slab_rows(total_bytes)

    def row_sharded(local):  # this rank's rows of a [rows, COLS] tensor, as DCP shards it
        meta = ShardMetadata(shard_offsets=[RANK * mine, 0], shard_sizes=[mine, COLS], placement=f"rank:{RANK}/cpu")
        return init_from_local_shards([Shard(local, meta)], rows, COLS)

    saved = {f"layer{i}/kernel": row_sharded(torch.rand(mine, COLS)) for i in range(TENSORS)}
    into = {name: row_sharded(torch.zeros(mine, COLS)) for name in saved}
    local = lambda t: t.local_shards()[0].tensor
    saves, loads, dropped = [], [], True
    for run in range(repeat):
        path = os.path.join(directory, f"dcp-{run}")
        saves.append(timed(lambda: dcp.save_state_dict(saved, dcp.FileSystemWriter(path, sync_files=True))))
        if RANK == 0:
            dropped = drop_page_cache() and dropped
        loads.append(timed(lambda: dcp.load_state_dict(into, dcp.FileSystemReader(path))))
        if not all(torch.equal(local(saved[n]), local(into[n])) for n in saved):
            raise RuntimeError("DCP loaded other bytes than it saved")
    dist.destroy_process_group()
    return saves, loads, dropped, rows * COLS * 4 * TENSORS


def bench_hdf5(directory, total_bytes, repeat):
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
    return saves, loads, dropped, rows * COLS * 4 * TENSORS


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peers", default="dcp,hdf5")
    args = parser.parse_args()
    out = {}
    for peer in args.peers.split(","):
        work = os.path.join(args.dir, f"peer-{peer}")
        if RANK == 0:
            os.makedirs(work, exist_ok=True)
        COMM.Barrier()
        try:
            saves, loads, dropped, nbytes = {"dcp": bench_dcp, "hdf5": bench_hdf5}[peer](work, args.bytes, args.repeat)
            save_s, load_s = statistics.median(saves), statistics.median(loads)
            out[peer] = {"ranks": RANKS, "bytes": nbytes, "save_s": save_s, "save_gbps": nbytes / save_s / 1e9,
                         "load_s": load_s, "load_gbps": nbytes / load_s / 1e9, "page_cache_dropped": dropped,
                         "save_runs_s": saves, "load_runs_s": loads}
        except (ImportError, RuntimeError) as e:  # a peer that cannot run here is reported
            out[peer] = {"error": f"{type(e).__name__}: {e}"}
        COMM.Barrier()
        if RANK == 0:
            shutil.rmtree(work, ignore_errors=True)
    if RANK == 0:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
