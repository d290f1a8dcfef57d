#!/usr/bin/env python3
"""examples/python/train_gpt.py's model, data and step under NVIDIA
resiliency-ext's in-process restart (`inprocess.Wrapper`), written the way its
optimal example is (nvidia-resiliency-ext examples/inprocess), for
bench/python_recovery_bench.py: the model, optimizer and the wrapper's base
store are made once; the wrapped function forms a process group on a store
prefix per restart iteration, wraps DDP and trains from the step this process
reached. After a fault the wrapper re-enters it on the ranks that remain
(ShiftRanks: a killed rank is not replaced), so the job goes on with fewer
ranks; the global batch stays the same (the micro-batches are split by the
current world, as endure.torch.Loop.slots does), and the ranks agree on the
most-advanced state (a broadcast from rank 0 after a restart).

Run it the way the wrapper expects, one process per rank with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT (bench/peers/spawn.py ranks), not
under torchrun (which stops every local worker when one dies). It takes
train_gpt.py's flags; --ckpt-dir and --ckpt-every are accepted and unused
(the wrapper keeps the state in memory)."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples", "python"))
import train_gpt as tg  # noqa: E402

import nvidia_resiliency_ext.inprocess as inprocess  # noqa: E402


class Progress:
    completed = 0  # steps this process applied; kept across restart iterations


@inprocess.Wrapper(
    store_kwargs={"port": int(os.environ.get("MASTER_PORT", "29500")) + 2},
    # On a CPU there is no CUDA health check to run; every other setting is
    # the wrapper's default.
    health_check=None,
)
def train(base_store, model, optimizer, text, args, progress,
          call_wrapper: inprocess.CallWrapper = None):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.PrefixStore(str(call_wrapper.iteration), base_store)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.collective_timeout_s))
    if world > 1:
        # After a restart the ranks agree on the step and the state: rank 0's.
        step = torch.tensor([progress.completed])
        dist.broadcast(step, 0)
        progress.completed = int(step.item())
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    if world > 1 and progress.completed > 0:  # Adam's moments exist from the first step on
        for state in optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    dist.broadcast(value, 0)
    slots = args.global_batch // args.micro_batch
    base, extra = divmod(slots, world)
    first = rank * base + min(rank, extra)
    mine = range(first, first + base + (1 if rank < extra else 0))
    for step in range(progress.completed, args.steps):
        t0 = time.monotonic()
        lr = tg.learning_rate(args, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        local_loss = 0.0
        for slot in mine:
            x, y = tg.batch(text, args.seed, step, slot * args.micro_batch, args.micro_batch,
                            args.context)
            with (tg._null() if slot == mine[-1] or world == 1 else ddp.no_sync()):
                loss = ddp(x, y) / (slots / world)
                loss.backward()
            local_loss += loss.item()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        progress.completed = step + 1
        if rank == 0 and (step == 0 or (step + 1) % args.log_every == 0):
            print(f"step {step + 1:6d}/{args.steps} loss {local_loss:.4f} lr {lr:.2e} "
                  f"{(time.monotonic() - t0) * 1000:7.1f} ms world {world}", flush=True)
    dist.destroy_process_group()


def main(argv):
    args = tg.parse_args(argv)
    torch.set_num_threads(args.threads or int(os.environ.get("OMP_NUM_THREADS", "1")))
    text, _ = tg.load_corpus(args.data, args.val_fraction)
    model, optimizer = tg.make_model(args)
    base_store = dist.TCPStore(
        host_name=os.environ["MASTER_ADDR"], port=int(os.environ["MASTER_PORT"]) + 1,
        world_size=int(os.environ["WORLD_SIZE"]), is_master=int(os.environ["RANK"]) == 0,
        multi_tenant=True, wait_for_workers=True, use_libuv=True)
    train(base_store, model, optimizer, text, args, Progress())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
