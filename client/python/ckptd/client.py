"""ckptd's Python client: numpy arrays in and out of the daemon on this host.

Bytes travel through shared memory when the daemon listens on a unix socket: a save
copies each array once, into a memfd segment the daemon writes to disk straight
from; a restore returns arrays that are views of the segment the daemon read into.
Elsewhere, or with transport="stream", they are streamed over gRPC in 4 MiB chunks.
Both paths give identical checkpoints.

A Client is not thread-safe; use one per thread (or guard it).
"""

import fcntl
import mmap
import os
from dataclasses import dataclass

import grpc
import numpy as np
from google.protobuf import json_format

from ckptd.v1 import ckptd_pb2, ckptd_pb2_grpc

_CHUNK = 4 << 20
_MAX_MESSAGE = 16 << 20
_MAX_FREE_SEGMENTS = 2
_MAX_BUSY_SEGMENTS = 4

# TensorFlow DataType numbers of the numpy dtypes ckptd stores.
_TF_DTYPE = {
    np.dtype(np.float32): 1, np.dtype(np.float64): 2, np.dtype(np.int32): 3,
    np.dtype(np.uint8): 4, np.dtype(np.int16): 5, np.dtype(np.int8): 6,
    np.dtype(np.int64): 9, np.dtype(np.bool_): 10, np.dtype(np.uint16): 17,
    np.dtype(np.float16): 19, np.dtype(np.uint32): 22, np.dtype(np.uint64): 23,
}
_NP_DTYPE = {v: k for k, v in _TF_DTYPE.items()}
_TF_BFLOAT16 = 14  # no numpy dtype: restored as uint16 bit patterns


class Error(Exception):
    """A failed call: `code` is the grpc.StatusCode, `details` the daemon's message."""

    def __init__(self, code, details):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


@dataclass
class SaveResult:
    bytes_staged: int
    staging_seconds: float  # as the daemon measured it
    shared_memory: bool     # which path the bytes took


class RestoreResult(dict):
    """{name: ndarray} (a list of arrays for a tensor restored to several devices),
    plus the step restored, this trainer's state and the daemon's note."""

    def __init__(self, arrays, step, trainer_state, note):
        super().__init__(arrays)
        self.step = step
        self.trainer_state = trainer_state
        self.note = note


class _Segment:
    """A sealed memfd mapped here; the daemon maps it through /proc/<pid>/fd/<fd>."""

    def __init__(self, size):
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

    def close(self):
        # Arrays may still view the mapping; mmap then stays alive until they go.
        try:
            self.map.close()
        except BufferError:
            pass
        os.close(self.fd)


def _dtype_number(dtype):
    dtype = np.dtype(dtype)
    if dtype not in _TF_DTYPE:
        raise TypeError(f"ckptd cannot store numpy dtype {dtype}")
    return _TF_DTYPE[dtype]


def _set_box(box, start, length):
    box.start.extend(int(s) for s in start)
    box.length.extend(int(n) for n in length)


def _raise(e):
    raise Error(e.code(), e.details()) from None


class Client:
    """A connection to the ckptd on this host.

    address: "unix:/path", a socket path, or empty for $CKPTD_ADDRESS.
    transport: "auto" (shared memory on a unix socket), "stream" or "shm".
    """

    def __init__(self, address=None, timeout=10.0, transport="auto"):
        address = address or os.environ.get("CKPTD_ADDRESS", "")
        if not address:
            raise ValueError("no daemon address: pass one or set CKPTD_ADDRESS")
        if address.startswith("/"):
            address = "unix:" + address
        if transport not in ("auto", "stream", "shm"):
            raise ValueError("transport must be 'auto', 'stream' or 'shm'")
        self._local = address.startswith("unix:")
        self._transport = transport
        self._shm_works = True
        self._channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
        ])
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise Error(grpc.StatusCode.UNAVAILABLE,
                        f"cannot connect to ckptd at {address} within {timeout} s") from None
        self._stub = ckptd_pb2_grpc.CkptdStub(self._channel)
        self._free = []      # segments free for reuse
        self._busy = {}      # (run, step) -> segment the daemon may still read
        self._barriers = {}  # run -> next barrier id

    def close(self):
        for seg in self._free + list(self._busy.values()):
            seg.close()
        self._free, self._busy = [], {}
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- save -----------------------------------------------------------------

    def save(self, run, step, tensors, trainer_id=0, trainer_count=1, mesh="", device_ids=(),
             trainer_state=None, store_float32_as_bfloat16=False, timeout=600.0):
        """Stages this trainer's tensors for (run, step) and returns a SaveResult once
        they are in daemon memory; the arrays may be changed right after.

        tensors: {name: array} for a whole tensor, or {name: (array, layout)} where
        layout is a list of sharding specs (a mesh dimension or "unsharded" per
        dimension) over `mesh`, and array is this trainer's box (a list of arrays,
        one per device of device_ids, when it holds several). Arrays of a layout
        carry their global shape as `(array, layout, global_shape)`; without it the
        shape is the box's shape times the mesh dimension sizes, from the mesh.
        """
        header = ckptd_pb2.SaveHeader(run=run, step=step, trainer_id=trainer_id,
                                      trainer_count=trainer_count, mesh=mesh,
                                      device_ids=list(device_ids),
                                      store_float32_as_bfloat16=store_float32_as_bfloat16)
        for key, value in (trainer_state or {}).items():
            header.trainer_state[key] = bytes(value)
        pieces = []
        mesh_dims = _mesh_dims(mesh) if mesh else {}
        for name, value in tensors.items():
            d = header.tensors.add(name=name)
            if isinstance(value, tuple):
                arrays, layout = value[0], list(value[1])
                arrays = list(arrays) if isinstance(arrays, (list, tuple)) else [arrays]
                arrays = [np.asarray(a) for a in arrays]
                if len(value) > 2:
                    shape = [int(n) for n in value[2]]
                else:
                    shape = [n * mesh_dims.get(spec, 1) for n, spec in zip(arrays[0].shape, layout)]
                d.layout.sharding_specs.extend(layout)
            else:
                arrays = [np.asarray(value)]
                shape = list(arrays[0].shape)
            d.dtype = _dtype_number(arrays[0].dtype)
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

    def _use_shm(self):
        if self._transport == "stream":
            return False
        return self._transport == "shm" or (self._local and self._shm_works)

    def _take_segment(self, size):
        for i, seg in enumerate(self._free):
            if seg.size >= size and seg.size - size <= seg.size // 4:
                return self._free.pop(i)
        return _Segment(size)

    def _give_back(self, seg):
        self._free.append(seg)
        while len(self._free) > _MAX_FREE_SEGMENTS:
            self._free.pop(0).close()

    def _save_shm(self, header, pieces, timeout):
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

    def _save_stream(self, header, pieces, timeout):
        def requests():
            yield ckptd_pb2.SaveRequest(header=header)
            chunk = bytearray()
            for a in pieces:
                view = memoryview(np.ascontiguousarray(a)).cast("B")
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

    def wait(self, run, step, timeout=600.0):
        """Returns the published step directory once (run, step) is committed on every
        host; raises Error with the step's failure otherwise."""
        try:
            reply = self._stub.Wait(ckptd_pb2.StepRef(run=run, step=step), timeout=timeout)
        except grpc.RpcError as e:
            _raise(e)
        for key in [k for k in self._busy if k[0] == run and k[1] <= step]:
            self._give_back(self._busy.pop(key))
        return reply.path

    def restore(self, run, step, tensors, mesh="", device_ids=(), trainer_id=0,
                trainer_state=False, fallback=False, timeout=600.0):
        """Reads tensors of (run, step), or of the newest committed step when step is
        None, and returns a RestoreResult {name: ndarray}.

        tensors: {name: (shape, dtype, layout)}: shape None or the stored global shape
        (checked); dtype None for the stored one, or a float dtype to convert to;
        layout None for the whole tensor, or sharding specs over `mesh` for this
        trainer's boxes (one array per device of device_ids; a single array when
        there is one device).
        """
        request = ckptd_pb2.RestoreRequest(run=run, step=step or 0, latest=step is None,
                                           mesh=mesh, device_ids=list(device_ids),
                                           trainer_id=trainer_id, trainer_state=trainer_state,
                                           fallback=fallback)
        layouts = []
        for name, spec in tensors.items():
            shape, dtype, layout = (tuple(spec) + (None, None, None))[:3]
            t = request.tensors.add(name=name)
            if dtype is not None:
                t.dtype = _dtype_number(dtype)
            if shape is not None:
                t.shape.extend(int(n) for n in shape)
            if layout is not None:
                t.layout.sharding_specs.extend(layout)
            layouts.append(layout is not None)
        if self._use_shm():
            try:
                return self._restore_shm(request, layouts, timeout)
            except Error as e:
                if not (self._transport == "auto" and _shm_unusable(e)):
                    raise
                self._shm_works = False
        return self._restore_stream(request, layouts, timeout)

    def _call_restore(self, request, timeout):
        try:
            return list(self._stub.Restore(request, timeout=timeout))
        except grpc.RpcError as e:
            _raise(e)

    def _restore_shm(self, request, layouts, timeout):
        described = ckptd_pb2.RestoreRequest()
        described.CopyFrom(request)
        described.describe_only = True
        header = self._call_restore(described, timeout)[0].header
        # A fresh segment: the arrays returned are views of it.
        seg = _Segment(header.shared_memory_bytes)
        try:
            request.shared_memory.fd = seg.fd
            request.shared_memory.size = seg.size
            header = self._call_restore(request, timeout)[0].header
            arrays = {}
            for i, d in enumerate(header.tensors):
                arrays[d.name] = _views(d, layouts[i], seg.map, header.shared_memory_offsets[i])
        finally:
            os.close(seg.fd)  # the mapping (and the arrays on it) outlive the fd
        return RestoreResult(arrays, header.step, dict(header.trainer_state), header.note)

    def _restore_stream(self, request, layouts, timeout):
        replies = self._call_restore(request, timeout)
        header = replies[0].header
        buffers = []
        for d in header.tensors:
            boxes = list(d.device_boxes) if len(d.device_boxes) else [d.box]
            count = sum(_box_elements(b, d.shape) for b in boxes)
            buffers.append(bytearray(count * _itemsize(d.dtype)))
        for r in replies[1:]:
            c = r.chunk
            buffers[c.tensor_index][c.offset:c.offset + len(c.data)] = c.data
        arrays = {d.name: _views(d, layouts[i], buffers[i], 0) for i, d in enumerate(header.tensors)}
        return RestoreResult(arrays, header.step, dict(header.trainer_state), header.note)

    def barrier(self, run, trainer_id, trainer_count, mesh="", device_ids=(), timeout=600.0):
        """Returns once every trainer of the job has called barrier as often."""
        barrier_id = self._barriers.get(run, 0)
        self._barriers[run] = barrier_id + 1
        try:
            self._stub.Barrier(ckptd_pb2.BarrierRequest(
                run=run, trainer_id=trainer_id, trainer_count=trainer_count, barrier_id=barrier_id,
                mesh=mesh, device_ids=list(device_ids)), timeout=timeout)
        except grpc.RpcError as e:
            _raise(e)

    def status(self, timeout=10.0):
        """This daemon's Status as a dict (field names as in the proto)."""
        try:
            reply = self._stub.Status(ckptd_pb2.StatusRequest(), timeout=timeout)
        except grpc.RpcError as e:
            _raise(e)
        return json_format.MessageToDict(reply, preserving_proto_field_name=True,
                                         including_default_value_fields=True)

    def list_checkpoints(self, run="", timeout=30.0):
        """[{run, step, path, bytes}] of committed checkpoints, oldest first per run."""
        try:
            reply = self._stub.ListCheckpoints(ckptd_pb2.ListCheckpointsRequest(run=run),
                                               timeout=timeout)
        except grpc.RpcError as e:
            _raise(e)
        return [json_format.MessageToDict(c, preserving_proto_field_name=True,
                                          including_default_value_fields=True)
                for c in reply.checkpoints]

    def list_tensors(self, run, step=None, timeout=30.0):
        """(step, [(name, numpy dtype or None, shape)]) of a committed step (None: the
        newest), in name order; the dtype is None where NumPy has none (bfloat16,
        string). Pages through ListTensors; `timeout` is per page."""
        request = ckptd_pb2.ListTensorsRequest(run=run, latest=step is None, step=step or 0,
                                               page_size=10000)
        tensors = []
        while True:
            try:
                reply = self._stub.ListTensors(request, timeout=timeout)
            except grpc.RpcError as e:
                _raise(e)
            # Later pages from the step the first one chose, whatever commits meanwhile.
            request.latest, request.step = False, reply.step
            tensors += [(t.name, _NP_DTYPE.get(t.dtype), tuple(t.shape)) for t in reply.tensors]
            if not reply.next_page_token:
                return reply.step, tensors
            request.page_token = reply.next_page_token


def _shm_unusable(e):
    return "shared_memory:" in e.details and e.code in (
        grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND)


def _mesh_dims(mesh):
    """{dimension: size} of a DTensor mesh string '|x=2,y=4|...'."""
    parts = mesh.split("|")
    if len(parts) < 2 or not parts[1]:
        return {}
    return {k: int(v) for k, v in (d.split("=") for d in parts[1].split(","))}


def _itemsize(dtype):
    return 2 if dtype == _TF_BFLOAT16 else _NP_DTYPE[dtype].itemsize


def _box_lengths(box, shape):
    return list(box.length) if len(box.length) else list(shape)


def _box_elements(box, shape):
    return int(np.prod(_box_lengths(box, shape), dtype=np.int64))


def _views(d, layout, buffer, offset):
    """Arrays over `buffer` at `offset`, one per box of descriptor d, without copying."""
    dtype = np.dtype(np.uint16) if d.dtype == _TF_BFLOAT16 else _NP_DTYPE[d.dtype]
    boxes = list(d.device_boxes) if layout else [d.box]
    out = []
    for box in boxes:
        lengths = _box_lengths(box, d.shape)
        out.append(np.ndarray(lengths, dtype, buffer=buffer, offset=offset))
        offset += out[-1].nbytes
    return out[0] if len(out) == 1 else out
