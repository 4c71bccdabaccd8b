"""examples/train_torch.py: killed mid-run, it resumes from the last committed step on
the same number of trainers with a loss curve bit-equal to a run never interrupted,
and on another number with the same curve to rounding; the commands in its docstring
run as written."""

import math
import os
import re
import subprocess

import pytest

pytest.importorskip("torch", reason="python3-torch is not installed (scripts/install-deps.sh installs it)")

from conftest import daemon_env, run_docstring_demo  # noqa: E402

SOURCE = os.environ.get("CKPTD_SOURCE_DIR", ".")
EXAMPLE = os.path.join(SOURCE, "examples", "train_torch.py")


def train(job, trainers, run, log, *extra):
    cmd = [os.environ.get("MPIEXEC", "mpirun"), "--allow-run-as-root", "--oversubscribe",
           "-np", str(trainers), "-x", "PYTHONPATH", "/usr/bin/python3", EXAMPLE,
           "--socket", os.path.join(job.dir, "sock", "ckptd-{rank}.sock"), "--run", run,
           "--steps", "30", "--checkpoint-every", "10", "--loss-log", log, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=daemon_env())


def lines(path):
    return [(int(s), float(loss)) for s, loss in (line.split("\t") for line in open(path).read().splitlines())]


def test_killed_it_resumes_on_the_same_and_on_another_number_of_trainers(job, tmp_path):
    ref_log = str(tmp_path / "ref.tsv")
    done = train(job, 4, "ref", ref_log)
    assert done.returncode == 0, done.stdout + done.stderr
    ref = dict(lines(ref_log))
    assert sorted(ref) == list(range(1, 31)) and ref[30] < ref[1]  # it does learn

    for trainers_after in (4, 3, 2):
        run, log = f"t{trainers_after}", str(tmp_path / f"t{trainers_after}.tsv")
        killed = train(job, 4, run, log, "--die-at", "25")
        assert killed.returncode != 0 and [s for s, _ in lines(log)] == list(range(1, 26))
        resumed = train(job, trainers_after, run, log)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert f"resumed run '{run}' from step 20 on {trainers_after} trainer(s)" in resumed.stdout, resumed.stdout
        got = lines(log)
        assert [s for s, _ in got] == list(range(1, 26)) + list(range(21, 31))
        after = got[25:]
        if trainers_after == 4:  # the same trainers: the same sums, bit for bit
            assert all(loss == ref[s] for s, loss in after), [(s, loss, ref[s]) for s, loss in after]
        else:  # the same batches and state, summed in another order
            assert all(math.isclose(loss, ref[s], rel_tol=1e-4) for s, loss in after), \
                [(s, loss, ref[s]) for s, loss in after]


def test_the_commands_in_the_docstring_run_as_written(tmp_path):
    demo = str(tmp_path / "demo")
    second, killed, resumed = run_docstring_demo(EXAMPLE, "/tmp/torch-demo", demo)
    claimed = re.search(r"# resumes from step (\d+) on (\d+) trainers", second)
    assert killed.returncode != 0 and "starting fresh on 4" in killed.stdout, killed.stdout + killed.stderr
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (f"resumed run 'torch' from step {claimed.group(1)} on {claimed.group(2)} trainer(s)"
            in resumed.stdout), resumed.stdout
    assert "trained to step 60" in resumed.stdout
    assert [s for s, _ in lines(os.path.join(demo, "loss.tsv"))][-1] == 60
