"""ckptd's Python client: numpy arrays in and out of the daemon on this host.

Bytes travel through shared memory when the daemon listens on a unix socket: a save
copies each array once, into a memfd segment the daemon writes to disk straight
from; a restore returns arrays that are views of the segment the daemon read into.
Elsewhere, or with transport="stream", they are streamed over gRPC in 4 MiB chunks.
Both paths give identical checkpoints.

A Client is not thread-safe; use one per thread (or guard it).
"""

from __future__ import annotations

import fcntl
import mmap
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, NoReturn, Optional, Sequence, Tuple, Union

import grpc
import numpy as np
import numpy.typing as npt
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from ckptd.v1 import ckptd_pb2, ckptd_pb2_grpc

_CHUNK = 4 << 20
_MAX_MESSAGE = 16 << 20
_MAX_FREE_SEGMENTS = 2
_MAX_BUSY_SEGMENTS = 4

# TensorFlow DataType numbers of the numpy dtypes ckptd stores.
_TF_DTYPE: Dict[np.dtype[Any], int] = {
    np.dtype(np.float32): 1, np.dtype(np.float64): 2, np.dtype(np.int32): 3,
    np.dtype(np.uint8): 4, np.dtype(np.int16): 5, np.dtype(np.int8): 6,
    np.dtype(np.int64): 9, np.dtype(np.bool_): 10, np.dtype(np.uint16): 17,
    np.dtype(np.float16): 19, np.dtype(np.uint32): 22, np.dtype(np.uint64): 23,
}
_NP_DTYPE: Dict[int, np.dtype[Any]] = {v: k for k, v in _TF_DTYPE.items()}
_TF_BFLOAT16 = 14  # no numpy dtype: restored as uint16 bit patterns

# dtype names as ckptctl takes them (TF's, numpy's, PyTorch's): name -> TF number.
_TF_NAMES: Dict[str, int] = {
    "float": 1, "double": 2, "int32": 3, "uint8": 4, "int16": 5, "int8": 6, "int64": 9, "bool": 10,
    "bfloat16": 14, "uint16": 17, "half": 19, "uint32": 22, "uint64": 23,
}
_NAME_ALIASES: Dict[str, str] = {
    "float32": "float", "float64": "double", "float16": "half", "fp32": "float", "fp64": "double",
    "fp16": "half", "bf16": "bfloat16", "f32": "float", "f64": "double", "f16": "half", "long": "int64",
    "short": "int16", "bool_": "bool",
}


#: How details start when a call's own timeout passed (not the daemon's answer).
CLIENT_TIMEOUT = "client-side timeout"


class Error(Exception):
    """A failed call: `code` is the grpc.StatusCode, `details` the daemon's message.

    `client_timeout` is True when the call's own timeout passed without an answer
    (DEADLINE_EXCEEDED, details starting with CLIENT_TIMEOUT); a step that failed
    its commit timeout at the daemon is also DEADLINE_EXCEEDED, but with the
    daemon's message naming the missing trainers, and client_timeout False.
    """

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and details == "Deadline Exceeded":
            details = (f"{CLIENT_TIMEOUT}: ckptd did not answer within the call's timeout "
                       "(the daemon may still finish the work)")
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @property
    def client_timeout(self) -> bool:
        return self.code == grpc.StatusCode.DEADLINE_EXCEEDED and self.details.startswith(CLIENT_TIMEOUT)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a save, when it is not a whole array: this trainer's box(es).

    array: this trainer's part (a list of arrays, one per device of device_ids, when
    it holds several); layout: a sharding spec per dimension (a mesh dimension name
    or "unsharded") over the save's mesh; global_shape: the whole tensor's shape
    (default: each box dimension times the size of the mesh dimension it is sharded
    over).

    Instead of a layout, start: the array is the box of the tensor that begins at
    these offsets (global_shape required), as a ShardedTensor's local shard is.
    dtype: the dtype to store when the array holds another's bits ("bfloat16" for
    uint16 arrays of bfloat16 bit patterns, as numpy has no bfloat16).
    """

    array: Union[npt.ArrayLike, Sequence[npt.ArrayLike]]
    layout: Sequence[str] = ()
    global_shape: Optional[Sequence[int]] = None
    start: Optional[Sequence[int]] = None
    dtype: Optional[npt.DTypeLike] = None


@dataclass(frozen=True)
class RestoreSpec:
    """How to restore one tensor: shape None or the stored global shape (checked);
    dtype None for the stored one, or the stored one or a float dtype to convert to
    (float32, bfloat16 and float16 convert among themselves), as a numpy dtype or a
    name as ckptctl takes it ("bfloat16", "float16", "half", "torch.bfloat16",
    "DT_FLOAT"); layout None for the whole tensor, or sharding specs over the
    restore's mesh for this trainer's boxes.

    NumPy has no bfloat16: a tensor restored as bfloat16 comes back as uint16 arrays
    holding its bit patterns (RestoreResult.dtypes names it "bfloat16"); widen with
    (a.astype(np.uint32) << 16).view(np.float32).

    start and length: instead of a layout, one box of the tensor (any box, whatever
    boxes it was saved in), returned as one array of shape `length`.

    out: where the bytes go, as a trainer restores into the model it holds: an
    ndarray (a list of them, one per device box, with a layout), C-contiguous,
    writable, each exactly its box's bytes. The result holds these very arrays. On
    this host the daemon writes them itself where the kernel lets it; otherwise the
    client copies the bytes in."""

    shape: Optional[Sequence[int]] = None
    dtype: Optional[npt.DTypeLike] = None
    layout: Optional[Sequence[str]] = None
    start: Optional[Sequence[int]] = None
    length: Optional[Sequence[int]] = None
    out: Optional[Any] = None


@dataclass(frozen=True)
class Mesh:
    """A DTensor mesh, as save(), restore() and barrier() take it (they take its
    string form too): named dimensions over global device ids 0..N-1 in row-major
    order, and the devices this trainer holds.

        mesh = ckptd.Mesh({"x": 2, "y": 4}, local_device_ids=[0, 1])
        c.save("run", 1, {"w": ckptd.TensorSpec(w_rows, ["x", "unsharded"])}, mesh=mesh)

    str(mesh) is DTensor's Mesh.to_string() form, which the proto's `mesh` fields
    carry: "NAME|x=2,y=4|0,...,7|0,1|/job:localhost/replica:0/task:0/device:CPU:0,...".
    With a Mesh, device_ids default to its local_device_ids.
    """

    dims: Mapping[str, int]
    local_device_ids: Sequence[int] = ()
    name: str = ""
    device_type: str = "CPU"
    job: str = "/job:localhost/replica:0/task:0"

    def __post_init__(self) -> None:
        if not self.dims or any(int(n) < 1 for n in self.dims.values()):
            raise ValueError(f"Mesh dims: want {{name: size >= 1}}, got {dict(self.dims)!r}")
        size = int(np.prod(list(self.dims.values())))
        bad = [i for i in self.local_device_ids if not 0 <= i < size]
        if bad:
            raise ValueError(f"Mesh local_device_ids {bad}: outside 0..{size - 1}")

    @property
    def size(self) -> int:
        return int(np.prod(list(self.dims.values())))

    def __str__(self) -> str:
        dims = ",".join(f"{k}={int(v)}" for k, v in self.dims.items())
        devices = ",".join(f"{self.job}/device:{self.device_type}:{i}" for i in self.local_device_ids)
        local = ",".join(str(i) for i in self.local_device_ids)
        return f"{self.name}|{dims}|{','.join(str(i) for i in range(self.size))}|{local}|{devices}"


def _mesh_and_devices(mesh: Union[str, Mesh], device_ids: Sequence[int]) -> Tuple[str, List[int]]:
    if isinstance(mesh, Mesh):
        return str(mesh), list(device_ids) if len(device_ids) else list(mesh.local_device_ids)
    return mesh, list(device_ids)


#: What save() takes per tensor: a whole array, a TensorSpec, or the older tuple
#: (array, layout[, global_shape]).
SaveValue = Union[npt.ArrayLike, TensorSpec, Tuple[Any, ...]]
#: What restore() takes per tensor: a RestoreSpec, None (whole, as stored) or the
#: older tuple (shape, dtype, layout).
RestoreValue = Union[RestoreSpec, None, Tuple[Any, ...]]
#: A restored tensor: one array, or one per device when restored to several.
Restored = Union[npt.NDArray[Any], List[npt.NDArray[Any]]]


@dataclass
class SaveResult:
    """What a save staged."""

    bytes_staged: int
    staging_seconds: float  # as the daemon measured it
    shared_memory: bool     # which path the bytes took


class RestoreResult(Dict[str, Restored]):
    """{name: ndarray} (a list of arrays for a tensor restored to several devices),
    plus the step restored, this trainer's state, the daemon's note, and `dtypes`:
    {name: dtype as restored}, "bfloat16" for the uint16 bit patterns of one."""

    def __init__(self, arrays: Mapping[str, Restored], step: int, trainer_state: Dict[str, bytes],
                 note: str, dtypes: Optional[Dict[str, str]] = None) -> None:
        super().__init__(arrays)
        self.step = int(step)
        self.trainer_state = trainer_state
        self.note = note
        # The daemon wrote the arrays itself (same host, where the kernel lets it).
        self.into_trainer_memory = False
        self.dtypes = dtypes if dtypes is not None else {
            name: str((a[0] if isinstance(a, list) else a).dtype) for name, a in arrays.items()}


class _Segment:
    """A sealed memfd mapped here; the daemon maps it through /proc/<pid>/fd/<fd>."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.fd = os.memfd_create("ckptd-segment", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self.map = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        # Arrays may still view the mapping; mmap then stays alive until they go.
        try:
            self.map.close()
        except BufferError:
            pass
        os.close(self.fd)


def _dtype_number(dtype: Any) -> int:
    """TF's DataType number of a numpy dtype, or of a name as ckptctl takes it
    ("bfloat16", "float16", "half", "torch.bfloat16", "DT_FLOAT", ...)."""
    if isinstance(dtype, str) or (hasattr(dtype, "__module__") and type(dtype).__module__ == "torch"):
        name = str(dtype).lower()
        for prefix in ("torch.", "numpy.", "np.", "tf.", "dt_"):
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        name = _NAME_ALIASES.get(name, name)
        if name in _TF_NAMES:
            return _TF_NAMES[name]
        raise TypeError(f"unknown dtype {dtype!r}: want e.g. float32, bfloat16, float16, int64, or TF's "
                        f"float, half")
    dtype = np.dtype(dtype)
    if dtype not in _TF_DTYPE:
        raise TypeError(f"ckptd cannot store numpy dtype {dtype}")
    return _TF_DTYPE[dtype]


def _set_box(box: Any, start: Sequence[int], length: Sequence[int]) -> None:
    box.start.extend(int(s) for s in start)
    box.length.extend(int(n) for n in length)


def _raise(e: grpc.RpcError) -> NoReturn:
    raise Error(e.code(), e.details()) from None


def _to_python(msg: Message) -> Dict[str, Any]:
    """Every field of a message (defaults included) as plain Python values: 64-bit
    integers as int (json_format would give strings), enums by name, nested messages
    as dicts. Independent of json_format's keyword arguments, which changed in
    protobuf 5.26."""
    out: Dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        message = field.type == FieldDescriptor.TYPE_MESSAGE
        if message and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _to_python(v) if value_field.type == FieldDescriptor.TYPE_MESSAGE else v
                               for k, v in value.items()}
        elif field.label == FieldDescriptor.LABEL_REPEATED:
            out[field.name] = [_to_python(v) if message else _scalar(field, v) for v in value]
        elif message:
            if msg.HasField(field.name):
                out[field.name] = _to_python(value)
        else:
            out[field.name] = _scalar(field, value)
    return out


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    return value


def default_socket_path() -> str:
    """The socket a daemon started without flags listens on."""
    return f"/tmp/ckptd-{os.getuid()}/ckptd-0.sock"


def daemon_target(address: Optional[str] = None) -> str:
    """The gRPC target an address names, as the C++ client and ckptctl read it:
    "unix:PATH" as it is; a value with a "/" or naming an existing file is a unix
    socket; anything else is host:port. Empty: $CKPTD_ADDRESS, else the default socket."""
    given = address or os.environ.get("CKPTD_ADDRESS", "") or default_socket_path()
    if given.startswith(("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")):
        return given
    if "/" in given or os.path.exists(given):
        return "unix:" + given
    return given


def _how_address_was_chosen(address: Optional[str]) -> str:
    if address:
        return ""
    if os.environ.get("CKPTD_ADDRESS"):
        return " (from $CKPTD_ADDRESS)"
    return " (the default socket; pass an address or set CKPTD_ADDRESS)"


class Client:
    """A connection to the ckptd on this host.

    address: "unix:/path", a socket path ("sock/0.sock", "/run/ckptd.sock": anything
    with a "/" or naming an existing file), "host:port", or empty for
    $CKPTD_ADDRESS, else the daemon's default socket (default_socket_path()).
    transport: "auto" (shared memory on a unix socket), "stream" or "shm".
    """

    def __init__(self, address: Optional[str] = None, timeout: float = 10.0, transport: str = "auto") -> None:
        """Connects within `timeout` seconds; raises Error(UNAVAILABLE) otherwise."""
        chosen = _how_address_was_chosen(address)
        address = daemon_target(address)
        if transport not in ("auto", "stream", "shm"):
            raise ValueError("transport must be 'auto', 'stream' or 'shm'")
        self._local = address.startswith("unix:")
        self._transport = transport
        self._shm_works = True
        self._channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            # A trainer often starts before its daemon listens: retry every 100 ms (at
            # most every 2 s), not after gRPC's default backoff of 1 s and growing.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ])
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise Error(grpc.StatusCode.UNAVAILABLE,
                        f"cannot connect to ckptd at {address}{chosen} within {timeout} s") from None
        self._stub = ckptd_pb2_grpc.CkptdStub(self._channel)  # type: ignore[no-untyped-call]
        self._free: List[_Segment] = []                  # segments free for reuse
        self._busy: Dict[Tuple[str, int], _Segment] = {}  # (run, step) -> segment the daemon may still read
        self._barriers: Dict[str, int] = {}               # run -> next barrier id

    def close(self) -> None:
        """Closes the channel and frees this client's shared-memory segments."""
        for seg in self._free + list(self._busy.values()):
            seg.close()
        self._free, self._busy = [], {}
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- save -----------------------------------------------------------------

    def save(self, run: str, step: int, tensors: Mapping[str, SaveValue], trainer_id: int = 0,
             trainer_count: int = 1, mesh: Union[str, Mesh] = "", device_ids: Sequence[int] = (),
             trainer_state: Optional[Mapping[str, bytes]] = None, store_float32_as_bfloat16: bool = False,
             timeout: float = 600.0) -> SaveResult:
        """Stages this trainer's tensors for (run, step) and returns a SaveResult once
        they are in daemon memory; the arrays may be changed right after.

        tensors: {name: array} for a whole tensor, or {name: TensorSpec(array, layout)}
        for this trainer's box(es) of a tensor sharded over `mesh` (the tuple
        (array, layout[, global_shape]) is accepted too); mesh: a Mesh or its string.
        trainer_state: opaque bytes this trainer gets back from
        restore(trainer_state=True).
        """
        mesh, device_ids = _mesh_and_devices(mesh, device_ids)
        header = ckptd_pb2.SaveHeader(run=run, step=step, trainer_id=trainer_id,
                                      trainer_count=trainer_count, mesh=mesh,
                                      device_ids=list(device_ids),
                                      store_float32_as_bfloat16=store_float32_as_bfloat16)
        for key, state in (trainer_state or {}).items():
            header.trainer_state[key] = bytes(state)
        pieces = []
        mesh_dims = _mesh_dims(mesh) if mesh else {}
        for name, value in tensors.items():
            d = header.tensors.add(name=name)
            if isinstance(value, tuple):
                value = TensorSpec(value[0], value[1], value[2] if len(value) > 2 else None)
            stored_dtype = None
            if isinstance(value, TensorSpec) and value.start is not None:
                if value.global_shape is None or value.layout:
                    raise ValueError(f"TensorSpec of '{name}': start needs global_shape and no layout")
                arrays = [np.asarray(value.array)]
                shape = [int(n) for n in value.global_shape]
                _set_box(d.box, [int(n) for n in value.start], arrays[0].shape)
                stored_dtype = value.dtype
            elif isinstance(value, TensorSpec):
                given, layout = value.array, list(value.layout)
                arrays = [np.asarray(a) for a in (list(given) if isinstance(given, (list, tuple)) else [given])]
                if value.global_shape is not None:
                    shape = [int(n) for n in value.global_shape]
                elif layout:
                    shape = [n * mesh_dims.get(spec, 1) for n, spec in zip(arrays[0].shape, layout)]
                else:  # the whole tensor, with only its stored dtype given
                    shape = list(arrays[0].shape)
                if layout:
                    d.layout.sharding_specs.extend(layout)
                stored_dtype = value.dtype
            else:
                arrays = [np.asarray(value)]
                shape = list(arrays[0].shape)
            d.dtype = _dtype_number(arrays[0].dtype if stored_dtype is None else stored_dtype)
            d.shape.extend(shape)
            pieces.extend(arrays)
        use_shm = self._use_shm()
        if use_shm:
            try:
                return self._save_shm(header, pieces, timeout)
            except Error as e:
                if not (self._transport == "auto" and _shm_unusable(e)):
                    raise
                self._shm_works = False
        return self._save_stream(header, pieces, timeout)

    def _use_shm(self) -> bool:
        if self._transport == "stream":
            return False
        return self._transport == "shm" or (self._local and self._shm_works)

    def _take_segment(self, size: int) -> _Segment:
        for i, seg in enumerate(self._free):
            if seg.size >= size and seg.size - size <= seg.size // 4:
                return self._free.pop(i)
        return _Segment(size)

    def _give_back(self, seg: _Segment) -> None:
        self._free.append(seg)
        while len(self._free) > _MAX_FREE_SEGMENTS:
            self._free.pop(0).close()

    def _save_shm(self, header: Any, pieces: List[npt.NDArray[Any]], timeout: float) -> SaveResult:
        total = sum(a.nbytes for a in pieces)
        seg = self._take_segment(total)
        offset = 0
        for a in pieces:
            # copyto handles non-contiguous arrays without an intermediate copy.
            np.copyto(np.ndarray(a.shape, a.dtype, buffer=seg.map, offset=offset), a, casting="no")
            offset += a.nbytes
        header.shared_memory.fd = seg.fd
        header.shared_memory.offset = 0
        header.shared_memory.size = total
        try:
            reply = self._stub.Save(iter([ckptd_pb2.SaveRequest(header=header)]), timeout=timeout)
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                                grpc.StatusCode.UNAVAILABLE):
                self._give_back(seg)  # refused outright: the daemon holds nothing of it
            _raise(e)
        key = (header.run, header.step)
        if key in self._busy:
            self._busy.pop(key).close()
        self._busy[key] = seg
        while len(self._busy) > _MAX_BUSY_SEGMENTS:
            self._busy.pop(next(iter(self._busy))).close()
        return SaveResult(reply.bytes_staged, reply.staging_seconds, True)

    def _save_stream(self, header: Any, pieces: List[npt.NDArray[Any]], timeout: float) -> SaveResult:
        def requests() -> Iterator[Any]:
            yield ckptd_pb2.SaveRequest(header=header)
            chunk = bytearray()
            for a in pieces:
                view = np.ascontiguousarray(a).data.cast("B")
                pos = 0
                while pos < len(view):
                    n = min(len(view) - pos, _CHUNK - len(chunk))
                    chunk += view[pos:pos + n]
                    pos += n
                    if len(chunk) == _CHUNK:
                        yield ckptd_pb2.SaveRequest(data=bytes(chunk))
                        chunk = bytearray()
            if chunk:
                yield ckptd_pb2.SaveRequest(data=bytes(chunk))
        try:
            reply = self._stub.Save(requests(), timeout=timeout)
        except grpc.RpcError as e:
            _raise(e)
        return SaveResult(reply.bytes_staged, reply.staging_seconds, False)

    # --- wait, restore, barrier, status -----------------------------------------

    def wait(self, run: str, step: int, timeout: float = 600.0, allow_unknown: bool = False) -> str:
        """Returns the published step directory once (run, step) is committed on every
        host; raises Error with the step's failure otherwise. A run the daemon has never
        seen (nothing of it staged, committing or on disk) raises Error NOT_FOUND at
        once, unless allow_unknown (a watcher started before the run's first save)."""
        try:
            request = ckptd_pb2.WaitRequest(run=run, step=step, allow_unknown_run=allow_unknown)
            reply = self._stub.Wait(request, timeout=timeout)
        except grpc.RpcError as e:
            _raise(e)
        for key in [k for k in self._busy if k[0] == run and k[1] <= step]:
            self._give_back(self._busy.pop(key))
        return str(reply.path)

    def restore(self, run: str, step: Optional[int], tensors: Optional[Mapping[str, RestoreValue]] = None,
                mesh: Union[str, Mesh] = "", device_ids: Sequence[int] = (), trainer_id: int = 0,
                trainer_state: bool = False, fallback: bool = False, timeout: float = 600.0) -> RestoreResult:
        """Reads tensors of (run, step), or of the newest committed step when step is
        None, and returns a RestoreResult {name: ndarray}.

        tensors: {name: RestoreSpec(shape, dtype, layout)} (or None per tensor for it
        whole, as stored; the tuple (shape, dtype, layout) is accepted too). A
        layout restores this trainer's boxes over `mesh`: one array per device of
        device_ids, a single array when there is one device. tensors=None restores
        every tensor of the step whole, as stored (bfloat16 as uint16 bit patterns;
        string tensors, which numpy cannot hold, are left out). mesh: a Mesh or its
        string; it may differ from the mesh the checkpoint was saved with.

        fallback (with step None): if the newest step fails its checksums, restore
        the newest older step that reads cleanly instead; RestoreResult.step and
        .note say which was restored and what was skipped. Without it, a checksum
        failure raises Error DATA_LOSS.
        """
        mesh, device_ids = _mesh_and_devices(mesh, device_ids)
        if tensors is None:
            step = self._resolve_step(run, step, fallback, timeout)
            tensors = {name: None for name in self._numeric_tensors(run, step, timeout)}
        request = ckptd_pb2.RestoreRequest(run=run, step=step or 0, latest=step is None,
                                           mesh=mesh, device_ids=list(device_ids),
                                           trainer_id=trainer_id, trainer_state=trainer_state,
                                           fallback=fallback)
        layouts = []
        outs: List[Optional[List[Any]]] = []
        for name, value in tensors.items():
            if value is None:
                spec = RestoreSpec()
            elif isinstance(value, RestoreSpec):
                spec = value
            else:
                spec = RestoreSpec(*(tuple(value) + (None, None, None))[:3])
            shape, dtype, layout = spec.shape, spec.dtype, spec.layout
            t = request.tensors.add(name=name)
            if spec.start is not None or spec.length is not None:
                if spec.start is None or spec.length is None or layout is not None:
                    raise ValueError(f"RestoreSpec of '{name}': a box needs start and length, and no layout")
                _set_box(t.box, [int(n) for n in spec.start], [int(n) for n in spec.length])
            if dtype is not None:
                t.dtype = _dtype_number(dtype)
            if shape is not None:
                t.shape.extend(int(n) for n in shape)
            if layout is not None:
                t.layout.sharding_specs.extend(layout)
            layouts.append(layout is not None)
            outs.append(_out_arrays(name, spec.out, layout is not None))
        if self._use_shm():
            try:
                return self._restore_shm(request, layouts, outs, timeout)
            except Error as e:
                if not (self._transport == "auto" and _shm_unusable(e)):
                    raise
                self._shm_works = False
        return _into_outs(self._restore_stream(request, layouts, timeout), outs)

    def _resolve_step(self, run: str, step: Optional[int], fallback: bool, timeout: float) -> Optional[int]:
        """The step a restore of every tensor reads: `step`, or the newest committed
        (with fallback, the daemon picks among older ones itself)."""
        if step is not None or fallback:
            return step
        return self.list_tensors(run, None, timeout)[0]

    def _numeric_tensors(self, run: str, step: Optional[int], timeout: float) -> List[str]:
        names = []
        for name, dtype, _ in self.list_tensors(run, step, timeout, raw_dtypes=True)[1]:
            if dtype in _NP_DTYPE or dtype == _TF_BFLOAT16:
                names.append(name)
        return names

    def _call_restore(self, request: Any, timeout: float) -> Iterator[Any]:
        """The reply stream: the header first, then chunks, read as they come."""
        try:
            for reply in self._stub.Restore(request, timeout=timeout):
                yield reply
        except grpc.RpcError as e:
            _raise(e)

    def _restore_shm(self, request: Any, layouts: List[bool], outs: List[Optional[List[Any]]],
                     timeout: float) -> RestoreResult:
        described = ckptd_pb2.RestoreRequest()
        described.CopyFrom(request)
        described.describe_only = True
        # Read to the end: the call must finish, not be cancelled by a dropped stream.
        header = list(self._call_restore(described, timeout))[0].header
        # The arrays the daemon may write itself: the caller's, or new ones (untouched
        # until then, so unused ones cost nothing).
        arrays: Dict[str, Restored] = {}
        for i, d in enumerate(header.tensors):
            given = outs[i]
            own: List[Any] = given if given is not None else _empty_arrays(d, layouts[i])
            _check_outs(d, layouts[i], own)
            for a in own:
                request.tensors[i].process_memory.add(address=a.ctypes.data, size=a.nbytes)
            arrays[d.name] = own if layouts[i] and len(own) > 1 else own[0]
        # The segment the reply lands in where the daemon may not write those: the
        # arrays returned are then views of it (or copied into `out`).
        seg = _Segment(header.shared_memory_bytes)
        try:
            request.shared_memory.fd = seg.fd
            request.shared_memory.size = seg.size
            header = list(self._call_restore(request, timeout))[0].header
            if not header.process_memory:
                for i, d in enumerate(header.tensors):
                    arrays[d.name] = _views(d, layouts[i], seg.map, header.shared_memory_offsets[i])
        finally:
            os.close(seg.fd)  # the mapping (and the arrays on it) outlive the fd
        result = RestoreResult(arrays, header.step, dict(header.trainer_state), header.note, _dtype_names(header))
        if header.process_memory:
            result.into_trainer_memory = True
            return result
        return _into_outs(result, outs)

    def _restore_stream(self, request: Any, layouts: List[bool], timeout: float) -> RestoreResult:
        # Each chunk is copied into place as it arrives and then dropped: the bytes
        # are held once, in the arrays returned, never also as a list of replies.
        replies = self._call_restore(request, timeout)
        header = next(replies).header
        buffers = []
        for d in header.tensors:
            boxes = list(d.device_boxes) if len(d.device_boxes) else [d.box]
            count = sum(_box_elements(b, d.shape) for b in boxes)
            buffers.append(bytearray(count * _itemsize(d.dtype)))
        for r in replies:
            if r.WhichOneof("payload") != "chunk":
                continue  # the trailer of a restore streamed while it was read
            c = r.chunk
            buffers[c.tensor_index][c.offset:c.offset + len(c.data)] = c.data
        arrays = {d.name: _views(d, layouts[i], buffers[i], 0) for i, d in enumerate(header.tensors)}
        return RestoreResult(arrays, header.step, dict(header.trainer_state), header.note, _dtype_names(header))

    def barrier(self, run: str, trainer_id: int, trainer_count: int, mesh: Union[str, Mesh] = "",
                device_ids: Sequence[int] = (), timeout: float = 600.0) -> None:
        """Returns once every trainer of the job has called barrier as often."""
        mesh, device_ids = _mesh_and_devices(mesh, device_ids)
        barrier_id = self._barriers.get(run, 0)
        self._barriers[run] = barrier_id + 1
        try:
            self._stub.Barrier(ckptd_pb2.BarrierRequest(
                run=run, trainer_id=trainer_id, trainer_count=trainer_count, barrier_id=barrier_id,
                mesh=mesh, device_ids=list(device_ids)), timeout=timeout)
        except grpc.RpcError as e:
            _raise(e)

    def status(self, timeout: float = 10.0) -> Dict[str, Any]:
        """This daemon's Status as a dict (field names as in the proto, every field,
        64-bit integers as int)."""
        try:
            reply = self._stub.Status(ckptd_pb2.StatusRequest(), timeout=timeout)
        except grpc.RpcError as e:
            _raise(e)
        return _to_python(reply)

    def list_checkpoints(self, run: str = "", timeout: float = 30.0) -> List[Dict[str, Any]]:
        """[{run, step, path, bytes, ...}] of committed checkpoints, oldest first per
        run; step and bytes are int."""
        try:
            reply = self._stub.ListCheckpoints(ckptd_pb2.ListCheckpointsRequest(run=run),
                                               timeout=timeout)
        except grpc.RpcError as e:
            _raise(e)
        return [_to_python(c) for c in reply.checkpoints]

    def all_steps(self, run: str, timeout: float = 30.0) -> List[int]:
        """The committed steps of `run`, ascending (empty when there is none)."""
        return sorted(int(c["step"]) for c in self.list_checkpoints(run, timeout) if c["run"] == run)

    def latest_step(self, run: str, timeout: float = 30.0) -> Optional[int]:
        """The newest committed step of `run`, or None when there is none."""
        steps = self.all_steps(run, timeout)
        return steps[-1] if steps else None

    def list_tensors(self, run: str, step: Optional[int] = None, timeout: float = 30.0,
                     raw_dtypes: bool = False) -> Tuple[int, List[Tuple[str, Any, Tuple[int, ...]]]]:
        """(step, [(name, numpy dtype or None, shape)]) of a committed step (None: the
        newest), in name order; the dtype is None where NumPy has none (bfloat16,
        string), or with raw_dtypes TensorFlow's DataType number. Pages through
        ListTensors; `timeout` is per page."""
        request = ckptd_pb2.ListTensorsRequest(run=run, latest=step is None, step=step or 0,
                                               page_size=10000)
        tensors: List[Tuple[str, Any, Tuple[int, ...]]] = []
        while True:
            try:
                reply = self._stub.ListTensors(request, timeout=timeout)
            except grpc.RpcError as e:
                _raise(e)
            # Later pages from the step the first one chose, whatever commits meanwhile.
            request.latest, request.step = False, reply.step
            tensors += [(t.name, t.dtype if raw_dtypes else _NP_DTYPE.get(t.dtype), tuple(int(n) for n in t.shape))
                        for t in reply.tensors]
            if not reply.next_page_token:
                return int(reply.step), tensors
            request.page_token = reply.next_page_token


def _shm_unusable(e: Error) -> bool:
    return "shared_memory:" in e.details and e.code in (
        grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND)


def _dtype_names(header: Any) -> Dict[str, str]:
    """{name: dtype as restored} of a RestoreHeader: numpy's names, "bfloat16" for
    the uint16 bit patterns of one."""
    return {d.name: "bfloat16" if d.dtype == _TF_BFLOAT16 else str(_NP_DTYPE[d.dtype]) for d in header.tensors}


def _mesh_dims(mesh: str) -> Dict[str, int]:
    """{dimension: size} of a DTensor mesh string '|x=2,y=4|...'."""
    parts = mesh.split("|")
    if len(parts) < 2 or not parts[1]:
        return {}
    return {k: int(v) for k, v in (d.split("=") for d in parts[1].split(","))}


def _itemsize(dtype: int) -> int:
    return 2 if dtype == _TF_BFLOAT16 else _NP_DTYPE[dtype].itemsize


def _box_lengths(box: Any, shape: Sequence[int]) -> List[int]:
    return list(box.length) if len(box.length) else list(shape)


def _box_elements(box: Any, shape: Sequence[int]) -> int:
    return int(np.prod(_box_lengths(box, shape), dtype=np.int64))


def _out_arrays(name: str, out: Any, layout: bool) -> Optional[List[Any]]:
    """RestoreSpec.out as a list of arrays (one per box), checked for what the daemon
    can write into; None when there is none."""
    if out is None:
        return None
    arrays = list(out) if isinstance(out, (list, tuple)) else [out]
    if len(arrays) > 1 and not layout:
        raise ValueError(f"RestoreSpec of '{name}': out is a list of {len(arrays)} arrays, but only a layout "
                         "restores several boxes")
    for a in arrays:
        if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError(f"RestoreSpec of '{name}': out must be C-contiguous, writable ndarrays")
    return arrays


def _box_bytes(d: Any, layout: bool) -> List[int]:
    """The bytes of each box of descriptor d."""
    boxes = list(d.device_boxes) if layout else [d.box]
    return [_box_elements(b, d.shape) * _itemsize(d.dtype) for b in boxes]


def _empty_arrays(d: Any, layout: bool) -> List[Any]:
    dtype = np.dtype(np.uint16) if d.dtype == _TF_BFLOAT16 else _NP_DTYPE[d.dtype]
    boxes = list(d.device_boxes) if layout else [d.box]
    return [np.empty(_box_lengths(b, d.shape), dtype) for b in boxes]


def _check_outs(d: Any, layout: bool, arrays: List[Any]) -> None:
    sizes = _box_bytes(d, layout)
    if [a.nbytes for a in arrays] != sizes:
        raise ValueError(f"RestoreSpec of '{d.name}': out holds {[a.nbytes for a in arrays]} bytes, but the "
                         f"restored boxes are {sizes}")


def _into_outs(result: RestoreResult, outs: List[Optional[List[Any]]]) -> RestoreResult:
    """Copies each restored tensor into its RestoreSpec.out, which the result then holds."""
    for (name, restored), out in zip(list(result.items()), outs):
        if out is None:
            continue
        got = restored if isinstance(restored, list) else [restored]
        if [a.nbytes for a in got] != [a.nbytes for a in out]:
            raise ValueError(f"RestoreSpec of '{name}': out holds {[a.nbytes for a in out]} bytes, but the "
                             f"restored boxes are {[a.nbytes for a in got]}")
        for dst, src in zip(out, got):
            dst.reshape(-1).view(np.uint8)[:] = src.reshape(-1).view(np.uint8)
        result[name] = out if isinstance(restored, list) else out[0]
    return result


def _views(d: Any, layout: bool, buffer: Any, offset: int) -> Restored:
    """Arrays over `buffer` at `offset`, one per box of descriptor d, without copying."""
    dtype = np.dtype(np.uint16) if d.dtype == _TF_BFLOAT16 else _NP_DTYPE[d.dtype]
    boxes = list(d.device_boxes) if layout else [d.box]
    out: List[npt.NDArray[Any]] = []
    for box in boxes:
        lengths = _box_lengths(box, d.shape)
        out.append(np.ndarray(lengths, dtype, buffer=buffer, offset=offset))
        offset += out[-1].nbytes
    return out[0] if len(out) == 1 else out
