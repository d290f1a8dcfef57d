#!/usr/bin/env python3
"""examples/python/train_gpt.py's model, data and step under torchft 0.2
(meta-pytorch/torchft), written the way its train_ddp.py example is, for
bench/python_recovery_bench.py: each replica group (here one rank) has a
torchft Manager (quorum at the lighthouse, state for healing), its
fault-tolerant process group (gloo) and OptimizerWrapper; a step commits only
when every participant's succeeded. The gradients are averaged with
`manager.allreduce` on one flat buffer after the backward pass, what
torchft's DistributedDataParallel does with one bucket: its communication
hook fails an assertion when a peer dies (torchft 0.2, ddp.py `_comm_hook`:
`assert fut._fut`), which ends the survivor too. A
replica that dies drops out of the quorum; the others go on (each computes
its own share of the global batch, averaged over the replicas that take
part); the restarted replica heals from a live one (its state_dict over
torchft's checkpoint transport) and rejoins.

Run one process per replica group under torchrun with REPLICA_GROUP_ID,
NUM_REPLICA_GROUPS and TORCHFT_LIGHTHOUSE (bench/peers/spawn.py torchft). It
takes train_gpt.py's flags; --ckpt-dir and --ckpt-every are accepted and
unused (torchft heals from a peer). Replica group 0 logs the steps."""

import datetime
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples", "python"))
import train_gpt as tg  # noqa: E402

import torchft  # noqa: E402


def main(argv):
    args = tg.parse_args(argv)
    torch.set_num_threads(args.threads or int(os.environ.get("OMP_NUM_THREADS", "1")))
    group = int(os.environ.get("REPLICA_GROUP_ID", "0"))
    groups = int(os.environ.get("NUM_REPLICA_GROUPS", "2"))
    text, _ = tg.load_corpus(args.data, args.val_fraction)
    model, inner = tg.make_model(args)

    def state_dict():
        return {"model": model.state_dict(), "optimizer": inner.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optimizer"])

    # The settings of torchft's train_ddp.py example.
    manager = torchft.Manager(
        pg=torchft.ProcessGroupGloo(timeout=datetime.timedelta(seconds=5)),
        min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
        replica_id=f"train_gpt_{group}", timeout=datetime.timedelta(seconds=10))
    optimizer = torchft.Optimizer(manager, inner)
    slots = args.global_batch // args.micro_batch
    per_group = max(1, slots // groups)
    mine = range(group * per_group, (group + 1) * per_group)
    while manager.current_step() < args.steps:
        step = manager.current_step()
        t0 = time.monotonic()
        lr = tg.learning_rate(args, step)
        for g in inner.param_groups:
            g["lr"] = lr
        optimizer.zero_grad(set_to_none=True)  # starts the quorum
        local_loss = 0.0
        for slot in mine:
            x, y = tg.batch(text, args.seed, step, slot * args.micro_batch, args.micro_batch,
                            args.context)
            loss = model(x, y) / len(mine)
            loss.backward()
            local_loss += loss.item()
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        manager.allreduce(flat).wait()  # the participants' mean; after an error, a no-op
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()  # applied only when the step commits
        done = manager.current_step()
        if group == 0 and done > step and (done == 1 or done % args.log_every == 0):
            print(f"step {done:6d}/{args.steps} loss {local_loss:.4f} lr {lr:.2e} "
                  f"{(time.monotonic() - t0) * 1000:7.1f} ms world {manager.num_participants()}",
                  flush=True)
    manager.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
