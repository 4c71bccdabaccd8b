"""PyTorch state_dicts through ckptd, in two lines.

    import ckptd.torch
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    ckptd.torch.save(state, "run-1", step)          # returns once staged
    step = ckptd.torch.load(state, "run-1")         # the newest step, in place
    optimizer.load_state_dict(state["optim"])

The trainer id and count are torch.distributed's rank and world size when a process
group exists (else 0 and 1); the daemon is the one $CKPTD_ADDRESS names, else the
daemon's default socket. load() works on any world size and sharding: each trainer
asks for exactly the boxes its tensors cover, and the daemons assemble them from
whatever boxes were saved.

What a state_dict may hold:
- tensors. A plain tensor is taken as replicated: every trainer sends it whole and the
  daemons write it once. PerRank(tensor) marks one that differs per trainer: it is
  stored as "NAME@rank<r>" and loaded by the trainer of the same rank.
- ShardedTensor (torch.distributed._shard): each trainer sends its local shard as the
  box at the shard's offsets, and load fills the local shards of whatever sharding the
  destination has. One local shard per trainer and tensor.
- dicts (any keys of str or int), lists and tuples, flattened to TensorFlow-style
  names: {"model": {"layers.0.weight": t}} is "model/layers.0/weight" (a key's last
  dot becomes a slash: module path, then parameter), {"optim": {"state": {3:
  {"exp_avg": t}}}} is "optim/state/3/exp_avg".
- ints, floats, strings, bools and None, kept as this trainer's state beside the
  tensors (a trainer that did not exist when the step was saved gets trainer 0's).

load() fills tensors in place (copy_, converting the dtype where the state_dict's
differs from the stored one) and sets the other leaves in their dicts and lists. An
empty dict in the destination (an optimizer's "state" before its first step) is filled
with what the checkpoint holds under it. A key of the state_dict that the checkpoint
lacks, or one the checkpoint has that the state_dict lacks, is an error naming it
unless strict=False, as in Module.load_state_dict.
"""

import collections
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import ckptd.client as _client

_TREE_KEY = "ckptd.torch/tree"
_SHARDED_METADATA = "torch.distributed._shard.sharded_tensor.metadata"
_MUTABLE_DEFAULT = "field(default=TensorProperties())"


class _ShardedMetadataFix(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """torch 1.13's sharded_tensor/metadata.py declares a dataclass field with a mutable
    default, which Python 3.11 refuses, so nothing under torch.distributed._shard
    imports. This loads that one module, in this process only, with the default_factory
    the dataclass meant; the installed file is never changed."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _SHARDED_METADATA:
            return None
        return importlib.util.spec_from_file_location(fullname, self.origin, loader=self)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        with open(self.origin) as f:
            source = f.read().replace(_MUTABLE_DEFAULT, "field(default_factory=TensorProperties)")
        exec(compile(source, self.origin, "exec"), module.__dict__)  # noqa: S102 - torch's own source


def _install_sharded_fix_if_needed() -> None:
    """Only where the installed torch has the defect and this Python refuses it."""
    if sys.version_info < (3, 11) or _SHARDED_METADATA in sys.modules:
        return
    if any(isinstance(f, _ShardedMetadataFix) for f in sys.meta_path):
        return
    # Found by path: importing any parent package would import the broken module.
    torch_spec = importlib.machinery.PathFinder.find_spec("torch")
    if torch_spec is None or not torch_spec.submodule_search_locations:
        return
    origin = os.path.join(list(torch_spec.submodule_search_locations)[0], "distributed", "_shard",
                          "sharded_tensor", "metadata.py")
    if not os.path.isfile(origin):
        return
    with open(origin) as f:
        if _MUTABLE_DEFAULT not in f.read():
            return
    sys.meta_path.insert(0, _ShardedMetadataFix(origin))


_install_sharded_fix_if_needed()

import torch  # noqa: E402 - after the fix, so that torch's own imports of _shard see it


@functools.lru_cache(maxsize=None)
def _sharded_tensor_type() -> Optional[type]:
    try:
        from torch.distributed._shard.sharded_tensor import api
    except ImportError:
        return None
    sharded: type = api.ShardedTensor
    return sharded


@functools.lru_cache(maxsize=None)
def _dtensor_type() -> Optional[type]:
    """DTensor, where the installed torch has it (2.0 and later; Debian 12 has 1.13)."""
    if int(torch.__version__.split(".")[0]) < 2:
        return None
    for module in ("torch.distributed.tensor", "torch.distributed._tensor"):
        try:
            found: type = getattr(importlib.import_module(module), "DTensor")
            return found
        except (ImportError, AttributeError):
            continue
    return None


def _local_boxes(value: Any) -> Optional[List[Tuple["torch.Tensor", List[int]]]]:
    """The local pieces of a ShardedTensor or DTensor and the offsets each begins at;
    None for any other tensor."""
    if _is_sharded(value):
        return [(s.tensor, [int(o) for o in s.metadata.shard_offsets]) for s in value.local_shards()]
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(value, dtensor):
        from torch.distributed._tensor._utils import compute_local_shape_and_global_offset
        d: Any = value
        _, offset = compute_local_shape_and_global_offset(d.shape, d.device_mesh, d.placements)
        return [(d.to_local(), [int(o) for o in offset])]
    return None


class PerRank:
    """A tensor that differs per trainer (an RNG state, a rank-local buffer): stored as
    "NAME@rank<r>" and loaded by the trainer of the same rank."""

    def __init__(self, tensor: "torch.Tensor") -> None:
        self.tensor = tensor


def _world() -> Tuple[int, int]:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


_default_clients: Dict[str, "_client.Client"] = {}


def _client_for(client: Optional["_client.Client"]) -> "_client.Client":
    """The given client, or one per daemon address kept for the process's lifetime."""
    if client is not None:
        return client
    target = _client.daemon_target(None)
    if target not in _default_clients:
        _default_clients[target] = _client.Client(None)
    return _default_clients[target]


def _component(key: Any, leaf_is_tensor: bool) -> str:
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise TypeError(f"ckptd.torch: a state_dict key must be a str or an int, not {type(key).__name__} "
                        f"({key!r})")
    text = str(key)
    if leaf_is_tensor and "." in text:
        head, _, tail = text.rpartition(".")
        text = f"{head}/{tail}"
    return text


def _is_sharded(value: Any) -> bool:
    # Checked before torch.Tensor: in torch 1.13 a ShardedTensor is one.
    sharded = _sharded_tensor_type()
    return sharded is not None and isinstance(value, sharded)


def _is_position(value: Any) -> bool:
    """A ckptd.data position: one row per trainer of a table every load reads whole."""
    return hasattr(value, "_ckptd_row") and hasattr(value, "_ckptd_load")


def _is_tensor_leaf(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, PerRank)) or _local_boxes(value) is not None


def _join(prefix: str, part: str) -> str:
    return f"{prefix}/{part}" if prefix else part


# A tree describes a state_dict: {"d": [[key, node], ...]} for a dict (keys keep their
# type), {"l": [...]} a list, {"u": [...]} a tuple, {"t": name, "kind": plain|sharded|
# rank} a tensor, {"v": value} any other leaf.
def _describe(value: Any, name: str, rank: int) -> Dict[str, Any]:
    if isinstance(value, dict):
        return {"d": [[k, _describe(v, _join(name, _component(k, _is_tensor_leaf(v))), rank)]
                      for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"l" if isinstance(value, list) else "u":
                [_describe(v, _join(name, str(i)), rank) for i, v in enumerate(value)]}
    if isinstance(value, PerRank):
        return {"t": f"{name}@rank{rank}", "kind": "rank"}
    if _is_position(value):
        return {"rows": name, "shared": value._ckptd_shared()}
    if _is_tensor_leaf(value):
        return {"t": name, "kind": "plain" if _local_boxes(value) is None else "sharded"}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    raise TypeError(f"ckptd.torch: cannot save '{name}' of type {type(value).__name__} (tensors, dicts, lists, "
                    f"tuples, ints, floats, strings, bools and None only)")


def _tensors(value: Any, node: Dict[str, Any], out: List[Tuple[str, Any]]) -> None:
    """(stored name, the value as given: a tensor, ShardedTensor, DTensor, PerRank or
    ckptd.data position) of every tensor the tree names, in tree order."""
    if "d" in node:
        for (key, child), v in zip(node["d"], value.values()):
            _tensors(v, child, out)
    elif "l" in node or "u" in node:
        for child, v in zip(node.get("l", node.get("u")), value):
            _tensors(v, child, out)
    elif "t" in node:
        out.append((node["t"], value))
    elif "rows" in node:
        out.append((node["rows"], value))


def _numpy(tensor: "torch.Tensor") -> Tuple["np.ndarray[Any, Any]", Optional[str]]:
    """A numpy view of a CPU tensor, strides and all (the client copies it into the
    shared-memory segment once, whatever its layout; a tensor on a GPU is copied to the
    host first), and the dtype to store when numpy cannot say it."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
    return t.numpy(), None


def save(state_dict: Dict[str, Any], run: str, step: int, client: Optional["_client.Client"] = None,
         timeout: float = 600.0) -> "_client.SaveResult":
    """Stages this trainer's part of `state_dict` for (run, step) and returns once the
    daemon holds it (the tensors may change right after); wait() for durability."""
    rank, world = _world()
    tree = _describe(state_dict, "", rank)
    found: List[Tuple[str, Any]] = []
    _tensors(state_dict, tree, found)
    counts = collections.Counter(n for n, _ in found)
    if len(counts) != len(found):
        twice = sorted(n for n, c in counts.items() if c > 1)
        raise ValueError(f"ckptd.torch: two entries of the state_dict flatten to the same name: {twice}")
    specs: Dict[str, Any] = {}
    for name, value in found:
        if _is_position(value):
            if (value.rank, value.world) != (rank, world):
                raise ValueError(f"ckptd.torch: '{name}' is trainer {value.rank} of {value.world}, but this process "
                                 f"is {rank} of {world}")
            row = np.asarray([value._ckptd_row()], dtype=np.int64)
            specs[name] = _client.TensorSpec(row, global_shape=[world, row.shape[1]], start=[rank, 0])
            continue
        if isinstance(value, PerRank):
            array, dtype = _numpy(value.tensor)
            specs[name] = _client.TensorSpec(array, dtype=dtype) if dtype else array
            continue
        boxes = _local_boxes(value)
        if boxes is None:
            array, dtype = _numpy(value)
            specs[name] = _client.TensorSpec(array, dtype=dtype) if dtype else array
            continue
        if len(boxes) > 1:
            raise ValueError(f"ckptd.torch: '{name}' has {len(boxes)} local shards on rank {rank}; one per "
                             f"trainer is supported")
        if not boxes:
            continue  # other trainers hold all of it
        array, dtype = _numpy(boxes[0][0])
        specs[name] = _client.TensorSpec(array, global_shape=list(value.size()), start=boxes[0][1], dtype=dtype)
    state = {_TREE_KEY: json.dumps(tree).encode()}
    return _client_for(client).save(run, step, specs, trainer_id=rank, trainer_count=world, trainer_state=state,
                                    timeout=timeout)


def wait(run: str, step: int, client: Optional["_client.Client"] = None, timeout: float = 600.0) -> str:
    """Returns the step's path once it is committed on every host; raises ckptd.Error if
    it failed."""
    return _client_for(client).wait(run, step, timeout=timeout)


def _saved_tree(c: "_client.Client", run: str, step: Optional[int], rank: int,
                timeout: float) -> Tuple[int, Dict[str, Any]]:
    """(step, tree) as this trainer saved it, or as trainer 0 did when this trainer did
    not exist then."""
    result = c.restore(run, step, {}, trainer_id=rank, trainer_state=True, timeout=timeout)
    if _TREE_KEY not in result.trainer_state and rank != 0:
        result = c.restore(run, result.step, {}, trainer_id=0, trainer_state=True, timeout=timeout)
    if _TREE_KEY not in result.trainer_state:
        raise ValueError(f"ckptd.torch: run '{run}' step {result.step} was not saved by ckptd.torch.save (no "
                         f"state_dict structure in its trainer state)")
    return result.step, json.loads(result.trainer_state[_TREE_KEY])


def _rank_name(name: str, rank: int) -> str:
    return f"{name}@rank{rank}"


class _Plan:
    """What one load reads and where each piece goes."""

    def __init__(self, rank: int, strict: bool) -> None:
        self.rank = rank
        self.strict = strict
        self.specs: Dict[str, Any] = {}
        self.fills: List[Tuple[str, Any]] = []  # (name, destination tensor or shard)
        self.creates: List[Tuple[str, Any, Any]] = []  # (name, container, key): a new tensor
        self.positions: List[Tuple[str, Any, Dict[str, Any]]] = []  # (name, ckptd.data position, shared)
        self.missing: List[str] = []  # in the state_dict, not in the checkpoint
        self.unexpected: List[str] = []  # in the checkpoint, not in the state_dict


def _walk(dest: Any, saved: Optional[Dict[str, Any]], name: str, plan: _Plan) -> None:
    """Matches the destination against the saved tree; saved None: nothing was saved
    here."""
    if isinstance(dest, dict):
        saved_items = {json.dumps(k): (k, child) for k, child in saved["d"]} if saved and "d" in saved else {}
        was_empty = not dest
        for key, value in dest.items():
            part = _join(name, _component(key, _is_tensor_leaf(value)))
            found = saved_items.pop(json.dumps(key), None)
            _walk(value, found[1] if found else None, part, plan)
        for key, child in saved_items.values():
            if was_empty:  # an empty dict is filled with what the checkpoint has there
                _create(dest, key, child, plan)
            else:
                _unexpected(child, plan)
        return
    if isinstance(dest, (list, tuple)):
        saved_list = (saved.get("l") or saved.get("u") or []) if saved else []
        for i, value in enumerate(dest):
            _walk(value, saved_list[i] if i < len(saved_list) else None, _join(name, str(i)), plan)
        for child in saved_list[len(dest):]:
            _unexpected(child, plan)
        return
    if _is_position(dest):
        if saved is None or "rows" not in saved:
            plan.missing.append(name)
        else:
            plan.specs[saved["rows"]] = None
            plan.positions.append((saved["rows"], dest, saved["shared"]))
        return
    if saved is None or ("t" not in saved) != (not _is_tensor_leaf(dest)):
        plan.missing.append(_rank_name(name, plan.rank) if isinstance(dest, PerRank) else name)
        return
    if not _is_tensor_leaf(dest):
        return  # an int, a string...: set by _set_leaves once the tensors are read
    if isinstance(dest, PerRank):
        stored = _rank_name(name, plan.rank)
        plan.specs[stored] = None
        plan.fills.append((stored, dest.tensor))
    elif _local_boxes(dest) is None:
        plan.specs[saved["t"]] = None
        plan.fills.append((saved["t"], dest))
    else:  # a ShardedTensor or DTensor: the boxes of its local pieces
        boxes = _local_boxes(dest) or []
        if len(boxes) > 1:
            raise ValueError(f"ckptd.torch: '{name}' has {len(boxes)} local shards on rank {plan.rank}; one per "
                             f"trainer is supported")
        for local, start in boxes:
            plan.specs[saved["t"]] = _client.RestoreSpec(start=start, length=list(local.shape))
            plan.fills.append((saved["t"], local))


def _unexpected(node: Dict[str, Any], plan: _Plan) -> None:
    names: List[str] = []
    _names_of(node, names)
    plan.unexpected.extend(names or ["(a non-tensor entry)"])


def _names_of(node: Dict[str, Any], out: List[str]) -> None:
    if "t" in node or "rows" in node:
        out.append(node.get("t", node.get("rows")))
    for _, child in node.get("d", []):
        _names_of(child, out)
    for child in node.get("l", node.get("u", [])):
        _names_of(child, out)


def _create(container: Dict[Any, Any], key: Any, node: Dict[str, Any], plan: _Plan) -> None:
    """A subtree the destination lacks, built from the checkpoint (tensors are filled
    once read)."""
    if "v" in node:
        container[key] = node["v"]
    elif "t" in node or "rows" in node:  # a position's table comes back as its tensor
        name = node.get("t", node.get("rows"))
        container[key] = None
        plan.specs[name] = None
        plan.creates.append((name, container, key))
    elif "d" in node:
        container[key] = {}
        for k, child in node["d"]:
            _create(container[key], k, child, plan)
    else:  # a list (a saved tuple comes back as a list: its tensors are set once read)
        items = node.get("l", node.get("u", []))
        holder: Dict[Any, Any] = {}
        for i, child in enumerate(items):
            _create(holder, i, child, plan)
        container[key] = [holder[i] for i in range(len(items))]
        for i, (name, where, at) in enumerate(plan.creates):
            if where is holder:
                plan.creates[i] = (name, container[key], at)


def _set_leaves(dest: Any, saved: Optional[Dict[str, Any]]) -> None:
    """Non-tensor leaves of the saved tree into the destination's dicts and lists."""
    if saved is None:
        return
    if isinstance(dest, dict) and "d" in saved:
        by_key = {json.dumps(k): child for k, child in saved["d"]}
        for key in list(dest.keys()):
            child = by_key.get(json.dumps(key))
            if child is not None and "v" in child and not _is_tensor_leaf(dest[key]):
                dest[key] = child["v"]
            else:
                _set_leaves(dest[key], child)
    elif isinstance(dest, list) and "l" in saved:
        for i, child in enumerate(saved["l"][:len(dest)]):
            if "v" in child and not _is_tensor_leaf(dest[i]):
                dest[i] = child["v"]
            else:
                _set_leaves(dest[i], child)
    elif isinstance(dest, tuple) and "u" in saved:
        for value, child in zip(dest, saved["u"]):
            _set_leaves(value, child)


def _as_torch(result: Optional["_client.RestoreResult"], name: str) -> "torch.Tensor":
    assert result is not None  # a plan with pieces to read restored them
    array = result[name]
    assert isinstance(array, np.ndarray)  # one box per tensor: never a list of arrays
    dtype_name = result.dtypes[name]
    if dtype_name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def load(state_dict: Dict[str, Any], run: str, step: Optional[int] = None, client: Optional["_client.Client"] = None,
         strict: bool = True, timeout: float = 600.0) -> int:
    """Fills `state_dict` in place from (run, step), or from the newest committed step
    when step is None, and returns the step restored. Works whatever the world size
    and sharding were at save time."""
    rank, _ = _world()
    c = _client_for(client)
    step, tree = _saved_tree(c, run, step, rank, timeout)
    plan = _Plan(rank, strict)
    _walk(state_dict, tree, "", plan)
    stored = {name: shape for name, _, shape in c.list_tensors(run, step, timeout=timeout)[1]}
    for name in [n for n in plan.specs if n not in stored]:  # a rank that did not exist at save time
        del plan.specs[name]
        plan.missing.append(name)
    plan.fills = [(n, d) for n, d in plan.fills if n in plan.specs]
    # Checked before anything is read, so that an error leaves the state_dict as it was.
    for name, dest in plan.fills:
        if plan.specs[name] is None and tuple(stored[name]) != tuple(dest.shape):
            raise ValueError(f"ckptd.torch.load: '{name}' is {list(stored[name])} in run '{run}' step {step}, "
                             f"{list(dest.shape)} in the state_dict")
    plan.positions = [(n, d, shared) for n, d, shared in plan.positions if n in plan.specs]
    if strict and (plan.missing or plan.unexpected):
        parts = []
        if plan.missing:
            parts.append(f"missing from the checkpoint: {', '.join(plan.missing[:20])}")
        if plan.unexpected:
            parts.append(f"in the checkpoint but not in the state_dict: {', '.join(plan.unexpected[:20])}")
        raise KeyError(f"ckptd.torch.load of run '{run}' step {step}: " + "; ".join(parts) +
                       " (strict=False loads what matches)")
    result = c.restore(run, step, plan.specs, trainer_id=rank, timeout=timeout) if plan.specs else None
    for name, dest in plan.fills:
        with torch.no_grad():
            dest.copy_(_as_torch(result, name))
    for name, position, shared in plan.positions:
        assert result is not None
        position._ckptd_load(np.asarray(result[name]), shared)
    for name, container, key in plan.creates:
        container[key] = _as_torch(result, name).clone()
    _set_leaves(state_dict, tree)
    return step


# --- A storage backend for PyTorch's Distributed Checkpoint (DCP) -------------------

try:  # a newer torch
    from torch.distributed.checkpoint import (LoadPlan, LoadPlanner, Metadata, SavePlan, SavePlanner,
                                              StorageReader as _DcpReader, StorageWriter as _DcpWriter, WriteResult)
    from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
except ImportError:  # torch 1.13, as Debian 12 ships it
    from torch.distributed._shard.checkpoint.metadata import Metadata
    from torch.distributed._shard.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan,
                                                             SavePlanner, WriteItemType)
    from torch.distributed._shard.checkpoint.storage import StorageReader as _DcpReader
    from torch.distributed._shard.checkpoint.storage import StorageWriter as _DcpWriter
    from torch.distributed._shard.checkpoint.storage import WriteResult

import io  # noqa: E402
import pickle  # noqa: E402

from torch.futures import Future  # noqa: E402

_DCP_METADATA = "dcp/metadata"
_DCP_BYTES = "dcp/bytes/"


class StorageWriter(_DcpWriter):  # type: ignore[misc]
    """DCP's storage interface over ckptd: save_state_dict(sd,
    storage_writer=ckptd.torch.StorageWriter(run, step)) saves a ckptd step, with DCP's
    planner unchanged. Each rank's tensors are one Save to its host's daemon; DCP's
    metadata travels in the coordinator's Save, so ckptd's commit, not a metadata file
    written last, makes the step whole or absent. durable: save_state_dict returns once
    the step is committed on every host (else once every rank's bytes are staged).
    Non-tensor entries are pickled, as DCP pickles them, into the writing trainer's
    state."""

    def __init__(self, run: str, step: int, client: Optional["_client.Client"] = None, durable: bool = True) -> None:
        super().__init__()
        self.run, self.step, self.durable = run, step, durable
        self.client = _client_for(client)
        self.is_coordinator = False
        self.rank, self.world = _world()
        self._specs: Dict[str, Any] = {}
        self._state: Dict[str, bytes] = {}

    def init(self, is_coordinator: bool) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> "Future[List[WriteResult]]":
        results = []
        for item in plan.items:
            fqn = item.index.fqn
            if item.type == WriteItemType.BYTE_IO:
                data = planner.resolve_data(item)
                self._state[_DCP_BYTES + fqn] = bytes(data.getbuffer())
                results.append(WriteResult(index=item.index, size_in_bytes=len(self._state[_DCP_BYTES + fqn]),
                                           storage_data={"trainer": self.rank}))
                continue
            if fqn in self._specs:
                raise ValueError(f"ckptd.torch.StorageWriter: '{fqn}' has two chunks on rank {self.rank}; one per "
                                 f"trainer is supported")
            tensor = planner.resolve_data(item)
            array, dtype = _numpy(tensor)
            chunk = item.tensor_data.chunk
            self._specs[fqn] = _client.TensorSpec(array, global_shape=list(item.tensor_data.size),
                                                  start=list(chunk.offsets), dtype=dtype)
            results.append(WriteResult(index=item.index, size_in_bytes=array.nbytes, storage_data={"name": fqn}))
        if not self.is_coordinator:  # the coordinator saves in finish(), with the metadata
            self._save()
        future: "Future[List[WriteResult]]" = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rank_results in results for r in rank_results}
        self._state[_DCP_METADATA] = pickle.dumps(metadata)
        self._save()
        if self.durable:
            self.client.wait(self.run, self.step)

    def _save(self) -> None:
        self.client.save(self.run, self.step, self._specs, trainer_id=self.rank, trainer_count=self.world,
                         trainer_state=self._state)


class StorageReader(_DcpReader):  # type: ignore[misc]
    """DCP's storage interface over ckptd: load_state_dict(sd,
    storage_reader=ckptd.torch.StorageReader(run)) loads the newest committed step (or
    `step`) into any sharding, DCP's planner deciding what each rank reads; each rank
    asks its host's daemon for exactly the boxes it needs."""

    def __init__(self, run: str, step: Optional[int] = None, client: Optional["_client.Client"] = None) -> None:
        super().__init__()
        self.run, self.step = run, step
        self.client = _client_for(client)
        self.storage_data: Dict[Any, Any] = {}
        self._states: Dict[int, Dict[str, bytes]] = {}

    def _trainer_state(self, trainer: int) -> Dict[str, bytes]:
        if trainer not in self._states:
            result = self.client.restore(self.run, self.step, {}, trainer_id=trainer, trainer_state=True)
            self.step = result.step  # every later read is of the same step
            self._states[trainer] = result.trainer_state
        return self._states[trainer]

    def read_metadata(self) -> Metadata:
        # DCP's coordinator is rank 0 unless save_state_dict was told another; a trainer
        # with no state at all means the saving job had no more trainers.
        for trainer in range(4096):
            state = self._trainer_state(trainer)
            if _DCP_METADATA in state:
                metadata: Metadata = pickle.loads(state[_DCP_METADATA])
                return metadata
            if not state:
                break
        raise ValueError(f"ckptd.torch.StorageReader: run '{self.run}' step {self.step} was not saved through "
                         f"ckptd.torch.StorageWriter (no DCP metadata in its trainer state)")

    def init(self, metadata: Metadata, is_coordinator: bool) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> "Future[None]":
        tensors: List[Any] = []
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                where = self.storage_data[item.storage_index]
                data = self._trainer_state(where["trainer"])[_DCP_BYTES + item.storage_index.fqn]
                planner.load_bytes(item, io.BytesIO(data))
            else:
                tensors.append(item)
        # One restore per round, each naming a tensor at most once (a destination that
        # overlaps two saved chunks of a tensor has two items of it).
        while tensors:
            batch: Dict[str, Any] = {}
            later = []
            for item in tensors:
                name = self.storage_data[item.storage_index]["name"]
                if name in batch:
                    later.append(item)
                    continue
                chunk_start = item.storage_index.offset or [0] * len(item.lengths)
                batch[name] = (item, [int(a) + int(b) for a, b in zip(chunk_start, item.storage_offsets)])
            specs = {name: _client.RestoreSpec(start=start, length=list(item.lengths))
                     for name, (item, start) in batch.items()}
            result = self.client.restore(self.run, self.step, specs)
            for name, (item, _) in batch.items():
                target = planner.resolve_tensor(item).detach()
                with torch.no_grad():
                    target.copy_(_as_torch(result, name).reshape(target.shape))
                planner.commit_tensor(item, target)
            tensors = later
        future: "Future[None]" = Future()
        future.set_result(None)
        return future
