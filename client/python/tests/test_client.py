"""The Python client against real daemons: bytes out equal bytes in, on both paths."""

import concurrent.futures
import json
import os
import re
import signal
import socket
import time

import grpc
import numpy as np
import pytest

import ckptd

MESH_X2 = "|x=2|0,1|{local}|{devices}"


def mesh_for(device):
    return MESH_X2.format(local=device, devices=f"/job:localhost/replica:0/task:0/device:CPU:{device}")


def model(step):
    rng = np.random.default_rng(step)
    return {
        "w": rng.standard_normal((64, 33)).astype(np.float32),
        "b": rng.standard_normal(33).astype(np.float64),
        "ids": rng.integers(-2**40, 2**40, size=(5, 7), dtype=np.int64),
        "mask": rng.integers(0, 2, size=(3, 3)).astype(np.bool_),
        "half": rng.standard_normal(10).astype(np.float16),
        "count": np.array(step, dtype=np.int32),  # a scalar
    }


def save_from_two_trainers(job, run, step, tensors, transport):
    """Trainer 0 on daemon 0 and trainer 1 on daemon 1 both save every tensor whole
    (data parallel: replicated, each written once)."""
    def trainer(t):
        with job.client(t, transport=transport) as c:
            result = c.save(run, step, tensors, trainer_id=t, trainer_count=2)
            c.wait(run, step)
            return result
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return list(pool.map(trainer, range(2)))


@pytest.mark.parametrize("transport", ["shm", "stream"])
def test_every_dtype_round_trips_bit_exact(job, transport):
    tensors = model(3)
    results = save_from_two_trainers(job, "rt", 3, tensors, transport)
    assert all(r.shared_memory == (transport == "shm") for r in results)
    assert results[0].bytes_staged == sum(a.nbytes for a in tensors.values())
    with job.client(1, transport=transport) as c:
        out = c.restore("rt", 3, {name: (a.shape, None, None) for name, a in tensors.items()})
        assert out.step == 3
        for name, a in tensors.items():
            assert out[name].dtype == a.dtype, name
            assert out[name].shape == a.shape, name
            assert out[name].tobytes() == a.tobytes(), name


@pytest.mark.parametrize("transport", ["shm", "stream"])
def test_restores_into_the_arrays_the_trainer_holds(job, transport):
    tensors = model(4)
    save_from_two_trainers(job, "into", 4, tensors, "shm")
    held = {name: np.full(a.shape, 0, a.dtype) for name, a in tensors.items()}  # touched, as a model is
    rows = [np.zeros((32, 33), np.float32), np.zeros((32, 33), np.float32)]
    with job.client(1, transport=transport) as c:
        out = c.restore("into", 4, {name: ckptd.RestoreSpec(out=a) for name, a in held.items()})
        # On this host (as root) the daemon writes the arrays itself; a stream is copied in.
        assert out.into_trainer_memory == (transport == "shm")
        for name, a in tensors.items():
            assert out[name] is held[name], name
            assert held[name].tobytes() == a.tobytes(), name
        # A layout's boxes, one array per device.
        halves = c.restore("into", 4, {"w": ckptd.RestoreSpec(layout=["x", "unsharded"], out=rows)},
                           mesh="|x=2|0,1|0,1|/job:localhost/replica:0/task:0/device:CPU:0,"
                                "/job:localhost/replica:0/task:0/device:CPU:1", device_ids=[0, 1])
        assert halves["w"][0] is rows[0] and halves["w"][1] is rows[1]
        assert np.array_equal(np.concatenate(rows), tensors["w"])
        # Arrays the daemon could not fill are refused before anything is read.
        with pytest.raises(ValueError, match="out holds"):
            c.restore("into", 4, {"w": ckptd.RestoreSpec(out=np.zeros((64, 32), np.float32))})
        with pytest.raises(ValueError, match="C-contiguous"):
            c.restore("into", 4, {"w": ckptd.RestoreSpec(out=np.zeros((33, 64), np.float32).T)})


def test_auto_uses_shared_memory_and_both_paths_write_identical_files(job):
    tensors = model(1)
    assert save_from_two_trainers(job, "viashm", 1, tensors, "auto")[0].shared_memory
    save_from_two_trainers(job, "viastream", 1, tensors, "stream")
    with job.client(0) as c:
        shm_dir = c.list_checkpoints("viashm")[0]["path"]
        stream_dir = c.list_checkpoints("viastream")[0]["path"]
    for name in ("ckpt.index", "ckpt.data-00000-of-00002", "ckpt.data-00001-of-00002"):
        a = open(os.path.join(shm_dir, name), "rb").read()
        b = open(os.path.join(stream_dir, name), "rb").read()
        assert a and a == b, name


def test_arrays_may_change_once_save_returns(job):
    w = np.arange(1000, dtype=np.float32).reshape(10, 100)
    before = w.copy()
    strided = np.arange(200, dtype=np.int64).reshape(20, 10)[::2, ::3]  # not contiguous
    with job.client(0) as c0, job.client(1) as c1:
        for t, c in enumerate((c0, c1)):
            c.save("async", 1, {"w": w, "s": strided}, trainer_id=t, trainer_count=2)
        w[:] = -1  # before the step is durable
        c0.wait("async", 1)
        out = c1.restore("async", None, {"w": (None, None, None), "s": ((10, 4), None, None)})
    assert np.array_equal(out["w"], before)
    assert np.array_equal(out["s"], np.arange(200, dtype=np.int64).reshape(20, 10)[::2, ::3])


def test_layouts_reshard_and_convert(job):
    full = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    # Save on mesh x=2: trainer t (device t, daemon t) holds rows [4t, 4t+4).
    for t in range(2):
        with job.client(t) as c:
            c.save("lay", 5, {"w": (full[4 * t:4 * t + 4], ["x", "unsharded"])}, trainer_id=t,
                   trainer_count=2, mesh=mesh_for(t), device_ids=[t])
    with job.client(0) as c:
        c.wait("lay", 5)
        # Column halves instead of row halves, converted to float16.
        for t in range(2):
            out = c.restore("lay", 5, {"w": ((8, 6), np.float16, ["unsharded", "x"])},
                            mesh=mesh_for(t), device_ids=[t])
            assert out["w"].dtype == np.float16
            assert np.array_equal(out["w"], full[:, 3 * t:3 * t + 3].astype(np.float16))


def test_trainer_state_barrier_and_status(job):
    arrays = {"v": np.ones(4, dtype=np.int32)}
    with job.client(0) as c0, job.client(1) as c1:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda t: (c0, c1)[t].barrier("st", t, 2), range(2)))
        for t, c in enumerate((c0, c1)):
            c.save("st", 2, arrays, trainer_id=t, trainer_count=2,
                   trainer_state={"iterator": f"position-{t}".encode()})
        c0.wait("st", 2)
        out = c1.restore("st", 2, {"v": (None, None, None)}, trainer_id=1, trainer_state=True)
        assert out.trainer_state == {"iterator": b"position-1"}
        status = c0.status()
        assert status["rank"] == 0 and status["num_ranks"] == 2
        assert status["runs"][0]["last_committed_step"] == 2  # 64-bit integers as int
        assert status["runs"][0]["last_commit_seconds"] > 0
        assert [c["step"] for c in c0.list_checkpoints("st")] == [2]
        assert c1.list_tensors("st") == (2, [("v", np.dtype(np.int32), (4,))])
        assert c1.list_tensors("st", 2) == c1.list_tensors("st")
        with pytest.raises(ckptd.Error) as e:
            c1.list_tensors("st", 3)
        assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_errors_carry_the_grpc_status(job):
    with job.client(0) as c:
        with pytest.raises(ckptd.Error) as e:
            c.restore("nothing", 1, {"w": (None, None, None)})
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(ckptd.Error) as e:
            c.save("../escape", 1, {"w": np.zeros(2, np.float32)})
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "run" in e.value.details
        with pytest.raises(TypeError):
            c.save("r", 1, {"w": np.zeros(2, np.complex64)})
    with pytest.raises(ckptd.Error) as e:
        ckptd.Client(os.path.join(job.dir, "no.sock"), timeout=0.5)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_next_step_stages_while_the_previous_one_commits(job):
    """Save returns once staged, so a trainer may save S+1 before S is durable; both
    commit, in order, and the state file names the newest."""
    clients = [job.client(t) for t in range(2)]
    for step in (1, 2, 3):
        for t, c in enumerate(clients):
            c.save("overlap", step, {"v": np.full(1000, step, np.int32)}, trainer_id=t, trainer_count=2)
    for step in (3, 1, 2):
        clients[0].wait("overlap", step)
    assert [c["step"] for c in clients[1].list_checkpoints("overlap")] == [1, 2, 3]
    state = open(os.path.join(job.root, "overlap", "checkpoint")).read()
    assert state.splitlines()[0] == 'model_checkpoint_path: "step-00000003/ckpt"'
    for step in (1, 2, 3):
        out = clients[1].restore("overlap", step, {"v": (None, None, None)})
        assert np.array_equal(out["v"], np.full(1000, step, np.int32))
    for c in clients:
        c.close()


def test_typed_specs_every_tensor_and_the_newest_step(job):
    rng = np.random.default_rng(3)
    kernel = rng.standard_normal((6, 4)).astype(np.float32)
    mesh = lambda d: f"|x=2|0,1|{d}|/job:localhost/replica:0/task:0/device:CPU:{d}"
    with job.client(0) as c0, job.client(1) as c1:
        assert c0.latest_step("typed") is None and c0.all_steps("typed") == []
        for step in (9, 10, 100):  # numerically, not as strings: 100 is the newest
            for t, c in enumerate((c0, c1)):
                c.save("typed", step, {"kernel": ckptd.TensorSpec(kernel[3 * t:3 * t + 3], ["x", "unsharded"]),
                                       "bias": np.full(4, step, np.int64)},
                       trainer_id=t, trainer_count=2, mesh=mesh(t), device_ids=[t])
            c0.wait("typed", step)
        assert c1.all_steps("typed") == [9, 10, 100] and c1.latest_step("typed") == 100
        every = c1.restore("typed", None)  # no specs: every tensor, whole, as stored
        assert every.step == 100 and sorted(every) == ["bias", "kernel"]
        assert np.array_equal(every["kernel"], kernel) and np.array_equal(every["bias"], np.full(4, 100))
        half = c1.restore("typed", 10, {"kernel": ckptd.RestoreSpec(layout=["x", "unsharded"]),
                                        "bias": ckptd.RestoreSpec(dtype=None)}, mesh=mesh(1), device_ids=[1])
        assert np.array_equal(half["kernel"], kernel[3:]) and np.array_equal(half["bias"], np.full(4, 10))
        streamed = ckptd.Client(job.address(0), transport="stream")
        try:
            got = streamed.restore("typed", 9, {"kernel": None})
            assert np.array_equal(got["kernel"], kernel) and got.step == 9
        finally:
            streamed.close()


def test_a_client_side_timeout_is_told_apart_from_the_daemons_answer(job):
    with job.client(0) as c:
        with pytest.raises(ckptd.Error) as e:
            c.wait("never", 5, timeout=0.3, allow_unknown=True)  # nobody saves it: only our timeout passes
        assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and e.value.client_timeout
        assert e.value.details.startswith(ckptd.client.CLIENT_TIMEOUT)
        with pytest.raises(ckptd.Error) as e:
            c.restore("never", 1, {"w": None})
        assert e.value.code == grpc.StatusCode.NOT_FOUND and not e.value.client_timeout


def test_logs_name_peers_and_log_each_commit_and_restore_as_json_lines(tmp_path):
    from conftest import Job
    job = Job(tmp_path, extra=("--log-format", "json", "--log-level", "debug"))
    try:
        w = np.arange(1024, dtype=np.float32)
        clients = [job.client(t) for t in range(2)]
        for t, c in enumerate(clients):
            c.save("logged", 3, {"w": w}, trainer_id=t, trainer_count=2)
        clients[0].wait("logged", 3)
        clients[1].restore("logged", 3, {"w": None}, trainer_id=1)
        for c in clients:
            c.close()
    finally:
        assert job.stop() == 0
    lines = [line for line in open(job.log_path).read().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]  # every line one valid JSON object
    every_line = {"time", "rank", "host", "level", "msg"}
    assert records and all(every_line <= set(r) <= every_line | {"run", "step", "trainer", "bytes", "seconds"}
                           for r in records), records
    assert {r["host"] for r in records} == {socket.gethostname()}
    me = f"pid {os.getpid()} uid {os.getuid()}"
    restored = [r for r in records if r["level"] == "info" and "restored for" in r["msg"]]
    assert len(restored) == 1 and restored[0]["rank"] == 1, restored
    assert re.search(rf"run 'logged' step 3 restored for {me} \(trainer 1\): 1 tensor\(s\), 4096 bytes "
                     r"delivered in [0-9.]+ s", restored[0]["msg"]), restored[0]["msg"]
    # The facts of each event as fields of their own, for log shippers.
    assert {k: restored[0][k] for k in ("run", "step", "trainer", "bytes")} == \
        {"run": "logged", "step": 3, "trainer": 1, "bytes": 4096}
    assert restored[0]["seconds"] >= 0
    committed = [r for r in records if r["level"] == "info" and "step 3 committed in" in r["msg"]]
    assert {r["rank"] for r in committed} == {0, 1}, committed
    assert all(r["run"] == "logged" and r["step"] == 3 and r["seconds"] > 0
               and f"committed in {r['seconds']:.3f} s" in r["msg"] for r in committed), committed
    # One commit time (rank 0's) on every rank; the replicated "w" is written once.
    assert len({r["seconds"] for r in committed}) == 1 and sum(r["bytes"] for r in committed) == 4096
    staged = [r for r in records if r["level"] == "debug" and "staged trainer" in r["msg"]]
    assert len(staged) == 2 and all(me in r["msg"] and "4096 bytes" in r["msg"] for r in staged), staged
    assert sorted(r["trainer"] for r in staged) == [0, 1] and all(r["bytes"] == 4096 for r in staged)
    assert not [line for line in open(job.log_path) if "fd:" in line]


def json_lines_until(path, found, timeout=60):
    """The JSON lines of `path` once one of them satisfies `found` (the daemon writes
    its log asynchronously to this test; waiting on the line is the synchronisation)."""
    deadline = time.monotonic() + timeout
    while True:
        records = [json.loads(line) for line in open(path).read().splitlines() if line.startswith("{")] \
            if os.path.exists(path) else []
        if any(found(r) for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.01)


def test_sighup_reopens_the_log_file_and_sigusr1_toggles_debug_without_stopping_the_job(tmp_path):
    from conftest import Job
    job = Job(tmp_path, ranks=1, extra=("--log-file", str(tmp_path / "ckptd-{rank}.log"), "--log-format", "json"))
    log, rotated = tmp_path / "ckptd-0.log", tmp_path / "ckptd-0.log.1"
    w = np.arange(16, dtype=np.float32)
    try:
        with job.client(0) as c:
            pid = int(c.status()["pid"])
            assert any("listening on" in r["msg"] for r in json_lines_until(log, lambda r: "listening on" in r["msg"]))
            # logrotate's way: move the file, then SIGHUP; the daemon writes to a new one.
            os.rename(log, rotated)
            os.kill(pid, signal.SIGHUP)
            reopened = json_lines_until(log, lambda r: "SIGHUP: reopened log file" in r["msg"])
            assert [r["msg"] for r in reopened] == [f"SIGHUP: reopened log file {log}"], reopened
            c.save("sig", 1, {"w": w})
            c.wait("sig", 1)
            # SIGUSR1: debug lines (each trainer's staging) appear, and stop again on the next.
            os.kill(pid, signal.SIGUSR1)
            json_lines_until(log, lambda r: r["msg"].startswith("SIGUSR1: log level debug"))
            c.save("sig", 2, {"w": w})
            c.wait("sig", 2)
            os.kill(pid, signal.SIGUSR1)
            json_lines_until(log, lambda r: r["msg"] == "SIGUSR1: log level back to info")
            c.save("sig", 3, {"w": w})
            c.wait("sig", 3)
            assert c.status()["pid"] == pid  # the same daemon, still serving
    finally:
        assert job.stop() == 0
    old = [json.loads(line) for line in open(rotated).read().splitlines()]
    new = [json.loads(line) for line in open(log).read().splitlines()]
    assert not [r for r in old if "committed" in r["msg"]], old
    assert sorted(r["step"] for r in new if "committed in" in r["msg"]) == [1, 2, 3]
    assert sorted(r["step"] for r in new if "staged trainer" in r["msg"]) == [2], new
    # With a log file, mpirun's output gets errors only.
    assert "committed" not in open(job.log_path).read()


def test_a_failed_step_is_logged_at_error_level_with_its_run_and_step(tmp_path):
    from conftest import Job
    job = Job(tmp_path, ranks=1, extra=("--log-format", "json"))
    try:
        with job.client(0) as a, job.client(0) as b:
            # Two trainers disagree on a tensor's shape: the step cannot be planned.
            a.save("bad", 7, {"w": np.zeros(4, np.float32)}, trainer_id=0, trainer_count=2)
            b.save("bad", 7, {"w": np.zeros(8, np.float32)}, trainer_id=1, trainer_count=2)
            with pytest.raises(ckptd.Error):
                a.wait("bad", 7)
    finally:
        assert job.stop() == 0
    records = [json.loads(line) for line in open(job.log_path).read().splitlines() if line.startswith("{")]
    failed = [r for r in records if r.get("run") == "bad" and r.get("step") == 7]
    assert failed and all(r["level"] == "error" for r in failed), failed
    assert not [r for r in records if r["level"] == "warning" and "bad" in r["msg"]], records


def test_the_standard_grpc_health_service_answers(job):
    """grpc.health.v1.Health/Check, as probes call it, with hand-encoded messages:
    HealthCheckRequest{service = 1} and HealthCheckResponse{status = 1}, SERVING = 1."""
    channel = grpc.insecure_channel("unix:" + job.address(0))
    check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    try:
        for service in ("", "ckptd.v1.Ckptd"):
            encoded = service.encode()
            request = (b"\n" + bytes([len(encoded)]) + encoded) if encoded else b""
            assert check(request, timeout=10) == b"\x08\x01", service  # SERVING
        with pytest.raises(grpc.RpcError) as e:
            check(b"\n\x07unknown", timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        channel.close()


def test_dtype_names_as_the_cli_takes_them_and_a_mesh_builder(job):
    w = np.linspace(-2, 2, 24, dtype=np.float32).reshape(6, 4)
    mesh = ckptd.Mesh({"x": 2}, local_device_ids=[0])
    assert str(mesh) == "|x=2|0,1|0|/job:localhost/replica:0/task:0/device:CPU:0"
    clients = [job.client(t) for t in range(2)]
    try:
        for t, c in enumerate(clients):
            c.save("typed", 1, {"w": ckptd.TensorSpec(w[3 * t:3 * t + 3], ["x", "unsharded"]),
                                "step": np.array(1, np.int64)},
                   trainer_id=t, trainer_count=2, mesh=ckptd.Mesh({"x": 2}, local_device_ids=[t]))
        clients[0].wait("typed", 1)
        out = clients[0].restore("typed", 1, {"w": ckptd.RestoreSpec(dtype="bfloat16")})
        assert out.dtypes == {"w": "bfloat16"} and out["w"].dtype == np.uint16
        widened = (out["w"].astype(np.uint32) << 16).view(np.float32)
        assert np.allclose(widened, w, atol=0.02)
        for name, want in [("float16", np.float16), ("half", np.float16), ("torch.float16", np.float16),
                           ("DT_FLOAT", np.float32), (np.float16, np.float16)]:
            out = clients[1].restore("typed", 1, {"w": ckptd.RestoreSpec(dtype=name)})
            assert out["w"].dtype == want and out.dtypes["w"] == np.dtype(want).name, name
        # This trainer's rows over a Mesh, device_ids from it.
        rows = clients[1].restore("typed", 1, {"w": ckptd.RestoreSpec(layout=["x", "unsharded"])},
                                  mesh=ckptd.Mesh({"x": 2}, local_device_ids=[1]))
        assert np.array_equal(rows["w"], w[3:])
        with pytest.raises(TypeError, match="unknown dtype 'float33'"):
            clients[0].restore("typed", 1, {"w": ckptd.RestoreSpec(dtype="float33")})
        with pytest.raises(ValueError, match="outside 0..1"):
            ckptd.Mesh({"x": 2}, local_device_ids=[2])
    finally:
        for c in clients:
            c.close()
    assert "fallback" in ckptd.Client.restore.__doc__
