"""/metrics as a real Prometheus sees it: a job with metrics_address, Debian's
prometheus server scraping both daemons, and its HTTP API returning the values the
job produced (saves, restores, commits, failures by code, bytes, histograms, gauges)."""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

import ckptd
from conftest import Job


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def query(base, expr):
    out = json.loads(get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
    assert out["status"] == "success", out
    return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in out["data"]["result"]}


def until(condition, limit=60.0):
    """Polls `condition` (an observable state: what Prometheus has scraped) until it
    holds or `limit` seconds pass; returns its last value."""
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is not installed")
def test_prometheus_scrapes_what_the_job_did(tmp_path):
    job = Job(tmp_path, extra=("--metrics-address", "127.0.0.1:0"))
    prometheus = None
    try:
        addresses = []
        for rank in range(2):
            with job.client(rank) as c:
                addresses.append(c.status()["metrics_address"])
        assert all(a.startswith("127.0.0.1:") for a in addresses), addresses
        # The text format, as promtool checks it.
        page = get(f"http://{addresses[0]}/metrics")
        assert "# TYPE ckptd_commit_seconds histogram" in page and "ckptd_staged_bytes " in page
        check = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr

        # Two committed steps, one restore per trainer, one failed step, one refused restore.
        w = np.arange(1 << 16, dtype=np.float32)
        clients = [job.client(t) for t in range(2)]
        for step in (1, 2):
            for t, c in enumerate(clients):
                c.save("m", step, {"w": w}, trainer_id=t, trainer_count=2)
            clients[0].wait("m", step)
        for t, c in enumerate(clients):
            c.restore("m", 2, {"w": None}, trainer_id=t)
        for t, c in enumerate(clients):  # the trainers disagree on the shape: the step fails
            c.save("m", 3, {"w": np.zeros(3 + t, np.float32)}, trainer_id=t, trainer_count=2)
        with pytest.raises(ckptd.Error):
            clients[0].wait("m", 3)
        with pytest.raises(ckptd.Error):
            clients[1].restore("m", 99, {"w": None})
        for c in clients:
            c.close()

        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text("global: {scrape_interval: 1s}\nscrape_configs:\n- job_name: ckptd\n"
                          f"  static_configs: [{{targets: {json.dumps(addresses)}}}]\n")
        prometheus = subprocess.Popen(["prometheus", f"--config.file={config}",
                                       f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{port}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        up = until(lambda: _safe(lambda: query(base, "sum(up)") == {(): 2.0} and query(base, "sum(up)")))
        assert up == {(): 2.0}, up  # both daemons scraped
        saves = until(lambda: _safe(lambda: query(base, 'sum(ckptd_saves_total{run="m"})')))
        assert list(saves.values()) == [6.0], saves  # 2 trainers x 3 steps
        assert list(query(base, 'sum(ckptd_restores_total{run="m"})').values()) == [2.0]
        assert list(query(base, 'sum(ckptd_restore_bytes_delivered_total{run="m"})').values()) == [2 * w.nbytes]
        assert list(query(base, 'sum(ckptd_commits_total{run="m"})').values()) == [4.0]  # 2 steps x 2 ranks
        failures = query(base, 'sum by (code) (ckptd_step_failures_total{run="m"})')
        assert {dict(k)["code"]: v for k, v in failures.items()} == {"INVALID_ARGUMENT": 2.0}, failures
        refused = query(base, "sum by (code) (ckptd_restore_failures_total)")
        assert {dict(k)["code"]: v for k, v in refused.items()} == {"NOT_FOUND": 1.0}, refused
        count = query(base, 'sum(ckptd_commit_seconds_count{run="m"})')
        assert list(count.values()) == [4.0], count
        phases = query(base, "sum by (phase) (ckptd_commit_phase_seconds_count)")
        assert {dict(k)["phase"] for k in phases} >= {"plan", "prepare", "write", "merge", "publish", "confirm"}, \
            phases
        gauges = query(base, "ckptd_staging_memory_limit_bytes")
        assert len(gauges) == 2 and all(v > 0 for v in gauges.values()), gauges
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=60)
        assert job.stop() == 0


def _safe(fn):
    try:
        return fn()
    except (OSError, AssertionError, ValueError):
        return None
