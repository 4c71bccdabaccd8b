"""Fixtures: a real ckptd job (mpirun -np 2) over a temp directory.

CKPTD_BINARY and MPIEXEC come from ctest; PYTHONPATH points at build/python.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

import ckptd


def daemon_env(**extra):
    """The environment a test starts mpirun and ckptd in: mpirun's run-as-root consent
    (tests run as root in CI) and, in the sanitizer build, leak detection off in the
    daemons as in the C++ cluster helper, because Open MPI's plugins leak at exit and
    LeakSanitizer would abort every daemon on a clean SIGTERM."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", **extra)
    if "ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] += ":detect_leaks=0"
    return env


class Job:
    def __init__(self, tmp, ranks=2, extra=()):
        self.dir = str(tmp)
        self.root = os.path.join(self.dir, "root")
        self.ranks = ranks
        self.log_path = os.path.join(self.dir, "daemons.log")
        args = [os.environ.get("MPIEXEC", "mpirun"), "--allow-run-as-root", "--oversubscribe",
                "-np", str(ranks), os.environ["CKPTD_BINARY"], "--root", self.root,
                "--socket", os.path.join(self.dir, "sock", "ckptd-{rank}.sock"),
                "--commit-timeout", "60s", *extra]
        env = daemon_env()
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)
        for rank in range(ranks):
            ckptd.Client(self.address(rank), timeout=60).close()

    def address(self, rank):
        return os.path.join(self.dir, "sock", f"ckptd-{rank}.sock")

    def client(self, rank, **kwargs):
        return ckptd.Client(self.address(rank), **kwargs)

    def stop(self):
        """SIGTERM to one daemon stops every rank; returns mpirun's exit code."""
        if self.proc.poll() is None:
            with self.client(0) as c:
                os.kill(int(c.status()["pid"]), signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture
def job(tmp_path):
    j = Job(tmp_path)
    yield j
    code = j.stop()
    if code != 0:
        sys.stderr.write(open(j.log_path).read())
    assert code == 0, f"mpirun exited {code}"


def run_docstring_demo(example, demo_placeholder, demo_dir):
    """An example's docstring commands as written (a daemon line, a training line that
    dies, one that resumes), with only `demo_placeholder` moved to `demo_dir` and the
    daemon binary to the build under test; mpirun's run-as-root consent comes from the
    environment, and PYTHONPATH is dropped when the script's own fallback (the
    build/python beside it) is the package under test. Returns (resume line, the
    dying run, the resumed run) as CompletedProcess objects after the first."""
    source = os.environ.get("CKPTD_SOURCE_DIR", ".")
    text = open(example).read()
    doc = text[text.index('"""') + 3:text.index('"""', text.index('"""') + 3)]
    daemon, first, second = [line.strip() for line in doc.splitlines() if line.strip().startswith("mpirun ")]

    def as_run(command):
        command = command.split("#")[0].strip().rstrip("&").strip()
        command = command.replace(demo_placeholder, demo_dir).replace("build/ckptd", os.environ["CKPTD_BINARY"])
        return command.replace("mpirun ", os.environ.get("MPIEXEC", "mpirun") + " ", 1)

    env = daemon_env()
    built = os.path.join(source, "build", "python")
    if os.path.isdir(built) and os.path.samefile(built, env.get("PYTHONPATH", "").split(":")[0] or "."):
        env.pop("PYTHONPATH")
    daemons = subprocess.Popen(as_run(daemon), shell=True, cwd=source, env=env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        killed = subprocess.run(as_run(first), shell=True, cwd=source, env=env, capture_output=True, text=True,
                                timeout=600)
        resumed = subprocess.run(as_run(second), shell=True, cwd=source, env=env, capture_output=True, text=True,
                                 timeout=600)
        return second, killed, resumed
    finally:
        os.killpg(daemons.pid, signal.SIGTERM)
        daemons.wait(timeout=60)
