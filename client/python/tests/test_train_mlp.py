"""examples/train_mlp.py: killed mid-run, it resumes from the last committed step and
its loss curve from there on equals that of a run that was never interrupted."""

import os
import subprocess

EXAMPLE = os.path.join(os.environ.get("CKPTD_SOURCE_DIR", "."), "examples", "train_mlp.py")


def train(job, run, log, *extra):
    cmd = [os.environ.get("MPIEXEC", "mpirun"), "--allow-run-as-root", "--oversubscribe",
           "-np", "2", "-x", "PYTHONPATH", "/usr/bin/python3", EXAMPLE,
           "--socket", os.path.join(job.dir, "sock", "ckptd-{rank}.sock"), "--run", run,
           "--steps", "40", "--checkpoint-every", "10", "--loss-log", log, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def curve(path):
    return dict(line.split("\t") for line in open(path).read().splitlines())


def test_resume_after_kill_gives_the_same_loss_curve(job, tmp_path):
    ref_log, log = str(tmp_path / "ref.tsv"), str(tmp_path / "mlp.tsv")
    done = train(job, "ref", ref_log)
    assert done.returncode == 0, done.stdout + done.stderr

    killed = train(job, "mlp", log, "--die-at", "25")
    assert killed.returncode != 0  # every trainer was SIGKILLed after step 25
    assert max(int(s) for s in curve(log)) == 25

    resumed = train(job, "mlp", log)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed run 'mlp' from step 20" in resumed.stdout

    ref = curve(ref_log)
    assert len(ref) == 40
    # Steps 21-25 ran twice (before the kill and after the resume): the log keeps
    # the later value, which must equal the reference as every other step does.
    got = curve(log)
    assert sorted(int(s) for s in got) == list(range(1, 41))
    assert got == ref
    assert float(ref["40"]) < float(ref["1"])  # it does learn
