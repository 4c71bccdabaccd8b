#!/usr/bin/python3
"""A small numpy MLP trained data-parallel under mpirun, checkpointed by ckptd.

Each MPI rank is one trainer: it computes gradients on its share of every batch,
averages them with MPI_Allreduce (mpi4py), and applies the same SGD update, so the
parameters stay identical everywhere. Every --checkpoint-every steps each trainer
hands its (replicated) parameters to the ckptd on its host; ckptd writes each tensor
once. Save returns as soon as the bytes are staged, so training goes on while the
daemons write; the trainer waits for a checkpoint only before starting the next.

On start the trainer restores the newest committed step of the run, if any, and goes
on from there: same data order, same updates, so the loss curve is identical to a
run that was never interrupted. Try it from the repository root once it is built
(scripts/demo.sh or scripts/test.sh), beside two daemons:

    mpirun -np 2 build/ckptd --root /tmp/mlp-demo/root --socket /tmp/mlp-demo/ckptd-{rank}.sock &
    mpirun -np 2 /usr/bin/python3 examples/train_mlp.py --socket /tmp/mlp-demo/ckptd-{rank}.sock --steps 200 --die-at 130 --loss-log /tmp/mlp-demo/loss.tsv
    mpirun -np 2 /usr/bin/python3 examples/train_mlp.py --socket /tmp/mlp-demo/ckptd-{rank}.sock --steps 200 --loss-log /tmp/mlp-demo/loss.tsv   # resumes from step 130

The second command kills its trainers after step 130, once step 130 is committed;
the third resumes from it. (As root, mpirun also wants --allow-run-as-root.) The
ckptd package comes from an install (pip install client/python) or, in a built
tree, from build/python, which this script finds by itself.

Rank 0 appends "step<TAB>loss" lines to --loss-log (losses printed with repr, so two
curves compare exactly).
"""

import argparse
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

try:
    import ckptd
except ImportError:  # not installed: the package a build assembles in build/python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
    import ckptd

INPUTS, HIDDEN, CLASSES = 16, 32, 4
SAMPLES = 4096


def make_dataset(seed):
    """A fixed synthetic classification problem: labels from a random teacher net."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((SAMPLES, INPUTS)).astype(np.float32)
    teacher = rng.standard_normal((INPUTS, CLASSES)).astype(np.float32)
    y = np.argmax(np.tanh(x @ teacher) + 0.1 * rng.standard_normal((SAMPLES, CLASSES)), axis=1)
    return x, y


def init_params(seed):
    rng = np.random.default_rng(seed + 1)
    return {
        "layer1/kernel": (rng.standard_normal((INPUTS, HIDDEN)) / np.sqrt(INPUTS)).astype(np.float32),
        "layer1/bias": np.zeros(HIDDEN, np.float32),
        "layer2/kernel": (rng.standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN)).astype(np.float32),
        "layer2/bias": np.zeros(CLASSES, np.float32),
    }


def batch_indices(step, batch, seed):
    """The samples of global batch `step`: a pure function of (seed, step), so a
    resumed run sees exactly the batches an uninterrupted one would."""
    return np.random.default_rng([seed, step]).choice(SAMPLES, size=batch, replace=False)


def loss_and_grads(params, x, y, total):
    """Summed cross-entropy over this rank's samples divided by the global batch size,
    and its gradients, so that summing over ranks gives the batch mean."""
    h_pre = x @ params["layer1/kernel"] + params["layer1/bias"]
    h = np.maximum(h_pre, 0)
    logits = h @ params["layer2/kernel"] + params["layer2/bias"]
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y] + 1e-12).sum() / total
    d_logits = p
    d_logits[np.arange(len(y)), y] -= 1
    d_logits /= total
    d_h = (d_logits @ params["layer2/kernel"].T) * (h_pre > 0)
    grads = {
        "layer2/kernel": h.T @ d_logits,
        "layer2/bias": d_logits.sum(axis=0),
        "layer1/kernel": x.T @ d_h,
        "layer1/bias": d_h.sum(axis=0),
    }
    return np.float64(loss), grads


def allreduce_sum(comm, array):
    out = np.empty_like(array)
    comm.Allreduce(array, out, op=MPI.SUM)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True,
                        help="daemon socket; {rank} is replaced by the trainer's host index")
    parser.add_argument("--trainers-per-daemon", type=int, default=1)
    parser.add_argument("--run", default="mlp")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--loss-log", default="loss.tsv")
    parser.add_argument("--die-at", type=int, default=0,
                        help="simulate a crash: SIGKILL every trainer after this step, once its "
                             "last checkpoint is committed")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    x, y = make_dataset(args.seed)
    client = ckptd.Client(args.socket.replace("{rank}", str(rank // args.trainers_per_daemon)),
                          timeout=60)

    params = init_params(args.seed)
    start = 1
    try:
        restored = client.restore(args.run, None, {name: (p.shape, p.dtype, None)
                                                   for name, p in params.items()},
                                  trainer_id=rank, trainer_state=True)
        # Views of the shared-memory segment: copy into arrays this process owns.
        params = {name: np.array(restored[name]) for name in params}
        start = int(restored.trainer_state["next_step"]) if "next_step" in restored.trainer_state \
            else restored.step + 1
        if rank == 0:
            print(f"resumed run '{args.run}' from step {restored.step}", flush=True)
    except ckptd.Error as e:
        if e.code.name != "NOT_FOUND":
            raise
        if rank == 0:
            print(f"run '{args.run}': no checkpoint, starting fresh", flush=True)

    log = open(args.loss_log, "a") if rank == 0 else None
    pending = None  # the step being committed
    loss = float("nan")
    for step in range(start, args.steps + 1):
        batch = batch_indices(step, args.batch, args.seed)
        mine = batch[rank::world]
        loss, grads = loss_and_grads(params, x[mine], y[mine], args.batch)
        loss = comm.allreduce(loss, op=MPI.SUM)
        for name in params:
            params[name] -= np.float32(args.lr) * allreduce_sum(comm, grads[name]).astype(np.float32)
        if log:
            log.write(f"{step}\t{loss!r}\n")
            log.flush()
        if step % args.checkpoint_every == 0:
            if pending is not None:
                client.wait(args.run, pending)
            # Returns once staged: the update of the next step may overwrite params.
            client.save(args.run, step, params, trainer_id=rank, trainer_count=world,
                        trainer_state={"next_step": str(step + 1).encode()})
            pending = step
        if step == args.die_at:
            if pending is not None:
                client.wait(args.run, pending)
            comm.Barrier()
            os.kill(os.getpid(), signal.SIGKILL)
    if pending is not None:
        client.wait(args.run, pending)
    if rank == 0:
        print(f"trained to step {args.steps}, final loss {loss:.6f}", flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
