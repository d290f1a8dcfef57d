#!/usr/bin/env python3
"""An unmodified data-parallel PyTorch script, as users run them under
torchrun: DistributedDataParallel on gloo, no Endure import, progress printed
by rank 0 one line per step ("step N/M loss X"). false_alarm_bench.py runs it
under `endure run` with a progress_pattern.

The model: a byte-level next-token MLP over a window of 8 bytes of a text
file, trained with AdamW on batches drawn from a seeded generator.

Usage: plain_ddp.py --steps N [--data FILE] [--batch B]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--data", default="/usr/share/games/fortunes/fortunes")
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(args.data, "rb") as f:
        data = torch.tensor(list(f.read()[:1 << 20]), dtype=torch.long)
    window = 8
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Embedding(256, 32), torch.nn.Flatten(),
                                torch.nn.Linear(32 * window, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 256))
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        idx = torch.randint(0, len(data) - window - 1, (args.batch,), generator=gen)
        x = torch.stack([data[i:i + window] for i in idx.tolist()])
        y = data[idx + window]
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step + 1}/{args.steps} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
