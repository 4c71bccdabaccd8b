#!/usr/bin/python3
"""A small PyTorch model trained data-parallel with gloo under mpirun, checkpointed by
ckptd.torch, its input position kept by ckptd.data.

Each MPI rank is one trainer process: torch.distributed over gloo (the rendezvous
goes through MPI, so mpirun is the only launcher), a global batch of 24 samples split
evenly over the trainers (so 1, 2, 3, 4, 6 or 8 of them), gradients summed with
all_reduce and an Adam step. The samples come from a ckptd.data.GlobalPosition: one
shuffled order per epoch, trainer r taking every N-th sample. Every
--checkpoint-every steps the trainers save {model, optimizer, data position, step}
with ckptd.torch.save (it returns once staged) and wait for a checkpoint only before
starting the next.

On start the trainers load the newest committed step of the run, if any, on however
many trainers they are now: the model and optimizer are filled in place and the data
position goes on from the first sample not consumed. On the same number of trainers
the loss curve is bit-for-bit that of a run never interrupted; on another number it
continues (the same batches, summed in another order). From the repository root, once
built, beside two daemons:

    mpirun -np 2 build/ckptd --root /tmp/torch-demo/root --socket /tmp/torch-demo/ckptd-{rank}.sock &
    mpirun -np 4 /usr/bin/python3 examples/train_torch.py --socket /tmp/torch-demo/ckptd-{rank}.sock --steps 60 --die-at 35 --loss-log /tmp/torch-demo/loss.tsv
    mpirun -np 3 /usr/bin/python3 examples/train_torch.py --socket /tmp/torch-demo/ckptd-{rank}.sock --steps 60 --loss-log /tmp/torch-demo/loss.tsv   # resumes from step 30 on 3 trainers

--socket's {rank} is the daemon's: trainer r uses daemon r mod --daemons (default 2).
The second command kills its trainers after step 35, once step 30 is committed; the
third resumes from step 30 on three trainers. (As root, mpirun also wants
--allow-run-as-root, and --oversubscribe for more trainers than cores.)

Rank 0 appends "step<TAB>loss" lines to --loss-log (repr, so curves compare exactly).
"""

import argparse
import os
import signal
import socket
import sys

from mpi4py import MPI

try:
    import ckptd
except ImportError:  # not installed: the package a build assembles in build/python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
    import ckptd
import ckptd.data
import ckptd.torch  # before anything of torch.distributed._shard (see docs/pytorch.md)

import torch
import torch.distributed as dist

INPUTS, HIDDEN, CLASSES = 16, 32, 4
SAMPLES, GLOBAL_BATCH = 2400, 24


def dataset():
    """A fixed synthetic problem: labels from a random teacher."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(SAMPLES, INPUTS, generator=g)
    y = torch.argmax(torch.tanh(x @ torch.randn(INPUTS, CLASSES, generator=g)), dim=1)
    return x, y


def join_gloo(comm):
    """torch.distributed over gloo, rendezvous through MPI: rank 0 picks a free port."""
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="daemon socket; {rank} is the daemon's rank")
    p.add_argument("--daemons", type=int, default=2, help="daemons on this machine (trainer r uses r mod this)")
    p.add_argument("--run", default="torch")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--die-at", type=int, default=0, help="SIGKILL every trainer after this step (0: never)")
    p.add_argument("--loss-log", default="", help="rank 0 appends step<TAB>loss lines")
    args = p.parse_args()

    comm = MPI.COMM_WORLD
    join_gloo(comm)
    rank, world = dist.get_rank(), dist.get_world_size()
    if GLOBAL_BATCH % world:
        sys.exit(f"train_torch: the global batch of {GLOBAL_BATCH} does not split over {world} trainers")
    client = ckptd.Client(args.socket.replace("{rank}", str(rank % args.daemons)))

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(INPUTS, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    position = ckptd.data.GlobalPosition(SAMPLES, seed=5)
    state = {"model": model.state_dict(), "optim": optimizer.state_dict(), "data": position, "step": 0}
    start = 0
    if client.latest_step(args.run) is not None:
        start = ckptd.torch.load(state, args.run, client=client)
        optimizer.load_state_dict(state["optim"])
        if rank == 0:
            print(f"resumed run '{args.run}' from step {start} on {world} trainer(s)", flush=True)
    elif rank == 0:
        print(f"no checkpoint, starting fresh on {world} trainer(s)", flush=True)

    x, y = dataset()
    pending = None
    for step in range(start + 1, args.steps + 1):
        indices = []
        while len(indices) < GLOBAL_BATCH // world:
            index = position.next()
            if index is None:  # the epoch is over on every trainer at once (even shares)
                position.set_epoch(position.epoch + 1)
                continue
            indices.append(index)
        batch = torch.tensor(indices)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch], reduction="sum") / GLOBAL_BATCH
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0 and args.loss_log:
            with open(args.loss_log, "a") as f:
                f.write(f"{step}\t{total.item()!r}\n")
        if step % args.checkpoint_every == 0:
            if pending is not None:
                ckptd.torch.wait(args.run, pending, client=client)
            state = {"model": model.state_dict(), "optim": optimizer.state_dict(), "data": position, "step": step}
            ckptd.torch.save(state, args.run, step, client=client)
            pending = step
        if step == args.die_at:
            if pending is not None:
                ckptd.torch.wait(args.run, pending, client=client)
            dist.barrier()
            os.kill(os.getpid(), signal.SIGKILL)
    if pending is not None:
        ckptd.torch.wait(args.run, pending, client=client)
    if rank == 0:
        print(f"trained to step {args.steps}", flush=True)
    client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
