#!/usr/bin/env python3
"""The reference GPT trainer in PyTorch: the Python twin of endure-train.

The same model as build/bin/endure-train (a GPT-2 style decoder: 4 layers,
d-model 128, 4 heads, context 128, byte tokens), the same data (the batch of
step s is a pure function of (seed, s), whatever the world size), the same
optimizer and schedule, trained data parallel with DistributedDataParallel on
gloo. It uses Endure's Python package for everything Endure offers a
program: step reports, injected faults (bitflip and collective faults
included), every-step checkpoints into node memory and a bit-exact restore,
Python stacks on a hang, phases (a periodic evaluation with --eval-every runs
in the phase "eval", checkpoints in "checkpoint") and parameter fingerprints
for the silent-data-corruption check.

It runs three ways, unchanged:

    python3 examples/python/train_gpt.py --steps 100
    torchrun --nproc_per_node 2 --redirects 2 --tee 2 examples/python/train_gpt.py \\
        --steps 100 --ckpt-dir runs/py-ckpt --ckpt-every 20
    build/bin/endure run examples/python/demo.toml

(PYTHONPATH must hold build/python; Debian's torchrun 1.13 needs
--redirects 2 --tee 2.) At the end rank 0 prints the validation loss and
`param_fingerprint=...`, which a run with injected faults reproduces.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import endure
import endure.torch

MASK64 = (1 << 64) - 1


# ---- Model: the same modules and parameter names as src/trainer/gpt.cc ----

class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, context: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        # A plain attribute, as in gpt.cc: neither saved nor synchronised by DDP
        # (gloo cannot broadcast bool tensors).
        self.mask = torch.ones(context, context, dtype=torch.bool).triu(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        H, D = self.heads, C // self.heads
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(-1)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, context: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, context)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.fc_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers=4, d_model=128, heads=4, context=128, vocab=256):
        super().__init__()
        self.vocab = vocab
        self.token_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, context) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        # GPT-2 initialisation: N(0, 0.02) for weights and embeddings, zero biases.
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "bias" in name:
                    p.zero_()
                elif "ln" not in name:
                    p.normal_(0.0, 0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = tokens.size(1)
        x = self.token_emb(tokens) + self.pos_emb(torch.arange(T))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, self.vocab), targets.reshape(-1))


# ---- Data: the same corpus split and batches as src/trainer/corpus.cc ----

BLOCK = 4096


def load_corpus(paths, val_fraction):
    files = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p, followlinks=True):
                files.extend(os.path.join(root, n) for n in names)
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise SystemExit(f"train_gpt.py: --data: '{p}' is neither a file nor a directory")
    text, seen = bytearray(), set()
    for f in sorted(files):
        real = os.path.realpath(f)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        with open(f, "rb") as fh:
            data = fh.read()
        if not data or b"\0" in data[:BLOCK]:
            continue
        text += data
    if len(text) < 64 * BLOCK:
        raise SystemExit(f"train_gpt.py: --data: found {len(text)} bytes of text; need at "
                         "least 256 KiB (install the 'fortunes' package for the default corpus)")
    every = int(1.0 / val_fraction + 0.5)
    train, val = bytearray(), bytearray()
    for block in range(0, (len(text) + BLOCK - 1) // BLOCK):
        chunk = text[block * BLOCK:(block + 1) * BLOCK]
        (val if block % every == every - 1 else train).extend(chunk)
    return torch.frombuffer(train, dtype=torch.uint8), torch.frombuffer(val, dtype=torch.uint8)


def mix_seed(seed: int, a: int, b: int) -> int:
    def mix(z: int) -> int:
        z = (z + 0x9E3779B97F4A7C15) & MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)
    return mix(mix(mix(seed) ^ (a & MASK64)) ^ (b & MASK64))


def batch(text: torch.Tensor, seed: int, step: int, first: int, count: int, context: int):
    span = text.numel() - context - 1
    offsets = [mix_seed(seed, step, i) % span for i in range(first, first + count)]
    rows = torch.stack([text[o:o + context + 1] for o in offsets]).long()
    return rows[:, :context], rows[:, 1:]


def learning_rate(args, step: int) -> float:
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    decay_steps = max(1, args.steps - args.warmup_steps)
    progress = min(1.0, (step - args.warmup_steps) / decay_steps)
    min_lr = args.lr * args.min_lr_ratio
    return min_lr + 0.5 * (args.lr - min_lr) * (1.0 + math.cos(math.pi * progress))


class TorchRNG:
    """The CPU generator's state, as a checkpointable object."""

    def state_dict(self):
        return {"cpu": torch.get_rng_state()}

    def load_state_dict(self, state):
        torch.set_rng_state(state["cpu"])


def keep_freed_memory():
    """glibc hands large freed blocks back to the kernel, so every step
    faults its activations in again; endure-train pins the thresholds for a
    2x faster step here, and so does this twin."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD
    except OSError:
        pass


def parse_args(argv):
    p = argparse.ArgumentParser(description="GPT on byte tokens, data parallel (DDP, gloo)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--data", nargs="+", default=["/usr/share/games/fortunes"])
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--ckpt-dir", default="", help="durable checkpoints (without node memory)")
    p.add_argument("--ckpt-every", type=int, default=0, help="steps between checkpoints")
    p.add_argument("--ckpt-keep", type=int, default=3)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate every N steps, in the phase \"eval\" (0: never)")
    p.add_argument("--eval-steps", type=int, default=0,
                   help="forward passes on held-out batches per evaluation")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads per rank")
    p.add_argument("--collective-timeout-s", type=int, default=300)
    p.add_argument("--exact-sum", action="store_true",
                   help="sum gradients in fixed point instead of DDP's allreduce: the same "
                        "parameters bit for bit whatever the world size (a shrink, a regrow)")
    args = p.parse_args(argv)
    problems = []
    if args.steps < 1:
        problems.append("--steps must be at least 1")
    if args.d_model % args.heads:
        problems.append("--d-model must be a multiple of --heads")
    if args.ckpt_every < 0:
        problems.append("--ckpt-every must be >= 0")
    if args.eval_every < 0:
        problems.append("--eval-every must not be negative")
    if args.eval_steps < 0:
        problems.append("--eval-steps must not be negative")
    if args.eval_every > 0 and args.eval_steps < 1:
        problems.append("--eval-every needs --eval-steps K >= 1 (forward passes per evaluation)")
    if args.eval_steps > 0 and args.eval_every < 1:
        problems.append("--eval-steps needs --eval-every N >= 1 (steps between evaluations)")
    if problems:
        p.error("; ".join(problems))
    return args


def make_model(args, shard=None):
    """The seeded GPT of `args` and its AdamW (no weight decay on biases and
    norms); `shard(model)`, when given, shards it (FSDP's fully_shard)
    before the optimizer takes its parameters."""
    torch.manual_seed(args.seed)
    model = GPT(args.layers, args.d_model, args.heads, args.context)
    if shard is not None:
        shard(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    return model, optimizer


def held_out_loss(model, val_text, args, batches: int) -> float:
    """The mean loss over `batches` held-out micro-batches, as endure-train
    computes it. Changes nothing: no gradients, and the batches are a pure
    function of the seed (no draw from torch's generator), so training after
    it is bit for bit training without it."""
    with torch.no_grad():
        losses = []
        for b in range(batches):
            x, y = batch(val_text, args.seed, -1 - b, 0, args.micro_batch, args.context)
            losses.append(model(x, y).item())
    return sum(losses) / len(losses) if losses else float("nan")


def start(args, program: str):
    """The corpus (train, validation) and the endure.Session of a run of
    `args`; None for the session when its environment is malformed (said
    on stderr, under `program`'s name)."""
    keep_freed_memory()
    texts = load_corpus(args.data, args.val_fraction)
    # A warm standby ([recovery] warm_standby) waits here, with torch and
    # the corpus loaded, until the agent makes it a failed rank's
    # replacement; any other start goes straight on.
    endure.await_assignment()
    try:
        session = endure.Session.from_env()
    except ValueError as e:
        print(f"{program}: {e}", file=sys.stderr)
        return texts, None
    session.set_total_steps(args.steps)
    if session.checkpoint_every is not None:
        args.ckpt_every = session.checkpoint_every
    return texts, session


def main(argv) -> int:
    args = parse_args(argv)
    (train_text, val_text), session = start(args, "train_gpt.py")
    if session is None:
        return 2
    world = int(os.environ.get("WORLD_SIZE", "1") or "1")
    slots = args.global_batch // args.micro_batch
    if args.global_batch % args.micro_batch or slots % world:
        print(f"train_gpt.py: --global-batch {args.global_batch} must split into "
              f"{world} ranks x whole --micro-batch {args.micro_batch}", file=sys.stderr)
        return 2
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "0") or "0") or 1
    torch.set_num_threads(threads)

    model, optimizer = make_model(args)

    # The loop restores the state (from the checkpoint tiers, or from a
    # data-parallel peer), and under `[recovery] in_process` survives a
    # peer's failure in this process: it rejoins the next generation, whose
    # world may be smaller or larger, and runs the failed step again.
    loop = endure.torch.Loop(
        session, {"model": model, "optimizer": optimizer, "rng": TorchRNG()}, args.steps,
        directory=args.ckpt_dir, keep=args.ckpt_keep,
        timeout=datetime.timedelta(seconds=args.collective_timeout_s))
    ddp = loop.ddp(model)
    exact = loop.exact_gradients(model.parameters()) if args.exact_sum else None
    ckpt = loop.checkpointer
    tokens_per_step = args.global_batch * args.context
    can_save = session.memory_checkpoints or bool(ckpt.directory)
    model.train()
    for step in loop:
        world, rank = loop.world_size, loop.rank
        leader = rank == 0
        if step == loop.start_step and loop.rejoins == 0 and leader:
            if step > 0:
                print(f"restored {ckpt.last_restore_summary}", flush=True)
            n = sum(p.numel() for p in model.parameters())
            print(f"train_gpt.py: {n} parameters, {world} ranks, global batch "
                  f"{args.global_batch} ({slots} micro-batches of {args.micro_batch})",
                  flush=True)
        session.begin_step(step)  # injected kill/exit/hang/log faults fire here
        t0 = time.monotonic()
        done = step + 1
        with loop.guard():  # a collective that fails here: a peer failed
            if session.should_skip(step):
                if leader:
                    print(f"step {done:6d}/{args.steps} skipped (ENDURE_SKIP_STEPS)",
                          flush=True)
            else:
                lr = learning_rate(args, step)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                optimizer.zero_grad(set_to_none=True)
                local_loss = 0.0
                comm_s = 0.0
                mine = loop.slots(slots)  # this rank's micro-batches, by the current world
                for slot in mine:
                    x, y = batch(train_text, args.seed, step, slot * args.micro_batch,
                                 args.micro_batch, args.context)
                    last = slot == mine[-1]
                    if last:
                        # DDP's gradient allreduce runs in this backward:
                        # injected comm-fail and comm-slow act here.
                        comm_s += session.before_collective(step)
                    if exact is not None:
                        loss = model(x, y) / slots  # summed exactly over every slot
                        loss.backward()
                        exact.take_slot()
                    else:
                        with (_null() if last else ddp.no_sync()):
                            # DDP averages over the ranks: each slot's share
                            # of the global batch's mean.
                            loss = ddp(x, y) / (slots / world)
                            loss.backward()
                    local_loss += loss.item()
                if exact is not None:
                    exact.reduce(slots)
                compute_s = time.monotonic() - t0 - comm_s
                if world > 1:
                    t = torch.tensor([local_loss], dtype=torch.float64)
                    dist.all_reduce(t)
                    step_loss = t.item() / (1 if exact is not None else world)
                else:
                    step_loss = local_loss
                if args.grad_clip > 0:
                    nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
                optimizer.step()
        if loop.failed:
            continue  # the loop rejoins and runs this step again
        # Silent data corruption, when injected, lands after the update and
        # before the fingerprint, as a faulty device's would.
        flip = session.bitflip_due(step)
        if flip is not None:
            name = endure.torch.apply_bitflip(model.named_parameters(), flip)
            print(f"train_gpt.py: rank {rank}: flipped bit {flip.bit} of element "
                  f"{flip.element} of {name}", file=sys.stderr, flush=True)
        if session.fingerprint_due(step):
            session.report_fingerprint(step, endure.fingerprint(model.named_parameters()))
        if can_save and args.ckpt_every > 0 and (done % args.ckpt_every == 0 or
                                                 done == args.steps):
            ckpt.save(done)
        if session.should_skip(step):
            session.end_skipped_step(step)
        else:
            logged = session.end_step(step, loss=step_loss, compute_s=compute_s, comm_s=comm_s,
                                      tokens=tokens_per_step)
            if leader and (done == 1 or done % args.log_every == 0 or done == args.steps):
                ms = (time.monotonic() - t0) * 1000
                print(f"step {done:6d}/{args.steps} loss {logged:.4f} lr {lr:.2e} {ms:7.1f} ms "
                      f"ckpt {ckpt.last_stall_s * 1000:.2f} ms", flush=True)
        if args.eval_every > 0 and done % args.eval_every == 0:
            # Every rank evaluates the same held-out batches, on the module
            # itself (not through DDP: no collective), in its own phase.
            e0 = time.monotonic()
            with session.phase("eval"):
                eval_loss = held_out_loss(model, val_text, args, args.eval_steps)
            if leader:
                print(f"eval after step {done}/{args.steps} | loss {eval_loss:.4f} | "
                      f"{args.eval_steps} batches in {(time.monotonic() - e0) * 1000:.1f} ms",
                      flush=True)

    world, leader = loop.world_size, loop.rank == 0
    if leader:
        # The final evaluation takes longer than a step: a phase of its own,
        # with its own timeout, and no hang.
        session.phase("eval")
        model.eval()
        if args.eval_batches > 0:
            print(f"validation loss {held_out_loss(model, val_text, args, args.eval_batches):.4f}")
        print(f"param_fingerprint={endure.fingerprint(model.named_parameters())}", flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
