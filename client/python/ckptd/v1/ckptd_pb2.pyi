from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BarrierRequest(_message.Message):
    __slots__ = ["barrier_id", "device_ids", "mesh", "run", "trainer_count", "trainer_id"]
    BARRIER_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    MESH_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    TRAINER_COUNT_FIELD_NUMBER: _ClassVar[int]
    TRAINER_ID_FIELD_NUMBER: _ClassVar[int]
    barrier_id: int
    device_ids: _containers.RepeatedScalarFieldContainer[int]
    mesh: str
    run: str
    trainer_count: int
    trainer_id: int
    def __init__(self, run: _Optional[str] = ..., trainer_id: _Optional[int] = ..., trainer_count: _Optional[int] = ..., barrier_id: _Optional[int] = ..., mesh: _Optional[str] = ..., device_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class BarrierResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class Box(_message.Message):
    __slots__ = ["length", "start"]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    length: _containers.RepeatedScalarFieldContainer[int]
    start: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, start: _Optional[_Iterable[int]] = ..., length: _Optional[_Iterable[int]] = ...) -> None: ...

class CheckpointInfo(_message.Message):
    __slots__ = ["bytes", "path", "run", "step"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    path: str
    run: str
    step: int
    def __init__(self, run: _Optional[str] = ..., step: _Optional[int] = ..., path: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...

class DeviceMemory(_message.Message):
    __slots__ = ["device_uuid", "ipc_handle", "offset"]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    IPC_HANDLE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    device_uuid: bytes
    ipc_handle: bytes
    offset: int
    def __init__(self, ipc_handle: _Optional[bytes] = ..., offset: _Optional[int] = ..., device_uuid: _Optional[bytes] = ...) -> None: ...

class GatheringStep(_message.Message):
    __slots__ = ["deadline_unix_seconds", "missing_trainers", "run", "step", "trainer_count", "trainers_staged"]
    DEADLINE_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MISSING_TRAINERS_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TRAINERS_STAGED_FIELD_NUMBER: _ClassVar[int]
    TRAINER_COUNT_FIELD_NUMBER: _ClassVar[int]
    deadline_unix_seconds: float
    missing_trainers: _containers.RepeatedScalarFieldContainer[int]
    run: str
    step: int
    trainer_count: int
    trainers_staged: int
    def __init__(self, run: _Optional[str] = ..., step: _Optional[int] = ..., trainer_count: _Optional[int] = ..., trainers_staged: _Optional[int] = ..., missing_trainers: _Optional[_Iterable[int]] = ..., deadline_unix_seconds: _Optional[float] = ...) -> None: ...

class KeptStep(_message.Message):
    __slots__ = ["bytes", "run", "step"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    run: str
    step: int
    def __init__(self, run: _Optional[str] = ..., step: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class Layout(_message.Message):
    __slots__ = ["sharding_specs"]
    SHARDING_SPECS_FIELD_NUMBER: _ClassVar[int]
    sharding_specs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sharding_specs: _Optional[_Iterable[str]] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: str
    def __init__(self, run: _Optional[str] = ...) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ["checkpoints"]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointInfo]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[CheckpointInfo, _Mapping]]] = ...) -> None: ...

class ListTensorsRequest(_message.Message):
    __slots__ = ["latest", "page_size", "page_token", "run", "step"]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    latest: bool
    page_size: int
    page_token: str
    run: str
    step: int
    def __init__(self, run: _Optional[str] = ..., step: _Optional[int] = ..., latest: bool = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTensorsResponse(_message.Message):
    __slots__ = ["next_page_token", "step", "tensors"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    step: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorDescriptor]
    def __init__(self, step: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorDescriptor, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class MemoryRange(_message.Message):
    __slots__ = ["address", "size"]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    address: int
    size: int
    def __init__(self, address: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class ReadStepFileRequest(_message.Message):
    __slots__ = ["file", "length", "offset", "run", "step"]
    FILE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    file: str
    length: int
    offset: int
    run: str
    step: int
    def __init__(self, run: _Optional[str] = ..., step: _Optional[int] = ..., file: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ReadStepFileResponse(_message.Message):
    __slots__ = ["data", "file_size"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FILE_SIZE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    file_size: int
    def __init__(self, file_size: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class RestoreChunk(_message.Message):
    __slots__ = ["data", "offset", "tensor_index"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TENSOR_INDEX_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    tensor_index: int
    def __init__(self, tensor_index: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class RestoreHeader(_message.Message):
    __slots__ = ["bytes_delivered", "note", "peer_bytes_received", "process_memory", "shared_memory_bytes", "shared_memory_offsets", "step", "storage_bytes_read", "tensors", "trainer_state"]
    class TrainerStateEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    BYTES_DELIVERED_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    PEER_BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    PROCESS_MEMORY_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TRAINER_STATE_FIELD_NUMBER: _ClassVar[int]
    bytes_delivered: int
    note: str
    peer_bytes_received: int
    process_memory: bool
    shared_memory_bytes: int
    shared_memory_offsets: _containers.RepeatedScalarFieldContainer[int]
    step: int
    storage_bytes_read: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorDescriptor]
    trainer_state: _containers.ScalarMap[str, bytes]
    def __init__(self, step: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorDescriptor, _Mapping]]] = ..., trainer_state: _Optional[_Mapping[str, bytes]] = ..., note: _Optional[str] = ..., shared_memory_offsets: _Optional[_Iterable[int]] = ..., shared_memory_bytes: _Optional[int] = ..., storage_bytes_read: _Optional[int] = ..., peer_bytes_received: _Optional[int] = ..., bytes_delivered: _Optional[int] = ..., process_memory: bool = ...) -> None: ...

class RestoreReady(_message.Message):
    __slots__ = ["tensor_indices"]
    TENSOR_INDICES_FIELD_NUMBER: _ClassVar[int]
    tensor_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tensor_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ["describe_only", "device_ids", "fallback", "latest", "mesh", "run", "shared_memory", "step", "tensors", "trainer_id", "trainer_state"]
    DESCRIBE_ONLY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    MESH_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TRAINER_ID_FIELD_NUMBER: _ClassVar[int]
    TRAINER_STATE_FIELD_NUMBER: _ClassVar[int]
    describe_only: bool
    device_ids: _containers.RepeatedScalarFieldContainer[int]
    fallback: bool
    latest: bool
    mesh: str
    run: str
    shared_memory: SharedMemory
    step: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorRequest]
    trainer_id: int
    trainer_state: bool
    def __init__(self, run: _Optional[str] = ..., step: _Optional[int] = ..., latest: bool = ..., tensors: _Optional[_Iterable[_Union[TensorRequest, _Mapping]]] = ..., mesh: _Optional[str] = ..., device_ids: _Optional[_Iterable[int]] = ..., trainer_id: _Optional[int] = ..., trainer_state: bool = ..., fallback: bool = ..., shared_memory: _Optional[_Union[SharedMemory, _Mapping]] = ..., describe_only: bool = ...) -> None: ...

class RestoreResponse(_message.Message):
    __slots__ = ["chunk", "header", "ready", "trailer"]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FIELD_NUMBER: _ClassVar[int]
    chunk: RestoreChunk
    header: RestoreHeader
    ready: RestoreReady
    trailer: RestoreTrailer
    def __init__(self, header: _Optional[_Union[RestoreHeader, _Mapping]] = ..., chunk: _Optional[_Union[RestoreChunk, _Mapping]] = ..., trailer: _Optional[_Union[RestoreTrailer, _Mapping]] = ..., ready: _Optional[_Union[RestoreReady, _Mapping]] = ...) -> None: ...

class RestoreTrailer(_message.Message):
    __slots__ = ["peer_bytes_received", "storage_bytes_read"]
    PEER_BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    peer_bytes_received: int
    storage_bytes_read: int
    def __init__(self, storage_bytes_read: _Optional[int] = ..., peer_bytes_received: _Optional[int] = ...) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ["last_commit_seconds", "last_commit_unix_seconds", "last_committed_step", "run"]
    LAST_COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMIT_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    last_commit_seconds: float
    last_commit_unix_seconds: float
    last_committed_step: int
    run: str
    def __init__(self, run: _Optional[str] = ..., last_committed_step: _Optional[int] = ..., last_commit_unix_seconds: _Optional[float] = ..., last_commit_seconds: _Optional[float] = ...) -> None: ...

class SaveHeader(_message.Message):
    __slots__ = ["device_ids", "mesh", "run", "shared_memory", "step", "store_float32_as_bfloat16", "tensors", "trainer_count", "trainer_id", "trainer_state"]
    class TrainerStateEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    MESH_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STORE_FLOAT32_AS_BFLOAT16_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TRAINER_COUNT_FIELD_NUMBER: _ClassVar[int]
    TRAINER_ID_FIELD_NUMBER: _ClassVar[int]
    TRAINER_STATE_FIELD_NUMBER: _ClassVar[int]
    device_ids: _containers.RepeatedScalarFieldContainer[int]
    mesh: str
    run: str
    shared_memory: SharedMemory
    step: int
    store_float32_as_bfloat16: bool
    tensors: _containers.RepeatedCompositeFieldContainer[TensorDescriptor]
    trainer_count: int
    trainer_id: int
    trainer_state: _containers.ScalarMap[str, bytes]
    def __init__(self, run: _Optional[str] = ..., step: _Optional[int] = ..., trainer_id: _Optional[int] = ..., trainer_count: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorDescriptor, _Mapping]]] = ..., mesh: _Optional[str] = ..., device_ids: _Optional[_Iterable[int]] = ..., store_float32_as_bfloat16: bool = ..., trainer_state: _Optional[_Mapping[str, bytes]] = ..., shared_memory: _Optional[_Union[SharedMemory, _Mapping]] = ...) -> None: ...

class SaveRequest(_message.Message):
    __slots__ = ["data", "header"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    header: SaveHeader
    def __init__(self, header: _Optional[_Union[SaveHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class SaveResponse(_message.Message):
    __slots__ = ["bytes_staged", "staging_seconds"]
    BYTES_STAGED_FIELD_NUMBER: _ClassVar[int]
    STAGING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    bytes_staged: int
    staging_seconds: float
    def __init__(self, bytes_staged: _Optional[int] = ..., staging_seconds: _Optional[float] = ...) -> None: ...

class SharedMemory(_message.Message):
    __slots__ = ["fd", "offset", "size"]
    FD_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    fd: int
    offset: int
    size: int
    def __init__(self, fd: _Optional[int] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ["bytes_in_flight", "bytes_staged", "bytes_written", "device_memory", "device_to_host_bytes", "device_to_host_seconds", "gathering", "host_to_device_bytes", "host_to_device_seconds", "memory_steps", "memory_steps_limit", "metrics_address", "num_ranks", "peak_bytes_staged", "pending_steps", "pid", "pooled_bytes", "rank", "ranks", "ranks_as_of_unix_seconds", "read_cache_bytes", "read_cache_hit_bytes", "restore_bytes_delivered", "restore_peer_bytes_received", "restore_storage_bytes_read", "root", "root_free_bytes", "runs", "staging_memory_limit", "started_unix_seconds", "tcp_address", "version"]
    BYTES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    BYTES_STAGED_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TO_HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TO_HOST_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GATHERING_FIELD_NUMBER: _ClassVar[int]
    HOST_TO_DEVICE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_TO_DEVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_STEPS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_STEPS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NUM_RANKS_FIELD_NUMBER: _ClassVar[int]
    PEAK_BYTES_STAGED_FIELD_NUMBER: _ClassVar[int]
    PENDING_STEPS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    POOLED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RANKS_AS_OF_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    READ_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    READ_CACHE_HIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESTORE_BYTES_DELIVERED_FIELD_NUMBER: _ClassVar[int]
    RESTORE_PEER_BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    RESTORE_STORAGE_BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    ROOT_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    STAGING_MEMORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TCP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    bytes_in_flight: int
    bytes_staged: int
    bytes_written: int
    device_memory: str
    device_to_host_bytes: int
    device_to_host_seconds: float
    gathering: _containers.RepeatedCompositeFieldContainer[GatheringStep]
    host_to_device_bytes: int
    host_to_device_seconds: float
    memory_steps: _containers.RepeatedCompositeFieldContainer[KeptStep]
    memory_steps_limit: int
    metrics_address: str
    num_ranks: int
    peak_bytes_staged: int
    pending_steps: _containers.RepeatedCompositeFieldContainer[StepRef]
    pid: int
    pooled_bytes: int
    rank: int
    ranks: _containers.RepeatedCompositeFieldContainer[StatusResponse]
    ranks_as_of_unix_seconds: float
    read_cache_bytes: int
    read_cache_hit_bytes: int
    restore_bytes_delivered: int
    restore_peer_bytes_received: int
    restore_storage_bytes_read: int
    root: str
    root_free_bytes: int
    runs: _containers.RepeatedCompositeFieldContainer[RunStatus]
    staging_memory_limit: int
    started_unix_seconds: float
    tcp_address: str
    version: str
    def __init__(self, rank: _Optional[int] = ..., num_ranks: _Optional[int] = ..., version: _Optional[str] = ..., pending_steps: _Optional[_Iterable[_Union[StepRef, _Mapping]]] = ..., runs: _Optional[_Iterable[_Union[RunStatus, _Mapping]]] = ..., bytes_staged: _Optional[int] = ..., bytes_written: _Optional[int] = ..., root: _Optional[str] = ..., pid: _Optional[int] = ..., peak_bytes_staged: _Optional[int] = ..., staging_memory_limit: _Optional[int] = ..., tcp_address: _Optional[str] = ..., bytes_in_flight: _Optional[int] = ..., pooled_bytes: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[StatusResponse, _Mapping]]] = ..., ranks_as_of_unix_seconds: _Optional[float] = ..., device_to_host_bytes: _Optional[int] = ..., device_to_host_seconds: _Optional[float] = ..., host_to_device_bytes: _Optional[int] = ..., host_to_device_seconds: _Optional[float] = ..., device_memory: _Optional[str] = ..., memory_steps: _Optional[_Iterable[_Union[KeptStep, _Mapping]]] = ..., memory_steps_limit: _Optional[int] = ..., restore_storage_bytes_read: _Optional[int] = ..., restore_bytes_delivered: _Optional[int] = ..., restore_peer_bytes_received: _Optional[int] = ..., read_cache_hit_bytes: _Optional[int] = ..., read_cache_bytes: _Optional[int] = ..., gathering: _Optional[_Iterable[_Union[GatheringStep, _Mapping]]] = ..., metrics_address: _Optional[str] = ..., started_unix_seconds: _Optional[float] = ..., root_free_bytes: _Optional[int] = ...) -> None: ...

class StepRef(_message.Message):
    __slots__ = ["run", "step"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    run: str
    step: int
    def __init__(self, run: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class TensorDescriptor(_message.Message):
    __slots__ = ["box", "device_boxes", "device_memory", "dtype", "layout", "name", "shape"]
    BOX_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BOXES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    box: Box
    device_boxes: _containers.RepeatedCompositeFieldContainer[Box]
    device_memory: DeviceMemory
    dtype: int
    layout: Layout
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., box: _Optional[_Union[Box, _Mapping]] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., device_boxes: _Optional[_Iterable[_Union[Box, _Mapping]]] = ..., device_memory: _Optional[_Union[DeviceMemory, _Mapping]] = ...) -> None: ...

class TensorRequest(_message.Message):
    __slots__ = ["box", "device_memory", "dtype", "host_memory", "layout", "name", "process_memory", "shape"]
    BOX_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    HOST_MEMORY_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROCESS_MEMORY_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    box: Box
    device_memory: DeviceMemory
    dtype: int
    host_memory: SharedMemory
    layout: Layout
    name: str
    process_memory: _containers.RepeatedCompositeFieldContainer[MemoryRange]
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., box: _Optional[_Union[Box, _Mapping]] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., device_memory: _Optional[_Union[DeviceMemory, _Mapping]] = ..., host_memory: _Optional[_Union[SharedMemory, _Mapping]] = ..., process_memory: _Optional[_Iterable[_Union[MemoryRange, _Mapping]]] = ...) -> None: ...

class WaitRequest(_message.Message):
    __slots__ = ["allow_unknown_run", "run", "step"]
    ALLOW_UNKNOWN_RUN_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    allow_unknown_run: bool
    run: str
    step: int
    def __init__(self, run: _Optional[str] = ..., step: _Optional[int] = ..., allow_unknown_run: bool = ...) -> None: ...

class WaitResponse(_message.Message):
    __slots__ = ["path"]
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...
