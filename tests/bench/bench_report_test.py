"""scripts/bench_report.py on a saved input: the inputs of a real bench.sh run (64 MiB,
2 simulated hosts, recorded with --inputs-json) give the tables and every ratio as the
report defines them, and the small JSON steps bench.sh calls behave."""
import contextlib
import copy
import io
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "bench_report.py")
INPUTS = os.path.join(HERE, "testdata", "bench_report_inputs.json")
sys.path.insert(0, os.path.dirname(SCRIPT))
import bench_report  # noqa: E402


@pytest.fixture
def inputs():
    with open(INPUTS) as f:
        return json.load(f)


def render(inputs):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        r = bench_report.report(inputs)
    return r, out.getvalue()


def test_every_ratio_is_its_figure_over_its_baseline_from_the_same_run(inputs):
    r, text = render(inputs)
    assert r["save_vs_raw_write"] == pytest.approx(r["save_gbps"] / r["raw_write_gbps"])
    assert r["restore_vs_raw_read"] == pytest.approx(r["restore_gbps"] / r["raw_read_gbps"])
    assert r["stall_vs_memcpy"] == pytest.approx(r["stall_s"] / (r["bytes"] / 1e9 / r["memcpy_gbps"]))
    assert r["first_stall_vs_first_touch"] == pytest.approx(r["cold_stall_s"] / r["first_touch_memcpy_s"])
    assert r["memory_tier_restore_vs_memcpy"] == pytest.approx(inputs["memory"]["restore_gbps"] / r["memcpy_gbps"])
    assert r["stream_save_vs_plain_grpc"] == inputs["grpc"]["stream_save_vs_plain_grpc"]
    # Each restore's bytes read beside bytes delivered; the data-parallel one delivers
    # the step to every trainer.
    dp = r["restores"]["dp_restore"]
    assert dp["delivered_bytes"] == r["trainers"] * r["bytes"]
    assert dp["read_amplification"] == pytest.approx(dp["read_bytes"] / r["bytes"])
    assert "| save to durable (shm)" in text and ">= 0.9x" in text
    assert f"{r['save_vs_raw_write']:.2f}x" in text


def test_the_hosts_tables_come_from_the_simulated_hosts_runs(inputs):
    r, text = render(inputs)
    assert r["hosts"]["count"] == 2
    local = inputs["hosts"]["local"]
    assert r["read_amplification"]["local"]["restore"] == pytest.approx(
        local["storage_bytes"]["restore"] / local["bytes"])
    assert r["replica_save_overhead"] == pytest.approx(
        local["save_gbps"] / inputs["hosts"]["replicas"]["save_gbps"])
    assert "2 simulated hosts" in text and "network bytes per host per step" in text
    assert r["drain_gbps"] == pytest.approx(
        inputs["hosts"]["drained"]["bytes"] / inputs["hosts"]["drained"]["seconds"] / 1e9)


def test_the_report_leads_with_a_processs_first_restore_against_the_fresh_read_ceiling(inputs):
    r, text = render(inputs)
    assert text.lstrip().startswith("the restore a restarted trainer waits for")
    assert r["first_restore_vs_fresh_read"] == pytest.approx(r["cold_restore_gbps"] / r["read_fresh_gbps"])
    assert r["python_first_restore_vs_fresh_read"] == pytest.approx(
        r["python_first_restore_gbps"] / r["read_fresh_gbps"])
    assert r["first_host_buffer_restore_vs_fresh_read"] == pytest.approx(
        r["cold_host_buffer_restore_gbps"] / r["read_fresh_gbps"])
    assert r["restore_vs_prefaulted_read"] == pytest.approx(r["restore_gbps"] / r["read_prefaulted_gbps"])
    assert r["read_fresh_threads"] in (2, 4) and r["read_prefaulted_threads"] in (2, 4)
    assert f"| first, C++ client (plain buffers)        | {r['cold_restore_gbps']:7.3f} |" in text
    # Inputs from before the distinct-memory ceilings still make a report.
    old = copy.deepcopy(inputs)
    for key in ("read_fresh_gbps", "read_fresh_threads", "read_prefaulted_gbps", "read_prefaulted_threads"):
        del old["base"][key]
    r, text = render(old)
    assert "first_restore_vs_fresh_read" not in r and "| restore (same cut, cold)" in text


def test_without_hosts_or_peers_their_tables_are_left_out(inputs):
    single = copy.deepcopy(inputs)
    single["hosts"], single["host_count"], single["peers"] = {}, 0, {}
    r, text = render(single)
    assert "hosts" not in r and "peers" not in r
    assert "simulated hosts" not in text and "peers on the same bytes" not in text
    assert "| restore (same cut, warm process)" in text


def test_peers_are_compared_with_ckptd_and_a_failed_peer_says_so(inputs):
    with_peers = copy.deepcopy(inputs)
    with_peers["peers"] = {"dcp": {"save_gbps": 0.5, "load_gbps": 1.0},
                           "hdf5": {"error": "h5py has no MPI support"}}
    r, text = render(with_peers)
    # Each peer loads in a fresh process: held to ckptd's first restore of a process.
    assert r["peers"]["dcp"]["ckptd_restore_ratio"] == pytest.approx(r["cold_restore_gbps"] / 1.0)
    assert r["restore_vs_fastest_peer"] == pytest.approx(r["cold_restore_gbps"] / 1.0)
    assert "first restore is" in text and "(target >= 1.2x)" in text
    assert "| parallel HDF5        | could not run: h5py has no MPI support" in text


def test_dcp_through_ckptd_is_shown_beside_dcp_on_files_and_is_not_a_peer(inputs):
    with_dcp = copy.deepcopy(inputs)
    with_dcp["peers"] = {"dcp": {"save_gbps": 0.5, "load_gbps": 1.0, "blocked_s": 4.0, "save_s": 4.0, "load_s": 2.0},
                         "dcp-ckptd": {"save_gbps": 0.6, "load_gbps": 9.0, "blocked_s": 1.0, "save_s": 3.5,
                                       "load_s": 0.5}}
    r, text = render(with_dcp)
    assert r["restore_vs_fastest_peer"] == pytest.approx(r["cold_restore_gbps"] / 1.0)  # DCP on files only
    assert "| FileSystemWriter (fsync) |                4.000 |           4.000 |     2.000 |" in text, text
    assert "| ckptd.torch              |                1.000 |           3.500 |     0.500 |" in text, text
    assert r["dcp_through_ckptd"]["blocked_vs_files"] == pytest.approx(0.25)
    assert "holds the loop 0.25x as long as on files" in text


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def test_report_json_holds_what_the_tables_show(tmp_path, inputs):
    out = tmp_path / "bench.json"
    done = run("report", INPUTS, "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(f"wrote {out}")
    r, _ = render(inputs)
    assert json.loads(out.read_text()) == json.loads(json.dumps(r))


def test_the_steps_bench_sh_calls():
    runs = [{"save_gbps": 1.0, "trainers": 4}, {"save_gbps": 3.0, "trainers": 4},
            {"save_gbps": 2.0, "trainers": 4}]
    median = json.loads(run("median", *map(json.dumps, runs)).stdout)
    assert median["save_gbps"] == 2.0 and median["trainers"] == 4 and median["runs"] == runs
    beside = json.loads(run("beside", json.dumps({"save_gbps": 1.0}),
                            json.dumps({"raw_write_gbps": 2.0, "raw_write_fsync_s": 0.5})).stdout)
    assert beside == {"save_gbps": 1.0, "raw_write_beside_gbps": 2.0, "raw_write_beside_fsync_s": 0.5,
                      "save_vs_raw_write_beside": 0.5}
    assert json.loads(run("beside", json.dumps({"save_gbps": 1.0}), "{}").stdout) == {"save_gbps": 1.0}
    assert json.loads(run("merge", '{"a": 1, "b": 2}', '{"b": 3}').stdout) == {"a": 1, "b": 3}
    assert run("get", '{"raw_write_config": "libaio qd16 x2"}', "raw_write_config").stdout == "libaio qd16 x2\n"
    assert run("gib", "0.0625").stdout == f"{64 << 20}\n"
    wrong = run("tables")
    assert wrong.returncode == 2 and "unknown command tables" in wrong.stderr


def test_the_redundancy_table_compares_parity_with_a_replica_against_the_targets(inputs):
    # The recorded run predates parity: its replica runs stand in for the parity ones,
    # with the bytes stored as 2 hosts with P=1 store them (one segment each).
    hosts = inputs["hosts"]
    hosts["parity"] = copy.deepcopy(hosts["replicas"])
    hosts["parity"]["save_gbps"] = hosts["replicas"]["save_gbps"] * 0.9
    hosts["parity_host1_lost"] = copy.deepcopy(hosts["replicas_host1_lost"])
    hosts["parity_host1_lost"]["restore_gbps"] = hosts["parity"]["restore_gbps"] * 0.6
    hosts["stored_local"] = {"data": 1000, "redundant": 0}
    hosts["stored_replicas"] = {"data": 1000, "redundant": 1000}
    hosts["stored_parity"] = {"data": 1000, "redundant": 1000}
    r, text = render(inputs)
    x = r["redundancy"]
    assert x["parity_save_vs_replica"] == pytest.approx(0.9)
    assert x["parity_rebuild_vs_restore"] == pytest.approx(0.6)
    assert x["stored_overhead"] == {"local": 0.0, "replicas": 1.0, "parity": 1.0}
    assert x["parity_overhead_target"] == pytest.approx(0.5) and x["parity_overhead_least"] == pytest.approx(1.0)
    assert "redundancy on 2 hosts" in text and ">= 0.8x replica: 0.90x" in text and ">= 0.5x restore: 0.60x" in text
