"""The Python client as users get it: `pip install client/python` into a fresh
virtual environment works without the C++ build tree (the generated stubs ship with
the package), and the package's type hints hold under mypy --strict."""

import os
import shutil
import subprocess
import textwrap

SOURCE = os.environ.get("CKPTD_SOURCE_DIR", ".")
PYTHON = "/usr/bin/python3"

USER_SCRIPT = """
import sys
from typing import List, Optional

import numpy as np

import ckptd

def newest(c: ckptd.Client, run: str) -> Optional[int]:
    return c.latest_step(run)

with ckptd.Client(sys.argv[1]) as c:
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    c.save("pip", 7, {"w": w, "b": np.ones(2, np.int64)})
    c.wait("pip", 7)
    steps: List[int] = c.all_steps("pip")
    out = c.restore("pip", newest(c, "pip"), {"w": ckptd.RestoreSpec(dtype=np.float32)})
    assert np.array_equal(out["w"], w) and steps == [7] and out.step == 7
    print("ok", ckptd.__file__)
"""


def run(args, **kwargs):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs)


def test_pip_installs_a_typed_package_that_works_without_the_build_tree(job, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(os.path.join(SOURCE, "client", "python"), src,
                    ignore=shutil.ignore_patterns("__pycache__", "tests", "*.egg-info", "build"))
    venv = tmp_path / "venv"
    r = run([PYTHON, "-m", "venv", "--system-site-packages", venv])
    assert r.returncode == 0, r.stderr
    # Offline, as on Debian 12: setuptools and wheel from the system, nothing fetched.
    r = run([venv / "bin" / "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", src])
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(USER_SCRIPT))
    r = run([venv / "bin" / "python", script, job.address(0)], env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok ") and str(venv) in r.stdout, r.stdout
    assert (venv / "lib").exists() and list(venv.glob("lib/python3*/site-packages/ckptd/py.typed"))

    # The installed package is typed: a correct user script passes mypy --strict, one
    # that passes a step as a string does not.
    r = run([venv / "bin" / "python", "-m", "mypy", "--strict", "--ignore-missing-imports", script], env=env,
            cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    bad = tmp_path / "bad.py"
    bad.write_text("import ckptd\n\ndef f(c: ckptd.Client) -> None:\n    c.wait('run', '7')\n")
    r = run([venv / "bin" / "python", "-m", "mypy", "--strict", "--ignore-missing-imports", bad], env=env,
            cwd=tmp_path)
    assert r.returncode == 1 and 'Argument 2 to "wait" of "Client" has incompatible type "str"' in r.stdout, r.stdout


def test_the_package_itself_passes_mypy_strict():
    r = run([PYTHON, "-m", "mypy", "--config-file", "pyproject.toml", "--strict", "-p", "ckptd"],
            cwd=os.path.join(SOURCE, "client", "python"))
    assert r.returncode == 0, r.stdout + r.stderr
