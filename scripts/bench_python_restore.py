#!/usr/bin/python3
"""The Python client's restores in scripts/bench.sh: a process's first and its second.

    mpirun -np T /usr/bin/python3 scripts/bench_python_restore.py --socket TEMPLATE --bytes B --daemons D

Run beside daemons that hold the steps ckptd-bench saved (B bytes: 8 float32 tensors
of 1024 columns, trainer t of T holding row slab t of each): every trainer, in a
process of its own that has never restored, allocates its slabs and touches them (a
restarted trainer's model), then restores step 1 into them with RestoreSpec(out=...)
(its first restore) and step 2 the same way (the second). The page cache is dropped
before each where this process may. Prints one JSON object from rank 0:
python_first_restore_gbps and python_restore_gbps (bytes over all trainers over the
slowest trainer's time), python_into_trainer_memory (whether the daemon wrote the
arrays itself) and python_page_cache_dropped.
"""

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

import ckptd
from bench_ceiling import drop_page_cache

TENSORS, COLS = 8, 1024  # as ckptd-bench's model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True, help="socket path template, {rank} = the daemon's")
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--daemons", type=int, required=True)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, trainers = comm.Get_rank(), comm.Get_size()
    rows = args.bytes // TENSORS // (COLS * 4) // (2 * trainers) * (2 * trainers)
    slab = rows // trainers
    total = slab * COLS * 4 * TENSORS * trainers
    client = ckptd.Client(args.socket.replace("{rank}", str(rank * args.daemons // trainers)), timeout=60)
    model = [np.zeros((slab, COLS), np.float32) for _ in range(TENSORS)]  # touched: zeros writes them
    for a in model:
        a.fill(1.0)
    dropped = True
    into = True

    def restore(step: int) -> float:
        nonlocal dropped, into
        if rank == 0:
            dropped = drop_page_cache() and dropped
        comm.Barrier()
        start = time.perf_counter()
        out = client.restore("bench", step, {
            f"layer{i}/kernel": ckptd.RestoreSpec(start=[slab * rank, 0], length=[slab, COLS], out=model[i])
            for i in range(TENSORS)})
        seconds = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        into = comm.allreduce(out.into_trainer_memory, op=MPI.LAND) and into
        return seconds

    first = restore(1)
    second = restore(2)
    if rank == 0:
        print(json.dumps({"python_first_restore_gbps": total / 1e9 / first,
                          "python_restore_gbps": total / 1e9 / second,
                          "python_into_trainer_memory": into, "python_page_cache_dropped": dropped}))


if __name__ == "__main__":
    main()
