"""One trainer process of the ckptd.torch tests: joins a gloo group of WORLD processes
(a file store, no ports), builds a state_dict, then saves it or loads into it.

    torch_worker.py save|load RANK WORLD STORE_FILE ADDRESS RUN STEP OUT_JSON

save: the model of seed 7, a ShardedTensor "emb" (12 x 4, arange) chunked by rows over
the world, a PerRank tensor holding the rank, and an int, float, string and None. load:
the same structure over this world, zeroed, filled by ckptd.torch.load; OUT_JSON gets
what this trainer found, for the test to compare.
"""

import json
import sys

import torch
import torch.distributed as dist

import ckptd
import ckptd.torch  # noqa: F401 - installs the ShardedTensor import fix before _shard is imported

from torch.distributed._shard import sharded_tensor  # noqa: E402
from torch.distributed._shard.sharding_spec import ChunkShardingSpec  # noqa: E402

ROWS, COLS = 12, 4


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def embedding(world, fill):
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
    st = sharded_tensor.empty(spec, ROWS, COLS)
    for shard in st.local_shards():
        start = shard.metadata.shard_offsets[0]
        rows = shard.metadata.shard_sizes[0]
        values = torch.arange(start * COLS, (start + rows) * COLS, dtype=torch.float32).reshape(rows, COLS)
        shard.tensor.copy_(values if fill else torch.zeros_like(values))
    return st


def dcp(mode, rank, world, client, run, step, out):
    """DCP's own save_state_dict / load_state_dict, ckptd as the storage."""
    from torch.distributed._shard.checkpoint import load_state_dict, save_state_dict
    saving = mode == "dcp-save"
    state = {"emb": embedding(world, fill=saving), "w": torch.arange(6.0) if saving else torch.zeros(6),
             "meta": {"epoch": 5 if saving else 0}}
    if saving:
        save_state_dict(state, storage_writer=ckptd.torch.StorageWriter(run, step, client=client))
        return
    load_state_dict(state, storage_reader=ckptd.torch.StorageReader(run, client=client))
    shards = state["emb"].local_shards()
    with open(out, "w") as f:
        json.dump({"emb_rows": [[int(s.metadata.shard_offsets[0]), int(s.metadata.shard_sizes[0])] for s in shards],
                   "emb_equal": all(torch.equal(s.tensor, torch.arange(
                       s.metadata.shard_offsets[0] * COLS, (s.metadata.shard_offsets[0] + s.metadata.shard_sizes[0]) *
                       COLS, dtype=torch.float32).reshape(-1, COLS)) for s in shards),
                   "w": state["w"].tolist(), "meta": state["meta"]}, f)


def main():
    mode, rank, world, store, address, run, step, out = sys.argv[1:9]
    rank, world, step = int(rank), int(world), int(step)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    client = ckptd.Client(address)
    if mode.startswith("dcp-"):
        dcp(mode, rank, world, client, run, step, out)
        client.close()
        dist.destroy_process_group()
        return
    saving = mode == "save"
    net = model(7 if saving else 99)
    state = {
        "model": net.state_dict(),
        "emb": embedding(world, fill=saving),
        "mine": ckptd.torch.PerRank(torch.full((2,), float(rank) if saving else -1.0)),
        "meta": {"epoch": 5 if saving else 0, "lr": 0.25 if saving else 0.0, "tag": "a" if saving else "",
                 "nothing": None},
    }
    if saving:
        ckptd.torch.save(state, run, step, client=client)
        if rank == 0:
            ckptd.torch.wait(run, step, client=client)
        dist.barrier()
    else:
        strict = "--not-strict" not in sys.argv
        restored = ckptd.torch.load(state, run, client=client, strict=strict)
        expected = model(7).state_dict()
        shards = state["emb"].local_shards()
        found = {
            "step": restored,
            "model_equal": all(torch.equal(state["model"][k], expected[k]) for k in expected),
            "emb_rows": [[int(s.metadata.shard_offsets[0]), int(s.metadata.shard_sizes[0])] for s in shards],
            "emb_equal": all(
                torch.equal(s.tensor, torch.arange(s.metadata.shard_offsets[0] * COLS,
                                                   (s.metadata.shard_offsets[0] + s.metadata.shard_sizes[0]) * COLS,
                                                   dtype=torch.float32).reshape(-1, COLS)) for s in shards),
            "mine": state["mine"].tensor.tolist(),
            "meta": state["meta"],
        }
        with open(out, "w") as f:
            json.dump(found, f)
    client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
