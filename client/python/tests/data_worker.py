"""One trainer of the ckptd.data exactly-once test: joins a gloo group of WORLD
processes (a file store, no ports), then

  first:  consumes an uneven number of samples, writes their ids to OUT, saves its
          position with ckptd.torch at STEP, touches OUT.saved, and keeps consuming
          (the test kills it: what it reads after the save is not in the checkpoint);
  resume: loads the newest step and consumes until its share is exhausted, writing
          every id to OUT.

    data_worker.py first|resume shards|global RANK WORLD STORE ADDRESS RUN STEP OUT
"""

import json
import sys
import time

import torch
import torch.distributed as dist

import ckptd
import ckptd.data
import ckptd.torch

SHARD_SIZES = [7, 9, 11, 13, 8, 10, 12, 14, 6, 15]  # 105 samples in 10 shards
GLOBAL_SIZE = 101


def position(kind):
    if kind == "shards":
        return ckptd.data.ShardPositions(len(SHARD_SIZES), shard_sizes=SHARD_SIZES)
    return ckptd.data.GlobalPosition(GLOBAL_SIZE, seed=11)


def take(pos, kind, limit):
    """Up to `limit` sample ids (None: all that are left) of this trainer's share."""
    ids = []
    starts = [sum(SHARD_SIZES[:s]) for s in range(len(SHARD_SIZES))]
    while limit is None or len(ids) < limit:
        if kind == "global":
            index = pos.next()
            if index is None:
                break
            ids.append(index)
            continue
        progressed = False
        for shard in pos.owned():  # round robin over the owned shards
            index = pos.next(shard)
            if index is not None:
                ids.append(starts[shard] + index)
                progressed = True
                if limit is not None and len(ids) >= limit:
                    break
        if not progressed:
            break
    return ids


def main():
    phase, kind, rank, world, store, address, run, step, out = sys.argv[1:10]
    rank, world, step = int(rank), int(world), int(step)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    client = ckptd.Client(address)
    pos = position(kind)
    state = {"data": pos, "weights": torch.zeros(4)}
    if phase == "first":
        consumed = take(pos, kind, limit=9 + 3 * rank)  # uneven on purpose
        with open(out, "w") as f:
            json.dump(consumed, f)
        ckptd.torch.save(state, run, step, client=client)
        if rank == 0:
            ckptd.torch.wait(run, step, client=client)
        dist.barrier()
        open(out + ".saved", "w").close()
        while True:  # reading on after the save, until killed
            take(pos, kind, limit=1)
            time.sleep(0.01)
    ckptd.torch.load(state, run, client=client)
    with open(out, "w") as f:
        json.dump(take(pos, kind, limit=None), f)
    client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
