#!/usr/bin/env python3
"""The reference GPT sharded with FSDP (fully_shard, torch >= 2.6): the
model, data, optimizer and schedule of train_gpt.py, each rank holding only
its shard of the parameters and optimizer state.

What it shows is the one change a sharded program makes for
endure.torch.Loop: it gives the loop a *function* that builds its state, not
the state. Each rank's shard is its own, so when a rank fails its part of
the state is gone from every process; the survivors keep their processes
(torch imported, data loaded), and the loop builds the state anew over the
next generation's process group, and restores into it the newest step the
checkpoint tiers hold, the failed rank's part from its node's memory (or its
replica's, after a lost node). A job that shrinks or grows back re-shards:
each rank takes the block its new place gives it from the saved blocks.

    build/bin/endure run examples/python/fsdp.toml

It needs node-memory checkpoints ([checkpoint] every_steps): a sharded
state is saved through them, each rank its shard. At the end rank 0 prints
`param_fingerprint=...` of the full parameters, which a run with injected
faults reproduces.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import endure
import endure.torch
from train_gpt import TorchRNG, batch, learning_rate, make_model, parse_args, start


def main(argv) -> int:
    args = parse_args(argv)
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        print(f"train_fsdp.py: needs torch >= 2.6 (torch.distributed.fsdp.fully_shard); this "
              f"is torch {torch.__version__}", file=sys.stderr)
        return 2
    (train_text, _), session = start(args, "train_fsdp.py")
    if session is None:
        return 2
    slots = args.global_batch // args.micro_batch
    if args.global_batch % args.micro_batch:
        print(f"train_fsdp.py: --global-batch {args.global_batch} must be whole "
              f"--micro-batch {args.micro_batch}es", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads or int(os.environ.get("OMP_NUM_THREADS") or 1))

    def shard(model):
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)

    def build():
        # Over the current process group: called again after each rejoin.
        model, optimizer = make_model(args, shard)
        return {"model": model, "optimizer": optimizer, "rng": TorchRNG()}

    loop = endure.torch.Loop(session, build, args.steps,
                             timeout=datetime.timedelta(seconds=args.collective_timeout_s))
    tokens_per_step = args.global_batch * args.context
    for step in loop:
        model, optimizer = loop.state["model"], loop.state["optimizer"]
        world, leader = loop.world_size, loop.rank == 0
        if step == loop.start_step and loop.rejoins == 0 and leader:
            if step > 0:
                print(f"restored {loop.checkpointer.last_restore_summary}", flush=True)
            print(f"train_fsdp.py: {world} ranks, global batch {args.global_batch} "
                  f"({slots} micro-batches of {args.micro_batch})", flush=True)
        session.begin_step(step)
        t0 = time.monotonic()
        done = step + 1
        with loop.guard():  # a collective that fails here: a peer failed
            lr = learning_rate(args, step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            local_loss, comm_s = 0.0, 0.0
            mine = loop.slots(slots)
            for slot in mine:
                x, y = batch(train_text, args.seed, step, slot * args.micro_batch,
                             args.micro_batch, args.context)
                last = slot == mine[-1]
                if last:
                    comm_s += session.before_collective(step)
                # Gradients reduce-scatter (averaged over the ranks) after
                # the last micro-batch only.
                model.set_requires_gradient_sync(last)
                loss = model(x, y) / (slots / world)
                loss.backward()
                local_loss += loss.item()
            t = torch.tensor([local_loss], dtype=torch.float64)
            if world > 1:
                dist.all_reduce(t)
            step_loss = t.item() / world
            if args.grad_clip > 0:
                nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            optimizer.step()
        if loop.failed:
            continue  # the loop rejoins and runs the step again (or an earlier one)
        if session.fingerprint_due(step):
            session.report_fingerprint(step, full_fingerprint(model))
        if session.memory_checkpoints and args.ckpt_every > 0 and (
                done % args.ckpt_every == 0 or done == args.steps):
            loop.checkpointer.save(done)
        logged = session.end_step(step, loss=step_loss, comm_s=comm_s, tokens=tokens_per_step)
        if leader and (done == 1 or done % args.log_every == 0 or done == args.steps):
            print(f"step {done:6d}/{args.steps} loss {logged:.4f} lr {lr:.2e} "
                  f"{(time.monotonic() - t0) * 1000:7.1f} ms", flush=True)

    fingerprint = full_fingerprint(loop.state["model"])  # every rank: it gathers
    if loop.rank == 0:
        print(f"param_fingerprint={fingerprint}", flush=True)
    if loop.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def full_fingerprint(model) -> str:
    """endure.fingerprint of the full (gathered) parameters: the same on
    every rank, and the same whatever the world size."""
    return endure.fingerprint((name, p.full_tensor() if hasattr(p, "full_tensor") else p)
                              for name, p in model.named_parameters())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
