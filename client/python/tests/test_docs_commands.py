"""Every command line shown in README.md and docs/*.md, run (so the docs cannot drift
from the behaviour).

Each line of a fenced block that starts with a command must match exactly one rule
below; a new command in the docs without a rule fails test_every_doc_command_has_a_rule.
The rules run the line as written with only its example paths moved into this test's
temp directory; a usage synopsis (README's ckptctl table) is checked flag by flag
against the subcommand's --help; the few lines that need what this machine lacks
(Slurm, systemd as PID 1, the user's own train.py) name why and which test covers the
rest of them.
"""

import glob
import json
import os
import re
import shlex
import signal
import subprocess

import numpy as np
import pytest

import ckptd
from conftest import daemon_env

SOURCE = os.environ.get("CKPTD_SOURCE_DIR", ".")
CKPTD = os.environ.get("CKPTD_BINARY", "ckptd")
CKPTCTL = os.environ.get("CKPTCTL_BINARY", "ckptctl")
MPIEXEC = os.environ.get("MPIEXEC", "mpirun")
COMMAND = re.compile(r"^(\$ )?(sudo )?(build/ckptctl|build/ckptd|ckptctl|ckptd|scripts/\S+|mpirun|mpiexec|cmake|"
                     r"pip|systemctl|useradd|install|cp|journalctl|export|srun|python3|/usr/bin/python3)( |$)")


def doc_commands():
    """(file, line) of every command line in a fenced block, continuations joined."""
    out = []
    for path in [os.path.join(SOURCE, "README.md")] + sorted(glob.glob(os.path.join(SOURCE, "docs", "*.md"))):
        text = open(path).read()
        for lang, block in re.findall(r"```([a-z]*)\n(.*?)```", text, re.S):
            if lang in ("cpp", "python", "json", "yaml", "cmake"):
                continue
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = line.strip()
                if not line.isascii() or not COMMAND.match(line):
                    continue
                out.append((os.path.relpath(path, SOURCE), line))
    return out


def without_comment(line):
    return re.sub(r"\s+#.*$", "", line).strip()


# --- rules ---------------------------------------------------------------------------
# Each: (name, pattern). Patterns are matched against the line without its comment.

SYNOPSIS = re.compile(r"^build/ckptctl (\w+) .*([A-Z]{2,}|\[)")
RULES = [
    ("synopsis", SYNOPSIS),
    # A ckptctl line with concrete arguments (the README's tour writes build/ckptctl).
    ("ckptctl", re.compile(r"^ckptctl |^build/ckptctl (?!.*([A-Z]{2,}|\[))")),
    ("daemon", re.compile(r"^(mpirun|mpiexec) .*\bckptd\b")),
    ("build/ckptd", re.compile(r"^build/ckptd ")),
    ("export", re.compile(r"^export CKPTD_ADDRESS=")),
    ("elsewhere", re.compile(r"^(\$ )?scripts/(test|bench)\.sh\b|^cmake --build build -j && cmake --install|"
                             r"^pip install")),
    ("demo", re.compile(r"^(\$ )?scripts/demo\.sh$")),
    ("cannot-here", re.compile(r"^srun |^(useradd|systemctl|journalctl) |^cp /usr/local/|^install -d |"
                               r"^mpirun --map-by ppr:8:node python3 train\.py$")),
]

# What covers the lines this test does not run, and why.
ELSEWHERE = {
    "scripts/test.sh": "is what CI runs (.ci/run)",
    "scripts/bench.sh": "runs in the test bench_smoke",
    "cmake --build": "cmake --install runs in the test install_and_find_package",
    "pip install": "runs in test_packaging.py",
}
CANNOT = {
    "srun": "needs Slurm; the mpirun lines beside it run here",
    "useradd": "needs systemd as PID 1; install_and_find_package runs systemd-analyze verify on the unit",
    "systemctl": "needs systemd as PID 1 (see useradd)",
    "journalctl": "needs systemd as PID 1 (see useradd)",
    "cp": "installs the unit and config for systemd (see useradd)",
    "install": "prepares directories for systemd (see useradd)",
    "mpirun --map-by ppr:8:node python3 train.py": "is the user's own trainer; examples/train_mlp.py's "
                                                   "docstring commands run in test_train_mlp.py",
}


def rule_of(line):
    matched = [name for name, pattern in RULES if pattern.search(without_comment(line))]
    return matched


def test_every_doc_command_has_a_rule():
    commands = doc_commands()
    assert len(commands) > 30
    for path, line in commands:
        assert len(rule_of(line)) == 1, f"{path}: {line!r} matches rules {rule_of(line)} (want exactly one)"


@pytest.mark.parametrize("path,line", [c for c in doc_commands() if rule_of(c[1]) == ["synopsis"]])
def test_synopsis_lines_name_only_flags_the_subcommand_has(path, line):
    sub = SYNOPSIS.match(without_comment(line)).group(1)
    r = subprocess.run([CKPTCTL, sub, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{path}: ckptctl {sub}: {r.stderr}"
    for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", without_comment(line)):
        assert re.search(rf"(?<![\w-]){flag}\b", r.stdout), f"{path}: {line!r}: ckptctl {sub} has no {flag}"


def test_lines_not_run_here_say_why():
    for path, line in doc_commands():
        rule = rule_of(line)
        if rule == ["elsewhere"]:
            assert any(without_comment(line).lstrip("$ ").startswith(k) for k in ELSEWHERE), line
        if rule == ["cannot-here"]:
            assert any(without_comment(line).startswith(k) for k in CANNOT), line


def moved(line, tmp):
    """The line with its example paths moved under `tmp` and the binaries under test."""
    out = without_comment(line)
    for example, here in [("/lustre/ckpt", f"{tmp}/lustre"), ("/nvme/ckpt", f"{tmp}/nvme"),
                          ("/etc/ckptd/ckptd.yaml", f"{tmp}/ckptd.yaml"), ("config/ckptd.yaml", f"{tmp}/ckptd.yaml"),
                          ("'/tmp/ckptd/{rank}.sock'", f"'{tmp}/sock/{{rank}}.sock'"), ("/tmp/ckpt ", f"{tmp}/ckpt ")]:
        out = out.replace(example, here)
    out = re.sub(r"(^| )(build/)?ckptd ", rf"\1{CKPTD} ", out)
    out = re.sub(r"^(mpirun|mpiexec) ", f"{MPIEXEC} ", out)
    return out.rstrip("&").strip()


def sockets_of(command, tmp):
    if "--socket" in command:
        return re.search(r"--socket '([^']+)'", command).group(1)
    if "--config" in command:
        return f"{tmp}/sock/ckptd-{{rank}}.sock"  # the test config's socket_path
    return f"/tmp/ckptd-{os.getuid()}/ckptd-{{rank}}.sock"  # the default, as written


@pytest.mark.parametrize("path,line", [c for c in doc_commands() if rule_of(c[1]) in (["daemon"], ["build/ckptd"])])
def test_daemon_launch_lines_start_daemons_that_answer(path, line, tmp_path):
    tmp = str(tmp_path)
    with open(f"{tmp}/ckptd.yaml", "w") as f:
        f.write(f"socket_path: {tmp}/sock/ckptd-{{rank}}.sock\nroot: {tmp}/root\n")
    command = moved(line, tmp)
    if command.startswith(CKPTD):  # the daemon line of an mpirun continued over two lines
        command = f"{MPIEXEC} -np 1 {command}"
    env = daemon_env(NODES="1")
    ranks = 2 if " -np 2 " in command else 1
    daemons = subprocess.Popen(command, shell=True, env=env, start_new_session=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    try:
        for rank in range(ranks):
            with ckptd.Client(sockets_of(command, tmp).replace("{rank}", str(rank)), timeout=60) as c:
                assert c.status()["num_ranks"] == ranks
                pid = c.status()["pid"]
        os.kill(pid, signal.SIGTERM)
        code = daemons.wait(timeout=120)
        assert code == 0, daemons.stdout.read().decode(errors="replace")[-6000:]
    finally:
        if daemons.poll() is None:
            os.killpg(daemons.pid, signal.SIGKILL)
            daemons.wait()


def test_the_export_line_names_this_hosts_daemon(tmp_path):
    line = next(line for _, line in doc_commands() if rule_of(line) == ["export"])
    r = subprocess.run(["bash", "-c", without_comment(line) + ' && echo "$CKPTD_ADDRESS"'], capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.strip() == f"/tmp/ckptd-{os.getuid()}/ckptd-0.sock"


def test_the_demo_runs_as_written():
    if not os.path.samefile(CKPTD, os.path.join(SOURCE, "build", "ckptd")):
        pytest.skip("scripts/demo.sh builds and runs build/; this run tests another build")
    r = subprocess.run(["bash", os.path.join(SOURCE, "scripts", "demo.sh")], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def save_run(job, run, step, kernel):
    """The same values at every step, so that diff of two steps finds none (exit 0)."""
    clients = [job.client(t) for t in range(2)]
    for t, c in enumerate(clients):
        c.save(run, step, {"layer0/kernel": kernel}, trainer_id=t, trainer_count=2)
    clients[0].wait(run, step)
    for c in clients:
        c.close()


def test_ckptctl_lines_of_the_docs_run_as_written(job, tmp_path):
    """The docs' ckptctl lines (README's tour, then operations.md's) in the order shown,
    on a run with steps 100, 200 and 300 of a job's daemons; <root>/<run> is that run,
    /lustre/ckpt and /tmp/ckpt the job's root, /tmp/ckptd/0.sock its rank 0,
    /tmp/model and /tmp/restored this test's, and the import sources real checkpoints."""
    kernel = np.arange(12, dtype=np.float32).reshape(3, 4)
    for step in (100, 200, 300):
        save_run(job, "run-1", step, kernel)
    tf_prefix = os.path.join(SOURCE, "tests", "testdata", "tf", "ocr", "variables")
    env = dict(os.environ, CKPTD_ADDRESS=job.address(0))
    ran = 0
    for path, line in doc_commands():
        if rule_of(line) != ["ckptctl"]:
            continue
        command = without_comment(line)
        for example, here in [("<root>/<run>/", f"{job.root}/run-1/"), ("/lustre/ckpt/", f"{job.root}/"),
                              ("/tmp/ckpt/", f"{job.root}/"), ("/tmp/ckptd/0.sock", job.address(0)),
                              ("/tmp/restored", f"{tmp_path}/restored"),
                              ("/tmp/ckptd-0/ckptd-0.sock", job.address(0)), ("/tmp/model", f"{tmp_path}/model"),
                              ("/data/tf-run/ckpt-300", tf_prefix), ("/models/llama", f"{tmp_path}/model")]:
            command = command.replace(example, here)
        # import makes a run of its own (step 300 of run-1 exists and is never replaced).
        command = command.replace("<root>/<run>", f"{job.root}/imported" if " import " in f" {command}"
                                  else f"{job.root}/run-1")
        assert "<" not in command and "/lustre" not in command, command
        argv = shlex.split(command.split(" | ")[0])
        r = subprocess.run([CKPTCTL, *argv[1:]], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, f"{path}: {line}\n{command}\n{r.stdout}{r.stderr}"
        if " | jq " in command:  # the pipe's filter, applied to the output it gets
            filtered = subprocess.run(["jq", "-c", command.split(" | jq ")[1].strip("'")], input=r.stdout,
                                      capture_output=True, text=True, timeout=60)
            rows = [json.loads(row) for row in filtered.stdout.splitlines()]
            assert filtered.returncode == 0 and [row["rank"] for row in rows] == [0, 1], filtered.stdout
        ran += 1
    assert ran >= 10


def test_the_readme_tour_runs_as_written(job):
    """README's Python lines, as written, against a job's daemon (its socket in place of
    /tmp/ckptd/0.sock): the saved array comes back."""
    text = open(os.path.join(SOURCE, "README.md")).read()
    [tour] = re.findall(r"```python\n(.*?)```", text, re.S)
    assert "/tmp/ckptd/0.sock" in tour
    names = {}
    exec(tour.replace("/tmp/ckptd/0.sock", job.address(0)), names)  # noqa: S102 - the docs' own code
    assert np.array_equal(names["w"], np.ones((1024, 1024), np.float32))
    names["c"].close()
