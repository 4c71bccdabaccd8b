"""examples/train_mlp.py: killed mid-run, it resumes from the last committed step and
its loss curve equals that of a run that was never interrupted, line for line; the
commands in its docstring run as written."""

import os
import re
import signal
import subprocess

import pytest

from conftest import daemon_env

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


def docstring_commands():
    text = open(EXAMPLE).read()
    doc = text[text.index('"""') + 3:text.index('"""', text.index('"""') + 3)]
    return [line.strip() for line in doc.splitlines() if line.strip().startswith("mpirun ")]


def test_the_commands_in_the_docstring_run_as_written(tmp_path):
    """Only the demo directory moves into this test's temp directory and the daemon
    binary into the build under test; mpirun's run-as-root consent comes from the
    environment, and PYTHONPATH is dropped when the script's own fallback (the
    build/python beside it) is the package under test."""
    daemon, first, second = docstring_commands()
    claimed = int(re.search(r"# resumes from step (\d+)", second).group(1))
    demo = str(tmp_path / "demo")

    def as_run(command):
        command = command.split("#")[0].strip().rstrip("&").strip()
        command = command.replace("/tmp/mlp-demo", demo).replace("build/ckptd", os.environ["CKPTD_BINARY"])
        return command.replace("mpirun ", os.environ.get("MPIEXEC", "mpirun") + " ", 1)

    env = daemon_env()
    built = os.path.join(SOURCE, "build", "python")
    if os.path.isdir(built) and os.path.samefile(built, env.get("PYTHONPATH", "").split(":")[0] or "."):
        env.pop("PYTHONPATH")
    daemons = subprocess.Popen(as_run(daemon), shell=True, cwd=SOURCE, env=env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        killed = subprocess.run(as_run(first), shell=True, cwd=SOURCE, env=env, capture_output=True, text=True,
                                timeout=600)
        assert killed.returncode != 0 and "starting fresh" in killed.stdout, killed.stdout + killed.stderr
        resumed = subprocess.run(as_run(second), shell=True, cwd=SOURCE, env=env, capture_output=True, text=True,
                                 timeout=600)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert f"resumed run 'mlp' from step {claimed}\n" in resumed.stdout, resumed.stdout
        assert "trained to step 200" in resumed.stdout
        assert [s for s, _ in lines(os.path.join(demo, "loss.tsv"))][-1] == 200
    finally:
        os.killpg(daemons.pid, signal.SIGTERM)
        daemons.wait(timeout=60)
