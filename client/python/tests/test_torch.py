"""ckptd.torch against real daemons: state_dicts saved and loaded in place, across world
sizes and shardings (gloo trainer processes), with the errors load owes its caller."""

import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/install-deps.sh installs it)")

import ckptd  # noqa: E402
import ckptd.data  # noqa: E402
import ckptd.torch  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_worker.py")


def run_world(job, mode, world, run, step, tmp_path, *extra):
    """WORLD trainer processes in one gloo group, trainer r on daemon r mod 2; each
    load's findings, by rank."""
    store = tmp_path / f"store-{mode}-{world}-{step}"
    outs = [tmp_path / f"{mode}-{world}-{step}-{r}.json" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, WORKER, mode, str(r), str(world), str(store),
                               job.address(r % job.ranks), run, str(step), str(outs[r]), *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    for r, p in enumerate(procs):
        output, _ = p.communicate(timeout=300)
        assert p.returncode == 0, f"trainer {r} of {world} ({mode}): {output[-3000:]}"
    return [json.load(open(o)) for o in outs] if "load" in mode else None


def test_a_state_dict_resumes_on_another_world_size_and_sharding(job, tmp_path):
    run_world(job, "save", 2, "tw", 10, tmp_path)
    # 2 -> 3 trainers: the ShardedTensor's rows are chunked three ways now; the third
    # trainer has no PerRank tensor of its own in the checkpoint (not strict).
    found = run_world(job, "load", 3, "tw", 10, tmp_path, "--not-strict")
    assert [f["emb_rows"] for f in found] == [[[0, 4]], [[4, 4]], [[8, 4]]]
    assert all(f["step"] == 10 and f["model_equal"] and f["emb_equal"] for f in found), found
    assert [f["mine"] for f in found] == [[0.0, 0.0], [1.0, 1.0], [-1.0, -1.0]]
    assert all(f["meta"] == {"epoch": 5, "lr": 0.25, "tag": "a", "nothing": None} for f in found), found
    # The same world size, strict.
    found = run_world(job, "load", 2, "tw", 10, tmp_path)
    assert [f["emb_rows"] for f in found] == [[[0, 6]], [[6, 6]]] and all(f["emb_equal"] for f in found)
    # 3 -> 2, strict: every rank of the smaller job finds its own PerRank tensor.
    run_world(job, "save", 3, "tw", 20, tmp_path)
    found = run_world(job, "load", 2, "tw", 20, tmp_path)
    assert all(f["step"] == 20 and f["model_equal"] and f["emb_equal"] for f in found), found
    assert [f["mine"] for f in found] == [[0.0, 0.0], [1.0, 1.0]]


def test_dcp_saves_through_ckptd_and_loads_into_another_sharding_with_its_own_planner(job, tmp_path):
    run_world(job, "dcp-save", 2, "dcp", 3, tmp_path)
    with job.client(0) as c:  # committed (the writer waits), one ckptd step like any other
        assert c.latest_step("dcp") == 3
        assert sorted(n for n, _, _ in c.list_tensors("dcp", 3)[1]) == ["emb", "w"]
    found = run_world(job, "dcp-load", 3, "dcp", 3, tmp_path)
    assert [f["emb_rows"] for f in found] == [[[0, 4]], [[4, 4]], [[8, 4]]]
    assert all(f["emb_equal"] and f["w"] == [0, 1, 2, 3, 4, 5] and f["meta"] == {"epoch": 5} for f in found), found


def test_a_model_and_its_optimizer_round_trip_in_place_and_the_optimizer_state_is_created(job):
    with job.client(0) as c:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        net(torch.randn(5, 4)).sum().backward()
        opt.step()
        staged = ckptd.torch.save({"model": net.state_dict(), "optim": opt.state_dict()}, "opt", 1, client=c)
        assert staged.shared_memory  # the tensors went through shared memory, one copy each
        ckptd.torch.wait("opt", 1, client=c)
        names = sorted(n for n, _, _ in c.list_tensors("opt", 1)[1])
        assert names[:4] == ["model/0/bias", "model/0/weight", "model/2/bias", "model/2/weight"]
        assert "optim/state/0/exp_avg" in names and "optim/state/3/step" in names

        net2 = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        opt2 = torch.optim.Adam(net2.parameters(), lr=0.5)  # no step yet: its "state" is empty
        weights = net2[0].weight
        state = {"model": net2.state_dict(), "optim": opt2.state_dict()}
        assert ckptd.torch.load(state, "opt", client=c) == 1
        opt2.load_state_dict(state["optim"])
        assert net2[0].weight is weights  # filled in place
        for a, b in zip(net.state_dict().values(), net2.state_dict().values()):
            assert torch.equal(a, b)
        assert opt2.param_groups[0]["lr"] == 0.01
        for p, q in zip(net.parameters(), net2.parameters()):
            assert torch.equal(opt.state[p]["exp_avg"], opt2.state[q]["exp_avg"])
            assert torch.equal(opt.state[p]["step"], opt2.state[q]["step"])


def test_missing_and_extra_keys_are_named_and_strict_false_loads_what_matches(job):
    with job.client(0) as c:
        ckptd.torch.save({"a": torch.ones(3), "b": torch.ones(2)}, "keys", 1, client=c)
        ckptd.torch.wait("keys", 1, client=c)
        dest = {"a": torch.zeros(3), "c": torch.zeros(2)}
        with pytest.raises(KeyError) as e:
            ckptd.torch.load(dest, "keys", client=c)
        assert "missing from the checkpoint: c" in str(e.value) and "not in the state_dict: b" in str(e.value)
        assert torch.equal(dest["a"], torch.zeros(3))  # nothing loaded on an error
        assert ckptd.torch.load(dest, "keys", client=c, strict=False) == 1
        assert torch.equal(dest["a"], torch.ones(3)) and torch.equal(dest["c"], torch.zeros(2))
        wrong = {"b": torch.zeros(2), "a": torch.zeros(4)}
        with pytest.raises(ValueError, match=r"'a' is \[3\] in run 'keys' step 1, \[4\] in the state_dict"):
            ckptd.torch.load(wrong, "keys", client=c)
        assert torch.equal(wrong["b"], torch.zeros(2))  # nothing loaded, not even the entries that fit
        with pytest.raises(ValueError, match="not saved by ckptd.torch.save"):
            c.save("raw", 1, {"w": torch.ones(2).numpy()})
            c.wait("raw", 1)
            ckptd.torch.load({"w": torch.zeros(2)}, "raw", client=c)
        with pytest.raises(TypeError, match="cannot save 'x' of type object"):
            ckptd.torch.save({"x": object()}, "keys", 2, client=c)


def test_dtypes_convert_on_load_and_bfloat16_keeps_its_bits(job):
    with job.client(0) as c:
        values = torch.tensor([[1.0, 0.0], [-2.5, 0.0], [3.140625, 0.0], [65504.0, 0.0]])[:, 0]  # strided
        bf = torch.tensor([[0.5, -1.0], [3.0e38, 1e-30]], dtype=torch.bfloat16).t().reshape(-1)
        assert not values.is_contiguous()
        ckptd.torch.save({"f": values, "bf": bf, "i": torch.arange(4, dtype=torch.int64)}, "dt", 1, client=c)
        ckptd.torch.wait("dt", 1, client=c)
        assert dict((n, d) for n, d, _ in c.list_tensors("dt", 1, raw_dtypes=True)[1]) == {"f": 1, "bf": 14, "i": 9}
        dest = {"f": torch.zeros(4, dtype=torch.float64), "bf": torch.zeros(4, dtype=torch.bfloat16),
                "i": torch.zeros(4, dtype=torch.int32)}
        ckptd.torch.load(dest, "dt", client=c)
        assert torch.equal(dest["f"], values.double()) and dest["f"].dtype == torch.float64
        assert torch.equal(dest["bf"].view(torch.int16), bf.view(torch.int16))  # bit for bit
        assert torch.equal(dest["i"], torch.arange(4, dtype=torch.int32))
        widened = {"f": torch.zeros(4), "bf": torch.zeros(4), "i": torch.zeros(4, dtype=torch.int64)}
        ckptd.torch.load(widened, "dt", client=c)
        assert torch.equal(widened["bf"], bf.float())


def test_sharded_tensor_imports_through_a_fix_that_never_touches_torchs_files():
    import importlib.machinery
    origin = os.path.join(list(importlib.machinery.PathFinder.find_spec("torch").submodule_search_locations)[0],
                          "distributed", "_shard", "sharded_tensor", "metadata.py")
    before = hashlib.sha256(open(origin, "rb").read()).hexdigest()
    code = ("import ckptd.torch; from torch.distributed._shard.sharded_tensor import ShardedTensor; "
            "print(ShardedTensor.__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ShardedTensor", r.stderr[-2000:]
    assert hashlib.sha256(open(origin, "rb").read()).hexdigest() == before


DATA_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data_worker.py")


def data_trainers(job, phase, kind, world, run, tmp_path):
    store = tmp_path / f"store-{phase}-{kind}-{world}"
    outs = [str(tmp_path / f"{phase}-{kind}-{world}-{r}.json") for r in range(world)]
    procs = [subprocess.Popen([sys.executable, DATA_WORKER, phase, kind, str(r), str(world), str(store),
                               job.address(r % job.ranks), run, "5", outs[r]],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    return procs, outs


@pytest.mark.parametrize("kind", ["shards", "global"])
@pytest.mark.parametrize("before,after", [(4, 3), (2, 4), (3, 3)])
def test_data_positions_resume_on_another_world_size_reading_every_sample_exactly_once(job, tmp_path, kind,
                                                                                     before, after):
    """Trainers read unevenly, save their positions, read on and are killed; a job of
    another size loads and reads to the end. What was read before the save plus what
    is read after the load is the dataset, each sample once."""
    run = f"data-{kind}-{before}-{after}"
    procs, outs = data_trainers(job, "first", kind, before, run, tmp_path)
    try:
        deadline = time.monotonic() + 300
        while not all(os.path.exists(o + ".saved") for o in outs):  # the step is committed
            for r, p in enumerate(procs):
                assert p.poll() is None, f"trainer {r} stopped: {p.communicate()[0][-3000:]}"
            assert time.monotonic() < deadline, "the first job never saved"
            time.sleep(0.01)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    consumed_before = [i for o in outs for i in json.load(open(o))]
    procs, outs = data_trainers(job, "resume", kind, after, run, tmp_path)
    for r, p in enumerate(procs):
        output, _ = p.communicate(timeout=300)
        assert p.returncode == 0, f"trainer {r} of {after}: {output[-3000:]}"
    consumed_after = [i for o in outs for i in json.load(open(o))]
    size = 105 if kind == "shards" else 101
    print(f"{kind} {before}->{after} trainers: {len(consumed_before)} samples read before the save, "
          f"{len(consumed_after)} after the load, {size} in the dataset")
    assert len(consumed_before) > 0 and len(consumed_after) > 0
    assert sorted(consumed_before + consumed_after) == list(range(size)), (len(consumed_before),
                                                                          len(consumed_after))


TORCH_MAJOR = int(torch.__version__.split(".")[0])


def test_dtensor_is_mapped_only_where_torch_has_it():
    """Debian 12's torch 1.13 has no DTensor: the code path that maps one stays off
    there (and on a torch >= 2.0 it finds the class)."""
    found = ckptd.torch._dtensor_type()
    if TORCH_MAJOR < 2:
        assert found is None
    else:
        assert found is not None and found.__name__ == "DTensor"


@pytest.mark.skipif(TORCH_MAJOR < 2, reason=f"DTensor needs torch >= 2.0; this is {torch.__version__}")
def test_a_dtensor_saves_its_local_shard_and_loads_into_another_placement(job, tmp_path):
    import torch.distributed as dist
    try:
        from torch.distributed.tensor import DeviceMesh, Replicate, Shard, distribute_tensor
    except ImportError:
        from torch.distributed._tensor import DeviceMesh, Replicate, Shard, distribute_tensor
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", [0])
        whole = torch.arange(24.0).reshape(6, 4)
        with job.client(0) as c:
            ckptd.torch.save({"w": distribute_tensor(whole, mesh, [Shard(0)])}, "dt", 1, client=c)
            ckptd.torch.wait("dt", 1, client=c)
            into = {"w": distribute_tensor(torch.zeros(6, 4), mesh, [Replicate()])}
            ckptd.torch.load(into, "dt", client=c)
            assert torch.equal(into["w"].to_local(), whole)
    finally:
        dist.destroy_process_group()


def test_shard_positions_take_a_user_given_assignment_and_refuse_a_table_that_does_not_partition():
    blocks = lambda shard, world: (shard // 3) % world  # noqa: E731 - contiguous blocks of 3 shards
    before = [ckptd.data.ShardPositions(6, rank=r, world=2, owner=blocks) for r in range(2)]
    assert [p.owned() for p in before] == [[0, 1, 2], [3, 4, 5]]
    for p in before:
        for shard in p.owned():
            for _ in range(shard + 1):
                p.next(shard)
    with pytest.raises(ValueError, match="belongs to trainer 1, not 0"):
        before[0].next(4)
    table = np.array([p._ckptd_row() for p in before])
    after = ckptd.data.ShardPositions(6, rank=0, world=1, owner=blocks)
    after._ckptd_load(table, before[0]._ckptd_shared())
    assert [after.position(s) for s in range(6)] == [1, 2, 3, 4, 5, 6]
    table[1, 0] = 7  # shard 0 claimed twice
    with pytest.raises(ValueError, match=r"shards \[0\] have 2 owners"):
        after._ckptd_load(table, before[0]._ckptd_shared())
    with pytest.raises(ValueError, match="the shard count is fixed for a run"):
        ckptd.data.ShardPositions(5, rank=0, world=1)._ckptd_load(table[:, :5], before[0]._ckptd_shared())


def test_a_dcp_save_whose_coordinator_never_finishes_publishes_nothing(job):
    """DCP's own atomicity point is its metadata file, written last; with ckptd it is the
    commit. Here every other rank has written (rank 1 of 2 through write_data) but the
    coordinator never reaches finish(): the step is not published, and a load reads the
    step before it."""
    from torch.distributed._shard.checkpoint import load_state_dict, save_state_dict
    from torch.distributed._shard.checkpoint.default_planner import DefaultSavePlanner
    with job.client(0) as c:
        save_state_dict({"w": torch.arange(4.0)}, storage_writer=ckptd.torch.StorageWriter("half", 1, client=c),
                        no_dist=True)
        writer = ckptd.torch.StorageWriter("half", 2, client=c)
        writer.rank, writer.world = 1, 2  # the second rank of a two-rank job
        planner = DefaultSavePlanner()
        planner.init({"w": torch.full((4,), 9.0)}, is_coordinator=False)
        writer.init(is_coordinator=False)
        writer.write_data(planner.finish_plan(planner.create_local_plan()), planner).wait()
        # The coordinator writes its data too, and stops before finish().
        coordinator = ckptd.torch.StorageWriter("half", 2, client=c)
        coordinator.rank, coordinator.world = 0, 2
        mine = DefaultSavePlanner()
        mine.init({"w": torch.full((4,), 9.0)}, is_coordinator=True)
        coordinator.init(is_coordinator=True)
        coordinator.write_data(mine.finish_plan(mine.create_local_plan()), mine).wait()
        assert [s["step"] for s in c.list_checkpoints("half")] == [1]
        into = {"w": torch.zeros(4)}
        load_state_dict(into, storage_reader=ckptd.torch.StorageReader("half", client=c), no_dist=True)
        assert torch.equal(into["w"], torch.arange(4.0))
