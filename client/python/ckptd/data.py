"""Input-pipeline positions that survive a change of world size (TensorFlow DTensor's
distributed iterator, for any data loader).

Put a position in the state_dict that ckptd.torch saves; after a load, on any number of
trainers, every sample not consumed before the save is read exactly once more, and
none consumed before it is read again.

Two kinds of position:

    # A dataset split into S files or shards (S fixed for the run); trainer r reads the
    # shards it owns (shard s belongs to trainer s mod N, or to owner(s, N)) in order.
    pos = ckptd.data.ShardPositions(num_shards=64)
    for shard in pos.owned():
        index = pos.next(shard)             # the next sample of that shard, or None at its end

    # DistributedSampler-style: one global order (a permutation of seed + epoch), and
    # trainer r takes every N-th sample of it.
    pos = ckptd.data.GlobalPosition(dataset_size=len(ds), seed=0)
    index = pos.next()                      # a global sample index, or None when the epoch ends

    state = {"model": model.state_dict(), "data": pos}
    ckptd.torch.save(state, run, step)       # each trainer's position goes with the step
    ckptd.torch.load(state, run)             # on N' trainers: each gets what it now owns

What is saved: each trainer's row of a [world, width] int64 tensor (ShardPositions:
the position in each shard it owns, -1 in the others; GlobalPosition: how many
samples of its stream it consumed) and the few numbers every trainer shares (shard
count; epoch, seed, dataset size and the samples left over from an earlier world
size). A load reads the whole table, whatever world size wrote it. Every trainer of
the job must save its position at the same step, as for every tensor.
"""

from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np


def _default_world(rank: Optional[int], world: Optional[int]) -> "tuple[int, int]":
    if rank is not None and world is not None:
        return rank, world
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return (dist.get_rank() if rank is None else rank, dist.get_world_size() if world is None else world)
    except ImportError:
        pass
    return (0 if rank is None else rank, 1 if world is None else world)


def shard_mod_world(shard: int, world: int) -> int:
    """The default assignment: shard s belongs to trainer s mod N."""
    return shard % world


class ShardPositions:
    """The position within each of `num_shards` shards, each read in order by the
    trainer that owns it."""

    def __init__(self, num_shards: int, shard_sizes: Optional[Sequence[int]] = None, rank: Optional[int] = None,
                 world: Optional[int] = None, owner: Callable[[int, int], int] = shard_mod_world) -> None:
        if num_shards < 1:
            raise ValueError(f"ShardPositions: num_shards must be >= 1, not {num_shards}")
        if shard_sizes is not None and len(shard_sizes) != num_shards:
            raise ValueError(f"ShardPositions: {len(shard_sizes)} shard sizes for {num_shards} shards")
        self.num_shards = num_shards
        self.shard_sizes = list(shard_sizes) if shard_sizes is not None else None
        self.rank, self.world = _default_world(rank, world)
        self.owner = owner
        self.positions = [0] * num_shards  # of every shard; this trainer advances its own

    def owned(self) -> List[int]:
        """The shards this trainer reads, ascending."""
        return [s for s in range(self.num_shards) if self.owner(s, self.world) == self.rank]

    def position(self, shard: int) -> int:
        """How many samples of `shard` have been consumed."""
        return self.positions[shard]

    def next(self, shard: int) -> Optional[int]:
        """The index within `shard` of its next sample (advancing past it), or None when
        the shard is exhausted (with shard_sizes)."""
        if self.owner(shard, self.world) != self.rank:
            raise ValueError(f"ShardPositions: shard {shard} belongs to trainer {self.owner(shard, self.world)}, "
                             f"not {self.rank}")
        if self.shard_sizes is not None and self.positions[shard] >= self.shard_sizes[shard]:
            return None
        index = self.positions[shard]
        self.positions[shard] += 1
        return index

    # The protocol ckptd.torch saves and loads through.
    def _ckptd_row(self) -> List[int]:
        mine = set(self.owned())
        return [self.positions[s] if s in mine else -1 for s in range(self.num_shards)]

    def _ckptd_shared(self) -> Dict[str, Any]:
        return {"kind": "shards", "num_shards": self.num_shards}

    def _ckptd_load(self, rows: "np.ndarray[Any, Any]", shared: Dict[str, Any]) -> None:
        if shared.get("kind") != "shards" or shared.get("num_shards") != self.num_shards:
            raise ValueError(f"ShardPositions: the checkpoint holds {shared}, this position has "
                             f"{self.num_shards} shards (the shard count is fixed for a run)")
        owners = (rows >= 0).sum(axis=0)
        if (owners != 1).any():
            bad = [int(s) for s in np.nonzero(owners != 1)[0][:8]]
            raise ValueError(f"ShardPositions: shards {bad} have {owners[bad[0]]} owners in the checkpoint (want 1)")
        self.positions = [int(p) for p in rows.max(axis=0)]


class GlobalPosition:
    """DistributedSampler's order, resumable on another world size: the epoch's
    permutation of range(dataset_size) (seed + epoch; no shuffle: in order), of which
    trainer r takes positions r, r + N, r + 2N, ... after any samples left over from
    an earlier world size."""

    def __init__(self, dataset_size: int, seed: int = 0, shuffle: bool = True, rank: Optional[int] = None,
                 world: Optional[int] = None) -> None:
        self.dataset_size = dataset_size
        self.seed = seed
        self.shuffle = shuffle
        self.rank, self.world = _default_world(rank, world)
        self.epoch = 0
        self._base = 0  # positions of the order below it are handed out (or pending)
        self._pending: List[int] = []  # positions below _base still to be consumed
        self._count = 0  # samples of this trainer's stream consumed
        self._order = self._permutation()

    def _permutation(self) -> "np.ndarray[Any, Any]":
        if not self.shuffle:
            return np.arange(self.dataset_size, dtype=np.int64)
        return np.random.default_rng(self.seed + self.epoch).permutation(self.dataset_size)

    def set_epoch(self, epoch: int) -> None:
        """Starts `epoch` from its beginning (call it on every trainer)."""
        self.epoch = epoch
        self._base, self._pending, self._count = 0, [], 0
        self._order = self._permutation()

    def _stream_position(self, rank: int, world: int, k: int) -> Optional[int]:
        """The position in the order of the k-th sample of trainer `rank`'s stream."""
        mine = self._pending[rank::world]
        if k < len(mine):
            return mine[k]
        position = self._base + rank + (k - len(mine)) * world
        return position if position < self.dataset_size else None

    def next(self) -> Optional[int]:
        """The global index of this trainer's next sample, or None when its share of
        the epoch is done."""
        position = self._stream_position(self.rank, self.world, self._count)
        if position is None:
            return None
        self._count += 1
        return int(self._order[position])

    def _ckptd_row(self) -> List[int]:
        return [self._count]

    def _ckptd_shared(self) -> Dict[str, Any]:
        return {"kind": "global", "dataset_size": self.dataset_size, "seed": self.seed, "shuffle": self.shuffle,
                "epoch": self.epoch, "base": self._base, "pending": list(self._pending)}

    def _ckptd_load(self, rows: "np.ndarray[Any, Any]", shared: Dict[str, Any]) -> None:
        if shared.get("kind") != "global" or shared.get("dataset_size") != self.dataset_size:
            raise ValueError(f"GlobalPosition: the checkpoint holds {shared}, this position has dataset_size "
                             f"{self.dataset_size}")
        self.seed, self.shuffle, self.epoch = int(shared["seed"]), bool(shared["shuffle"]), int(shared["epoch"])
        self._order = self._permutation()
        self._base, self._pending = int(shared["base"]), [int(p) for p in shared["pending"]]
        saved_world = rows.shape[0]
        consumed = set()
        top = self._base
        for rank in range(saved_world):
            for k in range(int(rows[rank, 0])):
                position = self._stream_position(rank, saved_world, k)
                if position is not None:
                    consumed.add(position)
                    top = max(top, position + 1)
        # What the saved streams handed out and nobody consumed is read first, then the
        # order goes on from where the furthest stream stopped, over the new world.
        left = [p for p in self._pending if p not in consumed]
        left += [p for p in range(self._base, top) if p not in consumed]
        self._pending, self._base, self._count = sorted(left), top, 0
