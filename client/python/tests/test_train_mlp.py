"""examples/train_mlp.py: killed mid-run, it resumes from the last committed step and
its loss curve equals that of a run that was never interrupted, line for line; the
commands in its docstring run as written."""

import os
import re
import subprocess

import pytest

from conftest import run_docstring_demo

SOURCE = os.environ.get("CKPTD_SOURCE_DIR", ".")
EXAMPLE = os.path.join(SOURCE, "examples", "train_mlp.py")


def train(job, run, log, *extra):
    cmd = [os.environ.get("MPIEXEC", "mpirun"), "--allow-run-as-root", "--oversubscribe",
           "-np", "2", "-x", "PYTHONPATH", "/usr/bin/python3", EXAMPLE,
           "--socket", os.path.join(job.dir, "sock", "ckptd-{rank}.sock"), "--run", run,
           "--steps", "40", "--checkpoint-every", "10", "--loss-log", log, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def lines(path):
    """Every (step, loss) line in the order written, repeats included."""
    return [(int(s), loss) for s, loss in (line.split("\t") for line in open(path).read().splitlines())]


@pytest.mark.parametrize("die_at", [5, 20, 25])
def test_resume_after_kill_gives_the_same_loss_curve(job, tmp_path, die_at):
    ref_log, log = str(tmp_path / "ref.tsv"), str(tmp_path / "mlp.tsv")
    done = train(job, "ref", ref_log)
    assert done.returncode == 0, done.stdout + done.stderr
    ref = dict(lines(ref_log))
    assert sorted(ref) == list(range(1, 41)) and float(ref[40]) < float(ref[1])  # it does learn

    killed = train(job, "mlp", log, "--die-at", str(die_at))
    assert killed.returncode != 0  # every trainer was SIGKILLed after step die_at
    assert [s for s, _ in lines(log)] == list(range(1, die_at + 1))

    resumed = train(job, "mlp", log)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    committed = die_at // 10 * 10  # the last checkpoint before the kill, committed before it
    if committed:
        assert f"resumed run 'mlp' from step {committed}\n" in resumed.stdout, resumed.stdout
    else:
        assert "no checkpoint, starting fresh" in resumed.stdout, resumed.stdout
    # The whole log: steps 1..die_at, then committed+1..40, every loss bit-equal to
    # the uninterrupted run's at that step (the steps run twice included).
    got = lines(log)
    assert [s for s, _ in got] == list(range(1, die_at + 1)) + list(range(committed + 1, 41))
    assert all(loss == ref[s] for s, loss in got), [(s, loss, ref[s]) for s, loss in got if loss != ref[s]]


def test_the_commands_in_the_docstring_run_as_written(tmp_path):
    demo = str(tmp_path / "demo")
    second, killed, resumed = run_docstring_demo(EXAMPLE, "/tmp/mlp-demo", demo)
    claimed = int(re.search(r"# resumes from step (\d+)", second).group(1))
    assert killed.returncode != 0 and "starting fresh" in killed.stdout, killed.stdout + killed.stderr
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed run 'mlp' from step {claimed}\n" in resumed.stdout, resumed.stdout
    assert "trained to step 200" in resumed.stdout
    assert [s for s, _ in lines(os.path.join(demo, "loss.tsv"))][-1] == 200
