"""ckptctl against checkpoints real daemons wrote: export (npy, safetensors), diff,
ls, inspect, verify, status, wait and restore, with their JSON and exit codes."""

import json
import os
import re
import shutil
import struct
import subprocess

import numpy as np
import pytest

CKPTCTL = os.environ.get("CKPTCTL_BINARY", "ckptctl")


def ckptctl(*args, env=None):
    return subprocess.run([CKPTCTL, *map(str, args)], capture_output=True, text=True, timeout=120, env=env)


def mesh_for(device):
    return f"|x=2|0,1|{device}|/job:localhost/replica:0/task:0/device:CPU:{device}"


def model(step):
    rng = np.random.default_rng(step)
    return {
        "dense/kernel": rng.standard_normal((6, 4)).astype(np.float32),  # row-sharded below
        "dense/bias": rng.standard_normal(4).astype(np.float32),
        "embedding": rng.integers(0, 1000, size=(10, 3), dtype=np.int64),
        "flags": np.array([True, False, True]),
        "global_step": np.array(step, dtype=np.int64),
    }


def save(job, run, step, tensors, shard_kernel=True, **kwargs):
    """Two trainers, one per daemon; 'dense/kernel' is sharded by rows over mesh x=2,
    so the checkpoint holds it as two slices (with shard_kernel; else it is whole)."""
    clients = [job.client(t) for t in range(2)]
    try:
        for t, c in enumerate(clients):
            mine = {n: a for n, a in tensors.items() if n != "dense/kernel" or not shard_kernel}
            if "dense/kernel" in tensors and shard_kernel:
                k = tensors["dense/kernel"]
                rows = k.shape[0] // 2
                mine["dense/kernel"] = (k[t * rows:(t + 1) * rows], ["x", "unsharded"])
            c.save(run, step, mine, trainer_id=t, trainer_count=2, mesh=mesh_for(t), device_ids=[t], **kwargs)
        clients[0].wait(run, step)
    finally:
        for c in clients:
            c.close()
    return os.path.join(job.root, run)


def read_safetensors(path):
    """A strict reader following the safetensors spec, as the reference library checks:
    u64 header size, a JSON header, offsets contiguous from 0 covering the whole data
    buffer, and each tensor's byte count equal to its shape times its dtype size."""
    sizes = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1}
    numpy_types = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64,
                   "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
                   "U16": np.uint16, "U32": np.uint32, "U64": np.uint64, "BOOL": np.bool_, "BF16": np.uint16}
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n <= 100_000_000 and n % 8 == 0
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in meta.values())
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    expected_start = 0
    out = {}
    for begin, end, name in spans:
        info = header[name]
        assert begin == expected_start, f"{name}: gap or overlap"
        assert end - begin == int(np.prod(info["shape"], dtype=np.int64)) * sizes[info["dtype"]], name
        out[name] = (info["dtype"], np.frombuffer(data[begin:end], numpy_types[info["dtype"]]).reshape(info["shape"]))
        expected_start = end
    assert expected_start == len(data), "trailing bytes"
    return out, meta


def test_export_npy_and_safetensors_assemble_whole_tensors(job, tmp_path):
    tensors = model(1)
    run_dir = save(job, "exp", 1, tensors)
    out = tmp_path / "npy"
    r = ckptctl("export", run_dir, "--format", "npy", "--out", out)
    assert r.returncode == 0, r.stderr
    for name, a in tensors.items():
        got = np.load(out / f"{name}.npy")  # "dense/kernel" -> out/dense/kernel.npy
        assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a), name

    r = ckptctl("export", run_dir, "--format", "safetensors", "--out", tmp_path / "st", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files"][0]["tensors"] == len(tensors)
    got, meta = read_safetensors(tmp_path / "st" / "model.safetensors")
    assert meta["step"] == "1"
    for name, a in tensors.items():
        assert np.array_equal(got[name][1], a), name

    # A regex picks tensors; bfloat16 stays BF16 in safetensors and widens in npy.
    run_dir = save(job, "bf", 1, {"dense/kernel": tensors["dense/kernel"]}, store_float32_as_bfloat16=True)
    r = ckptctl("export", run_dir, "--format", "safetensors", "--out", tmp_path / "bf")
    assert r.returncode == 0, r.stderr
    dtype, bits = read_safetensors(tmp_path / "bf" / "model.safetensors")[0]["dense/kernel"]
    assert dtype == "BF16"
    widened = (bits.astype(np.uint32) << 16).view(np.float32)
    assert np.allclose(widened, tensors["dense/kernel"], rtol=1e-2)
    r = ckptctl("export", run_dir, "--out", tmp_path / "bfnpy", "--tensors", "^dense/")
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(tmp_path / "bfnpy" / "dense" / "kernel.npy"), widened)


def test_diff_names_added_removed_and_changed(job):
    a = model(1)
    b = dict(a)
    b["dense/bias"] = a["dense/bias"] + 1        # changed content
    b["embedding"] = a["embedding"][:5]          # changed shape
    del b["flags"]                               # removed
    b["new"] = np.zeros(2, np.float32)           # added
    save(job, "d", 1, a)
    save(job, "d", 2, b)
    step = lambda s: os.path.join(job.root, "d", f"step-{s:08d}")
    r = ckptctl("diff", step(1), step(2), "--json")
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    assert d["added"] == ["new"] and d["removed"] == ["flags"]
    assert {c["name"]: c["kind"] for c in d["changed"]} == {"dense/bias": "values", "embedding": "shape"}
    assert d["unchanged"] == 2  # dense/kernel (sliced: compared assembled) and global_step
    same = ckptctl("diff", step(1), step(1))
    assert same.returncode == 0 and "0 changed" in same.stdout


def test_ls_inspect_verify(job):
    run_dir = save(job, "l", 1, model(1))
    save(job, "l", 2, model(2))
    r = ckptctl("ls", run_dir, "--json")
    assert r.returncode == 0, r.stderr
    steps = json.loads(r.stdout)
    assert [s["step"] for s in steps] == [1, 2]
    assert [s["latest"] for s in steps] == [False, True]
    assert all(s["bytes"] > 0 and s["created_unix"] > 1.7e9 and s["commit_seconds"] > 0 for s in steps)
    assert "(latest)" in ckptctl("ls", run_dir).stdout.splitlines()[-1]

    r = ckptctl("inspect", run_dir, "--tensors", "^dense/", "--json")
    got = json.loads(r.stdout)
    assert sorted(e["key"] for e in got["entries"]) == ["dense/bias", "dense/kernel"]
    kernel = next(e for e in got["entries"] if e["key"] == "dense/kernel")
    assert kernel["layout"] and len(kernel["slices"]) == 2 and got["mesh"].startswith("|x=2|")
    assert ckptctl("inspect", run_dir, "--tensors", "(").returncode == 2  # a bad regex

    r = ckptctl("verify", run_dir, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True
    piped = ckptctl("verify", run_dir)  # not a terminal: plain progress lines
    assert piped.returncode == 0 and "verify: 100%" in piped.stderr and "\r" not in piped.stderr  # no bar
    data = os.path.join(run_dir, "step-00000002", "ckpt.data-00000-of-00002")
    blob = bytearray(open(data, "rb").read())
    blob[0] ^= 0xFF
    open(data, "wb").write(bytes(blob))
    r = ckptctl("verify", run_dir, "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["ok"] is False
    assert ckptctl("verify", "/nonexistent").returncode == 2


def test_status_wait_and_restore_through_the_daemon(job, tmp_path):
    tensors = model(3)
    save(job, "on", 3, tensors)
    env = dict(os.environ, CKPTD_ADDRESS=job.address(1))
    r = ckptctl("status", "--json", env=env)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["num_ranks"] == 2 and s["asked_rank"] == 1
    assert [rank["rank"] for rank in s["ranks"]] == [0, 1]
    assert all(rank["pid"] > 0 for rank in s["ranks"])
    assert s["ranks"][1]["runs"] == [{"run": "on", "last_committed_step": 3,
                                      "last_commit_unix_seconds": s["ranks"][1]["runs"][0]["last_commit_unix_seconds"],
                                      "last_commit_seconds": s["ranks"][1]["runs"][0]["last_commit_seconds"]}]
    assert s["ranks"][1]["bytes_written"] > 0
    assert "LAST COMMIT" in ckptctl("status", env=env).stdout

    assert ckptctl("wait", "on", 3, env=env).returncode == 0
    assert ckptctl("wait", "on", 3, "--timeout", "10m", env=env).returncode == 0
    assert ckptctl("wait", "on", 99, "--timeout", "1", env=env).returncode == 3
    assert ckptctl("wait", "on", 99, "--timeout", "500ms", env=env).returncode == 3
    # A step that fails: the two trainers disagree on a tensor's shape.
    clients = [job.client(t) for t in range(2)]
    for t, c in enumerate(clients):
        c.save("on", 4, {"v": np.zeros(3 + t, np.float32)}, trainer_id=t, trainer_count=2)
    r = ckptctl("wait", "on", 4, "--json", env=env)
    assert r.returncode == 1 and json.loads(r.stdout)["committed"] is False
    for c in clients:
        c.close()
    assert ckptctl("wait", "on", 3).returncode == 4  # no address anywhere: no daemon

    r = ckptctl("restore", "on", "--out", tmp_path / "r", "--tensors", "kernel|embedding", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["step"] == 3
    assert np.array_equal(np.load(tmp_path / "r" / "dense" / "kernel.npy"), tensors["dense/kernel"])
    assert np.array_equal(np.load(tmp_path / "r" / "embedding.npy"), tensors["embedding"])
    assert not (tmp_path / "r" / "flags.npy").exists()
    # dtypes as TF, numpy and PyTorch users write them.
    for name, want in [("half", np.float16), ("float16", np.float16), ("torch.float16", np.float16),
                       ("float32", np.float32), ("DT_FLOAT", np.float32)]:
        r = ckptctl("restore", "on", "--step", 3, "--out", tmp_path / name, "--dtype", name, "--tensors", "bias",
                    env=env)
        assert r.returncode == 0, r.stderr
        back = np.load(tmp_path / name / "dense" / "bias.npy")
        assert back.dtype == want and np.array_equal(back, tensors["dense/bias"].astype(want)), name
    r = ckptctl("restore", "on", "--out", tmp_path / "x", "--dtype", "float33", env=env)
    assert r.returncode == 2 and "unknown dtype 'float33'" in r.stderr, r.stderr
    r = ckptctl("restore", "on", "--out", tmp_path / "x", "--tensors", "^nothing$", env=env)
    assert r.returncode == 2 and "matches '^nothing$'" in r.stderr, r.stderr
    r = ckptctl("restore", "on", "--out", tmp_path / "p", env=env)
    assert r.returncode == 0 and "restore: 100%" in r.stderr and not list(tmp_path.glob("p/**/*.partial"))
    assert "restore:" not in ckptctl("restore", "on", "--out", tmp_path / "q", "-q", env=env).stderr


def test_a_checksum_failure_during_restore_exits_one(job, tmp_path):
    run_dir = save(job, "torn", 2, model(2))
    data = os.path.join(run_dir, "step-00000002", "ckpt.data-00000-of-00002")
    with open(data, "r+b") as f:
        f.seek(0)
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    env = dict(os.environ, CKPTD_ADDRESS=job.address(0))
    r = ckptctl("restore", "torn", "--out", tmp_path / "r", env=env)
    assert r.returncode == 1 and "DATA_LOSS" not in r.stderr and "checksum" in r.stderr.lower(), r.stderr


def test_usage_errors_exit_two_and_suggest_the_command_meant():
    r = ckptctl()
    assert r.returncode == 2 and "one of: ls" in r.stderr, r.stderr
    r = ckptctl("verfy", "/tmp")
    assert r.returncode == 2 and "did you mean 'verify'" in r.stderr, r.stderr
    r = ckptctl("ls", "--jsn", "/tmp")
    assert r.returncode == 2 and "did you mean '--json'" in r.stderr, r.stderr
    assert ckptctl("wait", "run", "abc").returncode == 2
    r = ckptctl("wait", "run", "1", "--timeout", "10x")
    assert r.returncode == 2 and "--timeout" in r.stderr, r.stderr
    for binary in (CKPTCTL, os.environ.get("CKPTD_BINARY", "ckptd")):
        r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip(), r.stdout + r.stderr
    r = subprocess.run([os.environ.get("CKPTD_BINARY", "ckptd"), "--rot", "/tmp/x"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "did you mean '--root'" in r.stderr, r.stderr
    # Numeric limits in words, not the digits of the largest double.
    r = ckptctl("gc", "/tmp", "--keep-last", "0")
    assert r.returncode == 2 and "--keep-last: must be an integer 1 or more, not '0'" in r.stderr, r.stderr
    assert len(r.stderr) < 200, r.stderr
    r = ckptctl("diff", "/tmp", "/tmp", "--atol", "-1")
    assert r.returncode == 2 and "must be a number 0 or more, not '-1'" in r.stderr, r.stderr


def test_addresses_as_people_write_them_and_a_missing_daemon_answers_at_once(job, tmp_path):
    import socket

    import ckptd
    relative = os.path.relpath(job.address(0), job.dir)  # sock/ckptd-0.sock
    for address in (relative, "./" + relative, "unix:" + relative):
        r = subprocess.run([CKPTCTL, "status", "--address", address, "--json"], cwd=job.dir, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and json.loads(r.stdout)["ranks"], address + ": " + r.stderr
    here = os.getcwd()
    os.chdir(job.dir)
    try:
        with ckptd.Client(relative) as c:
            assert c.status()["rank"] == 0
    finally:
        os.chdir(here)
    assert ckptd.daemon_target("sock/0.sock") == "unix:sock/0.sock"
    assert ckptd.daemon_target("node7:7070") == "node7:7070"
    assert ckptd.daemon_target("unix:/x.sock") == "unix:/x.sock"

    # No socket file, and a socket file nothing accepts on: said at once, with what to do.
    missing = str(tmp_path / "none.sock")
    r = ckptctl("status", "--address", missing)
    assert r.returncode != 0 and f"no ckptd is listening on unix:{missing}: no such socket file" in r.stderr, \
        r.stderr
    assert "is the daemon running?" in r.stderr and "within" not in r.stderr, r.stderr
    dead = str(tmp_path / "dead.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(dead)
    listener.close()  # the file stays; nothing listens
    r = ckptctl("wait", "run", "1", "--address", dead)
    assert r.returncode != 0 and "nothing accepts on it" in r.stderr, r.stderr
    # Without an address: $CKPTD_ADDRESS, else the default socket, named when it fails.
    env = {k: v for k, v in os.environ.items() if k != "CKPTD_ADDRESS"}
    r = ckptctl("status", env=env)
    if r.returncode != 0:
        assert ckptd.default_socket_path() in r.stderr and "the default socket" in r.stderr, r.stderr
    r = ckptctl("status", "--json", env=dict(env, CKPTD_ADDRESS=job.address(1)))
    assert r.returncode == 0 and json.loads(r.stdout)["asked_rank"] == 1, r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="hiding the daemon's files takes root and unshare(1)")
def test_restore_needs_no_view_of_the_daemons_files(job, tmp_path):
    tensors = model(5)
    save(job, "hidden", 5, tensors)
    # ckptctl runs in its own mount namespace with an empty tmpfs over the daemons'
    # root: all it knows of the checkpoint comes through the API.
    hide = 'mount -t tmpfs none "$1" && shift && test -z "$(ls -A "$ROOT")" && exec "$@"'
    env = dict(os.environ, CKPTD_ADDRESS=job.address(0), ROOT=job.root)
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", hide, "hide", job.root,
                        CKPTCTL, "restore", "hidden", "--out", str(tmp_path / "r"), "--json"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["step"] == 5
    assert sorted(f["name"] for f in out["files"]) == ["dense/bias", "dense/kernel", "embedding", "flags",
                                                     "global_step"]
    for name, array in tensors.items():
        back = np.load(tmp_path / "r" / (name + ".npy"))
        assert back.dtype == array.dtype and np.array_equal(back, array), name


@pytest.mark.parametrize("command", ["ls", "inspect", "verify", "export", "diff", "gc", "status", "wait", "latest",
                                     "restore", "import"])
def test_every_command_has_help_with_exit_codes(command):
    r = ckptctl(command, "--help")
    assert r.returncode == 0 and "Exit codes" in r.stdout, r.stdout + r.stderr


def flip_first_byte(run_dir, step):
    data = os.path.join(run_dir, f"step-{step:08d}", "ckpt.data-00000-of-00002")
    with open(data, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))


EXIT_CODES = {0: "ok", 1: "data problem", 2: "usage or input", 3: "timed out", 4: "no daemon"}


def test_one_exit_code_contract_for_every_command(job, tmp_path):
    """Every command against a corrupt step and against a daemon that is not there:
    1 for the data, 4 for the daemon, 2 for usage, 3 for a timeout. A failed export or
    restore leaves nothing in its output directory."""
    run_dir = save(job, "bad", 1, model(1))
    save(job, "bad", 2, model(2))
    flip_first_byte(run_dir, 2)
    step = os.path.join(run_dir, "step-00000002")
    entries = json.loads(ckptctl("inspect", step, "--json").stdout)["entries"]
    first = next(e["key"] for e in entries if e["shard"] == 0 and e["offset"] == 0)
    env = dict(os.environ, CKPTD_ADDRESS=job.address(0))
    missing = str(tmp_path / "no-daemon.sock")
    out = tmp_path / "out"
    corrupt = {
        "verify": (["verify", step], 1),
        "verify --all": (["verify", run_dir, "--all", "-q"], 1),
        "verify --address": (["verify", "bad", "--step", 2, "-q"], 1),
        "latest --verified": (["latest", step, "--verified"], 2),  # a step directory is not a run
        "inspect --values": (["inspect", step, "--values", first], 1),
        "inspect --stats": (["inspect", step, "--stats"], 1),
        "inspect --address --stats": (["inspect", "bad", "--step", 2, "--stats"], 1),
        "export": (["export", step, "--out", out / "e", "-q"], 1),
        "export safetensors": (["export", step, "--format", "safetensors", "--out", out / "s", "-q"], 1),
        "export --address": (["export", "bad", "--step", 2, "--out", out / "a", "-q"], 1),
        "diff --atol 0": (["diff", os.path.join(run_dir, "step-00000001"), step, "--atol", 0], 1),
        "restore": (["restore", "bad", "--step", 2, "--out", out / "r", "-q"], 1),
        "inspect (index only)": (["inspect", step], 0),
        "restore --fallback": (["restore", "bad", "--fallback", "--out", out / "f", "-q"], 0),
    }
    got = {}
    for what, (argv, _) in corrupt.items():
        if "--address" in what:
            argv = [argv[0], *argv[1:], "--address", job.address(0)]
        got[what] = ckptctl(*argv, env=env).returncode
    print("\n".join(f"{what:<28} exit {code}" for what, code in got.items()))
    assert got == {what: code for what, (_, code) in corrupt.items()}
    # Nothing of a failed export or restore is left, not even the directory it made.
    assert sorted(os.listdir(out)) == ["f"], os.listdir(out)

    down = {
        "status": ["status"],
        "wait": ["wait", "bad", 1],
        "restore": ["restore", "bad", "--out", out / "d"],
        "ls --address": ["ls", "bad"],
        "latest --address": ["latest", "bad"],
        "inspect --address": ["inspect", "bad"],
        "verify --address": ["verify", "bad"],
        "export --address": ["export", "bad", "--out", out / "d"],
    }
    for what, argv in down.items():
        r = ckptctl(*argv, "--address", missing)
        print(f"{what + ' (no daemon)':<28} exit {r.returncode}")
        assert r.returncode == 4 and "no ckptd is listening" in r.stderr, (what, r.returncode, r.stderr)
    assert not (out / "d").exists()
    # Without --address or $CKPTD_ADDRESS: the default socket, not there for this test's user.
    r = ckptctl("status", env=dict(env, CKPTD_ADDRESS=missing))
    assert r.returncode == 4, r.stderr

    usage = {
        "bad flag": ["ls", "--jsn", run_dir],
        "not a checkpoint": ["inspect", tmp_path / "nothing"],
        "bad --timeout": ["status", "--timeout", "soon"],
        "unknown run": ["wait", "never-saved", 1],
        "restore into a full --out": ["restore", "bad", "--step", 1, "--out", out],
    }
    for what, argv in usage.items():
        r = ckptctl(*argv, env=env)
        print(f"{what:<28} exit {r.returncode}")
        assert r.returncode == 2, (what, r.returncode, r.stderr)
    r = ckptctl("wait", "bad", 99, "--timeout", "200ms", env=env)
    print(f"{'wait --timeout 200ms':<28} exit {r.returncode}")
    assert r.returncode == 3, r.stderr


def test_wait_on_an_unknown_run_answers_at_once_and_timeout_bounds_every_command(job, tmp_path):
    env = dict(os.environ, CKPTD_ADDRESS=job.address(1))
    # Waited on with the default 10 minutes: the answer comes at once, naming the run.
    r = ckptctl("wait", "typo-run", 5, env=env)
    assert r.returncode == 2 and "run 'typo-run': this daemon has no step of it" in r.stderr, r.stderr
    assert "--allow-unknown" in r.stderr, r.stderr
    import ckptd
    with job.client(1) as c:
        with pytest.raises(ckptd.Error) as e:
            c.wait("typo-run", 5)
        assert e.value.code.name == "NOT_FOUND"
    # A watcher started before the run's first save waits for it.
    r = ckptctl("wait", "typo-run", 5, "--allow-unknown", "--timeout", "300ms", env=env)
    assert r.returncode == 3, r.stderr
    watcher = subprocess.Popen([CKPTCTL, "wait", "soon", "1", "--allow-unknown", "--json"], env=env,
                               stdout=subprocess.PIPE, text=True)
    save(job, "soon", 1, model(1))
    assert watcher.wait(timeout=120) == 0 and json.loads(watcher.stdout.read())["committed"] is True
    watcher.stdout.close()
    # A run only on disk (saved before this daemon started) is known too.
    assert ckptctl("wait", "soon", 1, env=env).returncode == 0
    # --timeout is on every online command and parses durations as elsewhere.
    for argv in (["status"], ["ls", "soon"], ["latest", "soon"], ["inspect", "soon"], ["verify", "soon", "-q"],
                 ["restore", "soon", "--out", tmp_path / "t", "-q"]):
        r = ckptctl(*argv, "--timeout", "1m", "--address", job.address(1))
        assert r.returncode == 0, (argv, r.stderr)


@pytest.fixture
def metrics_job(tmp_path):
    from conftest import Job
    (tmp_path / "metrics-job").mkdir()
    j = Job(tmp_path / "metrics-job", extra=("--metrics-address", "127.0.0.1:0"))
    yield j
    assert j.stop() == 0, open(j.log_path).read()


def restores_counted(job, run):
    """ckptd_restores_total{run} on rank 0's /metrics (counted before a restore's reply
    completes, so a finished restore is always in it)."""
    import re
    import urllib.request
    with job.client(0) as c:
        address = c.status()["metrics_address"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as r:
        page = r.read().decode()
    found = re.search(r'^ckptd_restores_total\{run="%s"\} (\S+)$' % run, page, re.M)
    return float(found.group(1)) if found else 0.0


def test_restore_dtype_converts_floats_only_and_writes_nothing_on_failure(metrics_job, tmp_path):
    job = metrics_job
    tensors = model(6)
    save(job, "dt", 6, tensors)
    env = dict(os.environ, CKPTD_ADDRESS=job.address(0))
    # --dtype applies to floating tensors; integers and bools stay as stored.
    r = ckptctl("restore", "dt", "--out", tmp_path / "h", "--dtype", "float16", "--json", env=env)
    assert r.returncode == 0, r.stderr
    dtypes = {f["name"]: f["dtype"] for f in json.loads(r.stdout)["files"]}
    assert dtypes == {"dense/bias": "half", "dense/kernel": "half", "embedding": "int64", "flags": "bool",
                      "global_step": "int64"}
    assert np.load(tmp_path / "h" / "global_step.npy") == 6
    assert np.array_equal(np.load(tmp_path / "h" / "dense" / "kernel.npy"),
                          tensors["dense/kernel"].astype(np.float16))
    # --dtype-for names the exceptions.
    r = ckptctl("restore", "dt", "--out", tmp_path / "x", "--dtype", "float16", "--dtype-for",
                "dense/bias=float32", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "x" / "dense" / "bias.npy").dtype == np.float32
    assert np.load(tmp_path / "x" / "dense" / "kernel.npy").dtype == np.float16
    # A conversion the daemon lacks, a tensor the step lacks, a dtype that is not
    # floating: said before anything is written.
    for argv, words in [(["--dtype-for", "embedding=float32"], "int64 cannot become float"),
                        (["--dtype-for", "nope=float32"], "no tensor named 'nope'"),
                        (["--dtype", "int32"], "applies to floating tensors"),
                        (["--dtype-for", "dense/bias"], "want NAME=DTYPE")]:
        r = ckptctl("restore", "dt", "--out", tmp_path / "bad", *argv, env=env)
        assert r.returncode == 2 and words in r.stderr, (argv, r.stderr)
        assert not (tmp_path / "bad").exists()
    # An --out with files in it is refused without --force; an empty one is fine.
    r = ckptctl("restore", "dt", "--out", tmp_path / "h", env=env)
    assert r.returncode == 2 and "--force" in r.stderr, r.stderr
    r = ckptctl("restore", "dt", "--out", tmp_path / "h", "--force", "-q", env=env)
    assert r.returncode == 0 and np.load(tmp_path / "h" / "global_step.npy") == 6, r.stderr
    (tmp_path / "empty").mkdir()
    assert ckptctl("restore", "dt", "--out", tmp_path / "empty", "-q", env=env).returncode == 0
    # One request for the whole restore, not one per tensor: the daemon counts one.
    before = restores_counted(job, "dt")
    r = ckptctl("restore", "dt", "--out", tmp_path / "one", "--json", env=env)
    assert r.returncode == 0 and len(json.loads(r.stdout)["files"]) == 5, r.stderr
    assert restores_counted(job, "dt") - before == 1


def test_finding_the_newest_good_checkpoint(job, tmp_path):
    run_dir = save(job, "good", 1, model(1))
    save(job, "good", 2, model(2))
    save(job, "other", 7, model(7))
    # ls of the root lists its runs; of a step directory or an empty one, a usage error.
    r = ckptctl("ls", job.root, "--json")
    assert r.returncode == 0, r.stderr
    assert [(x["run"], x["steps"], x["latest"]) for x in json.loads(r.stdout)] == [("good", 2, 2), ("other", 1, 7)]
    assert "good" in ckptctl("ls", job.root).stdout
    r = ckptctl("ls", os.path.join(run_dir, "step-00000002"))
    assert r.returncode == 2 and "is a step directory" in r.stderr, r.stderr
    (tmp_path / "empty").mkdir()
    r = ckptctl("ls", tmp_path / "empty")
    assert r.returncode == 2 and "no committed step and no run" in r.stderr, r.stderr
    # inspect, verify, export and diff of a root name its runs instead of picking one.
    for command in (["inspect", job.root], ["verify", job.root], ["diff", job.root, run_dir],
                    ["export", job.root, "--out", tmp_path / "x"]):
        r = ckptctl(*command)
        assert r.returncode == 2 and "is a checkpoint root with run(s) good, other: name a run" in r.stderr, r.stderr
    # inspect finds a run's newest step as ls does, even without TF's state file.
    os.remove(os.path.join(run_dir, "checkpoint"))
    r = ckptctl("inspect", run_dir)
    assert r.returncode == 0 and "step-00000002/ckpt:" in r.stdout.splitlines()[0], r.stdout + r.stderr
    r = ckptctl("inspect", run_dir, "--step", 1)
    assert r.returncode == 0 and "step-00000001/ckpt:" in r.stdout.splitlines()[0], r.stdout + r.stderr

    r = ckptctl("latest", run_dir, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["step"] == 2, r.stdout + r.stderr
    flip_first_byte(run_dir, 2)
    assert ckptctl("latest", run_dir).stdout.split()[0] == "2"  # not read without --verified
    r = ckptctl("latest", run_dir, "--verified", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["step"] == 1 and [s["step"] for s in out["skipped"]] == [2], r.stdout
    r = ckptctl("verify", run_dir, "--all", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and [(s["step"], s["ok"]) for s in out["steps"]] == [(1, True), (2, False)], r.stdout
    assert ckptctl("verify", run_dir, "--step", 1).returncode == 0
    assert ckptctl("verify", run_dir, "--step", 2).returncode == 1
    # The same through a daemon, by run name.
    r = ckptctl("latest", "good", "--address", job.address(1), "--verified", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["step"] == 1 and [s["step"] for s in out["skipped"]] == [2], r.stdout
    r = ckptctl("latest", "nothing", "--address", job.address(1))
    assert r.returncode == 2 and "no committed step" in r.stderr, r.stderr

    env = dict(os.environ, CKPTD_ADDRESS=job.address(0))
    r = ckptctl("restore", "good", "--out", tmp_path / "plain", env=env)
    assert r.returncode == 1 and "checksum mismatch" in r.stderr, r.stderr
    r = ckptctl("restore", "good", "--fallback", "--out", tmp_path / "r", "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["step"] == 1 and [s["step"] for s in out["skipped_steps"]] == [2], out
    for name, array in model(1).items():
        assert np.array_equal(np.load(tmp_path / "r" / (name + ".npy")), array), name
    flip_first_byte(run_dir, 1)
    assert ckptctl("latest", run_dir, "--verified").returncode == 1
    # A run whose only step is bad (read for the first time: the daemon's read cache
    # holds no verified copy of it): nothing to fall back to.
    flip_first_byte(os.path.join(job.root, "other"), 7)
    r = ckptctl("restore", "other", "--fallback", "--out", tmp_path / "none", env=env)
    assert r.returncode == 1 and "checksum mismatch" in r.stderr, r.stderr


def test_gc_applies_retention_and_removes_what_a_crash_left(job, tmp_path):
    for step in (1, 2, 3):
        run_dir = save(job, "gc", step, model(step))
    # What a crash can leave: a temp step directory and a half-deleted one.
    for orphan in (".tmp-step-00000009", ".deleted-step-00000004"):
        os.makedirs(os.path.join(run_dir, orphan, "junk"))
    r = ckptctl("ls", run_dir, "--all", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and [s["step"] for s in out["steps"]] == [1, 2, 3], r.stdout
    assert sorted(os.path.basename(p) for p in out["orphans"]) == [".deleted-step-00000004", ".tmp-step-00000009"]
    assert "orphan" in ckptctl("ls", run_dir, "--all").stdout
    # --dry-run --json agrees with what it would do and touches nothing.
    r = ckptctl("gc", run_dir, "--keep-last", 1, "--dry-run", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["removed"] == [1, 2] and out["kept"] == [3], r.stdout
    assert len(out["orphans"]) == 2
    assert "would remove step 1" in ckptctl("gc", run_dir, "--keep-last", 1, "--dry-run").stdout
    assert sorted(os.listdir(run_dir)) == sorted([".tmp-step-00000009", ".deleted-step-00000004", "checkpoint",
                                                  "step-00000001", "step-00000002", "step-00000003"])
    # While the job's daemons run on this root, their temp directories are theirs.
    r = ckptctl("gc", run_dir, "--keep-last", 2, "--keep-every-n-steps", 0, "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["removed"] == [1] and out["kept"] == [2, 3], r.stdout
    assert out["orphans_left_to_daemon"].endswith(".lock") and os.path.isdir(os.path.join(run_dir, ".tmp-step-00000009"))
    # A copy of the run on a root no daemon uses: gc removes the orphans too.
    copy = tmp_path / "quiet-root" / "gc"
    shutil.copytree(run_dir, copy)
    r = ckptctl("gc", copy, "--keep-last", 1, "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["removed"] == [2] and "orphans_left_to_daemon" not in out, r.stdout
    assert sorted(os.listdir(copy)) == ["checkpoint", "step-00000003"]
    r = ckptctl("gc", run_dir, "--keep-last", 1)
    assert r.returncode == 0 and "gc: 100% (1 of 1 steps)" in r.stderr, r.stderr


def run_with_stderr_on_a_terminal(argv):
    """Runs argv with stderr on a pseudo-terminal; returns (CompletedProcess, what it wrote there).

    The terminal is drained until the last writer closes it (EIO), not with one read:
    a single read returns only what the line discipline has passed on so far, and
    output larger than the terminal's buffer would block the child."""
    import pty
    import threading
    leader, follower = pty.openpty()
    chunks = []

    def drain():
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        r = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, stderr=follower, timeout=120)
    finally:
        os.close(follower)
        reader.join(timeout=120)
        os.close(leader)
    return r, b"".join(chunks).decode()


def test_export_never_overwrites_unasked_and_shards_large_models(job, tmp_path):
    tensors = model(4)
    run_dir = save(job, "ex", 4, tensors, trainer_state={"next_step": b"5"})
    out = tmp_path / "st"
    r = ckptctl("export", run_dir, "--format", "safetensors", "--out", out, "--json")
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    # The trainer state (string scalars) has no safetensors dtype: reported, not dropped silently.
    assert [s["dtype"] for s in first["skipped"]] == ["string", "string"]
    got, meta = read_safetensors(out / "model.safetensors")
    assert sorted(got) == sorted(tensors)
    assert meta == {"format": "pt", "run": "ex", "step": "4"}  # no paths: the file may travel
    before = (out / "model.safetensors").read_bytes()
    # A second export into the same place refuses; a filter matching nothing fails.
    r = ckptctl("export", run_dir, "--format", "safetensors", "--out", out)
    assert r.returncode == 2 and "--force" in r.stderr, r.stderr
    r = ckptctl("export", run_dir, "--format", "safetensors", "--out", out, "--force", "--tensors", "^nothing$")
    assert r.returncode == 2 and "no tensor" in r.stderr and "matches '^nothing$'" in r.stderr, r.stderr
    assert (out / "model.safetensors").read_bytes() == before
    r = ckptctl("export", run_dir, "--out", tmp_path / "npy", "--tensors", "_ckptd")
    assert r.returncode == 2 and "nothing to export" in r.stderr, r.stderr
    r = ckptctl("export", run_dir, "--out", tmp_path / "npy")
    assert r.returncode == 0 and "skipped 2 with no npy dtype" in r.stdout, r.stdout + r.stderr
    assert "export: 100%" in r.stderr and "\r" not in r.stderr, r.stderr  # piped: lines, never a bar
    assert not list(tmp_path.glob("npy/**/*.partial"))
    # On a terminal, a progress bar (stderr through a pseudo-terminal).
    r, bar = run_with_stderr_on_a_terminal([CKPTCTL, "export", run_dir, "--out", str(tmp_path / "tty")])
    assert r.returncode == 0 and "\rexport [" in bar and "100%" in bar, bar
    assert ckptctl("export", run_dir, "--out", tmp_path / "npy").returncode == 2
    assert ckptctl("export", run_dir, "--out", tmp_path / "npy", "--force").returncode == 0
    # Above --max-shard-size: shards and the index Hugging Face's loaders read; the
    # earlier single file goes, so no stale file sits beside the index.
    r = ckptctl("export", run_dir, "--format", "safetensors", "--out", out, "--force", "--max-shard-size", "100B",
                "--json")
    assert r.returncode == 0, r.stderr
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors", shards
    assert sorted(os.listdir(out)) == sorted(shards + ["model.safetensors.index.json"])
    total = 0
    for shard in shards:
        part, _ = read_safetensors(out / shard)
        for name, (_, array) in part.items():
            assert index["weight_map"][name] == shard and np.array_equal(array, tensors[name]), name
            total += array.nbytes
    assert sorted(index["weight_map"]) == sorted(tensors)
    assert index["metadata"]["total_size"] == total == json.loads(r.stdout)["bytes"]
    assert ckptctl("export", run_dir, "--format", "safetensors", "--out", out, "--max-shard-size", "9q").returncode == 2


def test_diff_compares_logical_tensors_whatever_their_slicing(job):
    a = model(1)
    save(job, "dl", 1, a)                      # dense/kernel as two row slices
    save(job, "dl", 2, a, shard_kernel=False)  # the same values, whole
    b = dict(a)
    b["dense/kernel"] = a["dense/kernel"].copy()
    b["dense/kernel"][1, 2] += 1e-4
    b["dense/kernel"][5, 3] += 2e-6
    b["dense/bias"] = a["dense/bias"].astype(np.float64)
    save(job, "dl", 3, b)
    step = lambda s: os.path.join(job.root, "dl", f"step-{s:08d}")
    kernel = next(e for e in json.loads(ckptctl("inspect", step(2), "--json").stdout)["entries"]
                  if e["key"] == "dense/kernel")
    assert "slices" not in kernel  # stored whole in step 2, as two slices in step 1
    r = ckptctl("diff", step(1), step(2), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["unchanged"] == 5, r.stdout + r.stderr
    r = ckptctl("diff", step(2), step(3), "--json")
    assert r.returncode == 1, r.stderr
    changes = {c["name"]: c for c in json.loads(r.stdout)["changed"]}
    assert {n: c["kind"] for n, c in changes.items()} == {"dense/kernel": "values", "dense/bias": "dtype"}
    k = changes["dense/kernel"]
    assert k["mismatched"] == 2 and k["compared"] == 24 and k["first_mismatch"] == "[1, 2]"
    assert k["max_abs_diff"] == pytest.approx(1e-4, rel=1e-2)
    assert k["a"] == {"dtype": "float", "shape": [6, 4]} and changes["dense/bias"]["b"]["dtype"] == "double"
    # Tolerances as numpy.isclose: one of the two changes is within atol 1e-5.
    r = ckptctl("diff", step(2), step(3), "--tensors", "kernel", "--atol", "1e-5", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["changed"][0]["mismatched"] == 1 and out["tolerance"]["atol"] == 1e-5
    r = ckptctl("diff", step(1), step(3), "--tensors", "kernel", "--atol", "1e-3")
    assert r.returncode == 0 and "0 changed, 1 unchanged" in r.stdout, r.stdout
    r = ckptctl("diff", step(1), step(3), "--tensors", "kernel", "--rtol", "0.5")
    assert r.returncode == 0, r.stdout
    r = ckptctl("diff", step(1), step(3), "--tensors", "kernel")
    assert r.returncode == 1 and "2 of 24 element(s) differ" in r.stdout, r.stdout
    assert ckptctl("diff", step(1), step(3), "--atol", "-1").returncode == 2


def test_inspect_values_stats_trainer_state_and_checkpoint_facts(job):
    tensors = model(6)
    tensors["odd"] = np.array([[1.5, np.nan, -np.inf], [np.inf, -2.0, 0.25]], np.float32)
    tensors["big"] = np.arange(3000, dtype=np.int32).reshape(30, 100)
    run_dir = save(job, "in", 6, tensors, trainer_state={"next_step": b"7", "rng": b"\x00\xff"})
    r = ckptctl("inspect", run_dir, "--stats", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    stats = {e["key"]: e.get("stats") for e in out["entries"]}
    assert stats["odd"] == {"count": 6, "nan": 1, "pos_inf": 1, "neg_inf": 1, "min": -2.0, "max": 1.5,
                            "mean": pytest.approx(-0.25 / 3)}
    k = tensors["dense/kernel"]  # sliced: statistics of the whole tensor
    assert stats["dense/kernel"]["min"] == pytest.approx(float(k.min()))
    assert stats["dense/kernel"]["mean"] == pytest.approx(float(k.astype(np.float64).mean()))
    assert stats["flags"]["max"] == 1 and stats["flags"]["mean"] == pytest.approx(2 / 3)
    assert stats["_ckptd/trainer_state/0/next_step"] is None
    assert out["trainer_state"] == {"0": {"next_step": "7", "rng": "\x00\ufffd"},
                                    "1": {"next_step": "7", "rng": "\x00\ufffd"}}
    facts = out["checkpoint"]
    assert (facts["run"], facts["step"], facts["trainer_count"], facts["num_hosts"]) == ("in", 6, 2, 2)
    assert [h["rank"] for h in facts["hosts"]] == [0, 1] and all(h["bytes"] > 0 for h in facts["hosts"])
    assert facts["commit_seconds"] > 0 and facts["created_unix"] > 1.7e9
    text = ckptctl("inspect", run_dir, "--stats").stdout
    assert "run in, step 6" in text and "2 trainer(s) on 2 host(s)" in text, text
    assert "trainer 1  rng = b'\\x00\\xff'" in text, text
    assert "min -2.0 max 1.5" in text and "nan 1 +inf 1 -inf 1" in text, text

    r = ckptctl("inspect", run_dir, "--values", "dense/kernel", "--json")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert v["shape"] == [6, 4] and np.array_equal(np.array(v["values"], np.float32), k)
    v = json.loads(ckptctl("inspect", run_dir, "--values", "odd", "--json").stdout)
    assert v["values"] == [[1.5, "nan", "-inf"], ["inf", -2.0, 0.25]]
    text = ckptctl("inspect", run_dir, "--values", "odd").stdout
    assert text.splitlines()[1:] == ["[[1.5, nan, -inf],", " [inf, -2.0, 0.25]]"], text
    text = ckptctl("inspect", run_dir, "--values", "big").stdout  # numpy's summary above 1000 elements
    assert text.splitlines()[1:] == ["[[0, 1, 2, ..., 97, 98, 99],", " [100, 101, 102, ..., 197, 198, 199],",
                                     " [200, 201, 202, ..., 297, 298, 299],", " ...,",
                                     " [2700, 2701, 2702, ..., 2797, 2798, 2799],",
                                     " [2800, 2801, 2802, ..., 2897, 2898, 2899],",
                                     " [2900, 2901, 2902, ..., 2997, 2998, 2999]]"], text
    assert ckptctl("inspect", run_dir, "--values", "global_step").stdout.splitlines()[1] == "6"
    assert ckptctl("inspect", run_dir, "--values", "flags").stdout.splitlines()[1] == "[True, False, True]"
    text = ckptctl("inspect", run_dir, "--values", "_ckptd/trainer_state/0/next_step").stdout
    assert text.splitlines()[1] == "b'7'", text
    r = ckptctl("inspect", run_dir, "--values", "nope")
    assert r.returncode == 2 and "nope" in r.stderr, r.stderr


def test_integers_are_exact_in_inspect_stats_diff_and_json(job):
    """Values beyond 2^53 (and uint64's top half) print, summarize and compare exactly:
    nothing passes through a double."""
    extremes = {f"{t.__name__}": np.array([np.iinfo(t).min, np.iinfo(t).max], t)
                for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)}
    extremes["big"] = np.array([2**53 + 1, 2**62 + 7], np.int64)
    run_dir = save(job, "ints", 1, extremes)
    changed = dict(extremes, big=np.array([2**53, 2**62 + 7], np.int64))
    save(job, "ints", 2, changed)
    step = lambda s: os.path.join(run_dir, f"step-{s:08d}")

    for name, values in extremes.items():
        text = ckptctl("inspect", step(1), "--values", name).stdout
        assert text.splitlines()[1] == "[" + ", ".join(str(int(v)) for v in values) + "]", text
        out = json.loads(ckptctl("inspect", step(1), "--values", name, "--json").stdout)
        assert out["values"] == [int(v) for v in values], out
    stats = {e["key"]: e["stats"] for e in
             json.loads(ckptctl("inspect", step(1), "--stats", "--json").stdout)["entries"]}
    assert (stats["uint64"]["min"], stats["uint64"]["max"]) == (0, 2**64 - 1)
    assert stats["uint64"]["mean_text"] == "9223372036854775807.5" and not stats["uint64"]["mean_rounded"]
    assert (stats["int64"]["min"], stats["int64"]["max"]) == (-2**63, 2**63 - 1)
    assert stats["big"]["mean_text"] == str((2**53 + 1 + 2**62 + 7) // 2) and not stats["big"]["mean_rounded"]
    text = ckptctl("inspect", step(1), "--stats", "--tensors", "^uint64$").stdout
    assert "min 0 max 18446744073709551615 mean 9223372036854775807.5" in text, text

    r = ckptctl("diff", step(1), step(2))
    assert r.returncode == 1 and "1 of 2 element(s) differ" in r.stdout and "max abs diff 1," in r.stdout, r.stdout
    r = ckptctl("diff", step(1), step(2), "--atol", "1", "--json")
    assert r.returncode == 0, r.stdout
    r = ckptctl("diff", step(1), step(2), "--atol", "0.5", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["changed"][0]["max_abs_diff"] == 1, r.stdout


TESTDATA = os.path.join(os.environ.get("CKPTD_SOURCE_DIR", "."), "tests", "testdata", "tf")
NUMPY_DTYPES = {"float": np.float32, "double": np.float64, "int32": np.int32, "int64": np.int64,
                "bool": np.bool_, "half": np.float16, "uint8": np.uint8, "int8": np.int8, "int16": np.int16}


@pytest.mark.parametrize("name", sorted(d for d in os.listdir(TESTDATA) if os.path.isdir(os.path.join(TESTDATA, d)))
                         if os.path.isdir(TESTDATA) else [])
def test_values_of_checkpoints_tensorflow_wrote_match_their_bytes(name):
    """Every value `inspect --values` prints, packed back into its dtype, hashes to the
    sha256 of the entry's bytes in the data file; string scalars print as Python bytes
    literals equal to the stored string."""
    import ast
    import hashlib
    folder = os.path.join(TESTDATA, name)
    expected = json.load(open(os.path.join(folder, "expected.json")))
    target = folder if os.path.exists(os.path.join(folder, "checkpoint")) else os.path.join(folder, "variables")
    checked = 0
    for entry in expected["entries"]:
        if "slices" in entry:
            continue
        key, dtype = entry["key"], entry["dtype"]
        if dtype == "string" and entry["shape"] == []:
            r = ckptctl("inspect", target, "--values", key)
            assert r.returncode == 0, r.stderr
            value = ast.literal_eval(r.stdout.split("\n", 1)[1].strip())
            data = sorted(f for f in os.listdir(folder) if ".data-" in f)[entry["shard"]]
            with open(os.path.join(folder, data), "rb") as f:
                f.seek(entry["offset"])
                raw = f.read(entry["size"])
            assert raw.endswith(value) and len(raw) - len(value) in range(5, 15), key
            checked += 1
        elif dtype in NUMPY_DTYPES:
            r = ckptctl("inspect", target, "--values", key, "--json")
            assert r.returncode == 0, r.stderr
            out = json.loads(r.stdout)
            array = np.array(out["values"], dtype=NUMPY_DTYPES[dtype]).reshape(out["shape"])
            assert hashlib.sha256(array.tobytes()).hexdigest() == entry["sha256"], key
            stats = json.loads(ckptctl("inspect", target, "--stats", "--json", "--tensors",
                                       "^" + key.replace(".", "\\.") + "$").stdout)["entries"][0]["stats"]
            if array.size:
                assert stats["min"] == pytest.approx(float(array.min())) and stats["count"] == array.size, key
                assert stats["mean"] == pytest.approx(float(array.astype(np.float64).mean()), abs=1e-12), key
            checked += 1
    assert checked > 0


def write_safetensors(path, tensors, offsets=None):
    """A safetensors file as the reference writer lays it out; `offsets` overrides
    the data_offsets of named tensors (to write broken files)."""
    names = {np.float32: "F32", np.float64: "F64", np.int64: "I64", np.int32: "I32", np.bool_: "BOOL",
             np.uint8: "U8", np.float16: "F16"}
    header, blobs, at = {}, [], 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": names[a.dtype.type], "shape": list(a.shape),
                        "data_offsets": (offsets or {}).get(name, [at, at + len(raw)])}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_import_makes_a_committed_step_that_trainers_restore_in_any_layout(job, tmp_path):
    # Safetensors as a model hub ships it: two shards and the index.
    src = tmp_path / "hub"
    src.mkdir()
    rng = np.random.default_rng(9)
    tensors = {"embed": rng.standard_normal((8, 6)).astype(np.float32),
               "head/w": rng.standard_normal((6, 4)).astype(np.float16),
               "head/b": np.arange(4, dtype=np.int64), "mask": np.array([True, False])}
    write_safetensors(src / "model-00001-of-00002.safetensors", {"embed": tensors["embed"]})
    write_safetensors(src / "model-00002-of-00002.safetensors", {k: v for k, v in tensors.items() if k != "embed"})
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f"model-0000{1 if k == 'embed' else 2}-of-00002.safetensors"
                                        for k in tensors}}))
    run_dir = os.path.join(job.root, "hub")
    r = ckptctl("import", src, run_dir, "--step", 100, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["step"], out["tensors"], out["source"]) == (100, 4, "safetensors")
    assert ckptctl("verify", run_dir).returncode == 0
    facts = json.loads(ckptctl("inspect", run_dir, "--json").stdout)["checkpoint"]
    assert facts["imported_from"] == "safetensors model (2 file(s))" and facts["run"] == "hub"
    # Each trainer restores its half of the rows of 'embed' (saved whole) over mesh
    # x=2; 'head/w' comes back widened to float32.
    for t in range(2):
        with job.client(t) as c:
            got = c.restore("hub", None, {"embed": ([8, 6], None, ["x", "unsharded"]),
                                          "head/w": (None, np.float32, None), "head/b": (None,), "mask": (None,)},
                            mesh=mesh_for(t), device_ids=[t])
            assert np.array_equal(got["embed"], tensors["embed"][4 * t:4 * t + 4])
            assert got["head/w"].dtype == np.float32
            assert np.array_equal(got["head/w"], tensors["head/w"].astype(np.float32))
            assert np.array_equal(got["head/b"], tensors["head/b"]) and np.array_equal(got["mask"], tensors["mask"])

    # A checkpoint TensorFlow wrote (two data files) into the same run, restored whole.
    tf_src = os.path.join(TESTDATA, "ocr", "variables")
    r = ckptctl("import", tf_src, run_dir, "--step", 200)
    assert r.returncode == 0 and "imported 26 tensor(s)" in r.stdout, r.stdout + r.stderr
    with job.client(1) as c:
        got = c.restore("hub", 200, {"layer-1/kernel/.ATTRIBUTES/VARIABLE_VALUE": (None,)})
    exported = tmp_path / "ocr-npy"
    assert ckptctl("export", tf_src, "--out", exported, "--tensors", "^layer-1/kernel/.ATTR").returncode == 0
    assert np.array_equal(got["layer-1/kernel/.ATTRIBUTES/VARIABLE_VALUE"],
                          np.load(exported / "layer-1" / "kernel" / ".ATTRIBUTES" / "VARIABLE_VALUE.npy"))
    assert ckptctl("diff", tf_src, run_dir).returncode == 0

    # Refusals leave nothing behind: a step that exists, a broken file, a corrupt source.
    before = sorted(os.listdir(run_dir))
    r = ckptctl("import", tf_src, run_dir, "--step", 200)
    assert r.returncode == 2 and "never replaced" in r.stderr, r.stderr
    broken = tmp_path / "broken.safetensors"
    write_safetensors(broken, {"a": np.zeros(4, np.float32), "b": np.zeros(4, np.float32)}, {"b": [8, 24]})
    r = ckptctl("import", broken, run_dir, "--step", 300)
    assert r.returncode == 2 and "gap or overlaps" in r.stderr, r.stderr
    write_safetensors(broken, {"_ckptd/x": np.zeros(1, np.float32)})
    r = ckptctl("import", broken, run_dir, "--step", 300)
    assert r.returncode == 2 and "reserved" in r.stderr, r.stderr
    corrupt = tmp_path / "corrupt"
    shutil.copytree(os.path.join(TESTDATA, "ocr"), corrupt)
    flip = corrupt / "variables.data-00001-of-00002"
    blob = bytearray(flip.read_bytes())
    blob[100] ^= 0xFF
    flip.write_bytes(bytes(blob))
    r = ckptctl("import", corrupt / "variables", run_dir, "--step", 300)
    assert r.returncode == 1 and "does not verify" in r.stderr, r.stderr  # a data problem
    assert sorted(os.listdir(run_dir)) == before
    assert json.loads(ckptctl("latest", run_dir, "--json").stdout)["step"] == 200


def poll_status(env, until, limit=30.0):
    """ckptctl status --json until `until(status)` holds: status is as of the daemons'
    last coordination round, so the test waits for the condition itself, bounded."""
    import time
    deadline = time.monotonic() + limit
    while True:
        out = json.loads(ckptctl("status", "--json", env=env).stdout)
        if until(out) or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


def test_status_names_the_missing_trainers_of_a_step_and_its_deadline(job):
    import time
    env = dict(os.environ, CKPTD_ADDRESS=job.address(1))
    before = time.time()
    with job.client(0) as c:
        c.save("gather", 1, {"v": np.zeros(2, np.float32)}, trainer_id=0, trainer_count=3)
    out = poll_status(env, lambda s: s["gathering"])
    after = time.time()
    assert len(out["gathering"]) == 1, out
    g = out["gathering"][0]
    assert (g["run"], g["step"], g["trainer_count"], g["trainers_staged"], g["missing_trainers"]) == \
        ("gather", 1, 3, 1, [1, 2]), g
    assert before + 60 - 1 <= g["deadline_unix_seconds"] <= after + 60 + 1  # the job's --commit-timeout 60s
    text = ckptctl("status", env=env).stdout
    assert "run 'gather' step 1: 1 of 3 trainer(s) staged; missing 1,2; fails at" in text, text
    for t in (1, 2):
        with job.client(t % 2) as c:
            c.save("gather", 1, {"v": np.zeros(2, np.float32)}, trainer_id=t, trainer_count=3)
    assert ckptctl("wait", "gather", 1, env=env).returncode == 0
    assert poll_status(env, lambda s: not s["gathering"])["gathering"] == []


def test_errors_that_diagnose_permission_missing_steps_roots_and_flags(job):
    run_dir = save(job, "diag", 1, model(1))
    save(job, "diag", 3, model(3))
    # A step the run lacks: the steps it has are listed.
    r = ckptctl("inspect", run_dir, "--step", 7)
    assert r.returncode == 2 and "has no committed step 7; its committed steps: 1, 3" in r.stderr, r.stderr
    # gc of a root (not a run) says so and names the runs.
    r = ckptctl("gc", job.root, "--keep-last", 1)
    assert r.returncode == 2 and "is a checkpoint root with run(s) diag" in r.stderr, r.stderr
    assert sorted(os.listdir(run_dir)) == ["checkpoint", "step-00000001", "step-00000003"]
    # diff reads files only: its help does not speak of --address.
    assert "--address" not in ckptctl("diff", "--help").stdout
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("running as another user takes root and setpriv")
    # Another user, who may not enter the 0700 root: permission denied, with the path.
    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", CKPTCTL]
    for argv in (["ls", run_dir], ["verify", run_dir], ["inspect", run_dir], ["latest", run_dir]):
        r = subprocess.run(nobody + argv, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and f"{run_dir}: permission denied" in r.stderr, (argv, r.stderr)


def test_status_after_a_restart_names_each_runs_last_commit_and_the_metrics_address(tmp_path):
    from conftest import Job
    job = Job(tmp_path, ranks=1)
    try:
        with job.client(0) as c:
            c.save("kept", 4, {"w": np.ones(8, np.float32)})
            c.wait("kept", 4)
    finally:
        assert job.stop() == 0
    job = Job(tmp_path, ranks=1, extra=("--metrics-address", "127.0.0.1:0"))
    try:
        r = ckptctl("status", "--json", "--address", job.address(0))
        assert r.returncode == 0, r.stderr
        rank = json.loads(r.stdout)["ranks"][0]
        assert rank["runs"] == [{"run": "kept", "last_committed_step": 4}], rank["runs"]
        assert rank["metrics_address"].startswith("127.0.0.1:"), rank
        assert "kept step 4" in ckptctl("status", "--address", job.address(0)).stdout
    finally:
        assert job.stop() == 0


def metrics_page(job, rank=0):
    import urllib.request
    with job.client(rank) as c:
        address = c.status()["metrics_address"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as r:
        return r.read().decode()


def metric(page, series):
    """The value of one series line ('name{labels}') of a /metrics page, or None."""
    import re
    found = re.search(r"^%s (\S+)$" % re.escape(series), page, re.M)
    return float(found.group(1)) if found else None


def test_one_commit_time_everywhere_and_status_and_metrics_say_what_the_daemon_is_doing(metrics_job):
    job = metrics_job
    run_dir = save(job, "ct", 1, model(1))
    step_dir = os.path.join(run_dir, "step-00000001")
    status = json.loads(ckptctl("status", "--json", "--address", job.address(0)).stdout)
    ranks = status["ranks"]
    # Uptime, start time and free space on the root, for every rank.
    assert all(r["started_unix_seconds"] > 1.7e9 and r["uptime_seconds"] >= 0 and r["root_free_bytes"] > 0
               for r in ranks), ranks
    # One commit time: rank 0 measures it and every rank, ls, inspect and /metrics show it.
    seconds = {run["last_commit_seconds"] for r in ranks for run in r["runs"] if run["run"] == "ct"}
    assert len(seconds) == 1, ranks
    commit = seconds.pop()
    assert commit > 0
    [listed] = json.loads(ckptctl("ls", run_dir, "--json").stdout)
    assert listed["commit_seconds"] == pytest.approx(commit, abs=1e-9)
    facts = json.loads(ckptctl("inspect", step_dir, "--json").stdout)["checkpoint"]
    assert facts["commit_seconds"] == pytest.approx(commit, abs=1e-9)
    shown = f"{commit:.3f} s"  # one format wherever people read it
    assert shown in ckptctl("ls", run_dir).stdout
    assert f"commit {shown}" in ckptctl("inspect", step_dir).stdout
    text = ckptctl("status", "--address", job.address(0)).stdout
    assert text.count(f"ct step 1 at ") == 2 and text.count(f" in {shown}") == 2, text
    assert re.search(r"^ +0 +\d+ +\d+s ", text, re.M), text  # the UP column
    log = open(job.log_path).read()
    assert log.count(f"run 'ct' step 1 committed in {shown}") == 2, log
    for rank in range(2):
        page = metrics_page(job, rank)
        assert metric(page, 'ckptd_commit_seconds_count{run="ct"}') == 1
        assert metric(page, 'ckptd_commit_seconds_sum{run="ct"}') == pytest.approx(commit, rel=1e-6)
        assert metric(page, f'ckptd_build_info{{version="{ranks[rank]["version"]}"}}') == 1
        assert metric(page, "ckptd_root_free_bytes") > 0
        assert metric(page, "ckptd_start_time_seconds") == pytest.approx(ranks[rank]["started_unix_seconds"])
        committed_at = [run["last_commit_unix_seconds"] for run in ranks[rank]["runs"] if run["run"] == "ct"]
        assert metric(page, 'ckptd_last_commit_timestamp_seconds{run="ct"}') == pytest.approx(committed_at[0])
        assert page.count("# TYPE ckptd_last_commit_timestamp_seconds gauge") == 1
