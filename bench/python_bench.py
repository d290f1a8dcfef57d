#!/usr/bin/env python3
"""Benchmarks of the Python package (`make bench`, printed figures).

1. Checkpointer.save blocking time against torch.save of the same state,
   from 1 MB to 1 GB: the T0 copy into node shared memory (what a step
   waits for under an agent), the atomic durable commit of the fallback
   path, and torch.save to a file with and without fsync.
2. Client overhead: the Python reference trainer's median step time under
   `endure run` (the client reporting every step to the agent) against the
   same script under torchrun, in one run, rounds interleaved.

Usage: python_bench.py OUT_DIR [MAX_MB] [STEPS]
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import torch

import endure
import endure.torch

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(SOURCE, "examples", "python", "train_gpt.py")
ENDURE = os.path.join(SOURCE, "build", "bin", "endure")


def state_of(mb: int):
    """A model-like state: 4 MB float32 tensors (fewer for small sizes)."""
    total = mb << 20
    piece = min(total, 4 << 20)
    tensors = {f"layer{i}.weight": torch.randn(piece // 4) for i in range(total // piece)}
    return {"model": tensors, "progress": {"step": 1}}


def timed(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_save(out: str, max_mb: int):
    print("== Checkpointer.save blocking time vs torch.save (median of 3; 1 run for 1 GB)")
    print(f"{'state':>8} {'T0 copy':>10} {'durable':>10} {'torch.save':>11} "
          f"{'+fsync':>10} {'T0 vs torch.save':>17} {'vs +fsync':>10}")
    shm = tempfile.mkdtemp(prefix="endure-pybench-", dir="/dev/shm")
    disk = os.path.join(out, "save")
    os.makedirs(disk, exist_ok=True)
    try:
        for mb in (1, 16, 256, 1024):
            if mb > max_mb:
                break
            repeat = 1 if mb >= 1024 else 3
            state = state_of(mb)
            os.environ["ENDURE_T0_DIR"] = shm
            t0 = endure.torch.Checkpointer(endure.Session.from_env(), state)
            step = iter(range(1, 100))
            # The first save into each of the three slots maps its pages; a job
            # saving every step runs with all of them mapped.
            for _ in range(3):
                t0.save(next(step))
            t_t0 = timed(lambda: t0.save(next(step)), repeat)
            del os.environ["ENDURE_T0_DIR"]
            durable = endure.torch.Checkpointer(endure.Session.disabled(), state,
                                                directory=os.path.join(disk, f"d{mb}"), keep=1)
            t_dir = timed(lambda: durable.save(next(step)), repeat)
            path = os.path.join(disk, f"torch-{mb}.pt")
            t_torch = timed(lambda: torch.save(state, path), repeat)

            def save_fsync():
                with open(path, "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
            t_fsync = timed(save_fsync, repeat)
            print(f"{mb:>6}MB {t_t0 * 1e3:>8.2f}ms {t_dir * 1e3:>8.1f}ms {t_torch * 1e3:>9.1f}ms "
                  f"{t_fsync * 1e3:>8.1f}ms {t_torch / t_t0:>16.1f}x {t_fsync / t_t0:>9.1f}x", flush=True)
            for name in os.listdir(shm):
                os.unlink(os.path.join(shm, name))
            shutil.rmtree(os.path.join(disk, f"d{mb}"), ignore_errors=True)
            os.unlink(path)
            del state, t0, durable
    finally:
        shutil.rmtree(shm, ignore_errors=True)


STEP_LINE = re.compile(r"step\s+(\d+)/\d+ loss \S+ lr \S+\s+([\d.]+) ms")


def step_times(text: str, skip: int):
    times = [float(m.group(2)) for m in STEP_LINE.finditer(text) if int(m.group(1)) > skip]
    if not times:
        raise SystemExit("python_bench: no step lines in the trainer's output:\n" + text[-2000:])
    return times


def run_endure(out: str, steps: int, round_: int) -> str:
    state = os.path.join(out, f"endure-{round_}")
    shutil.rmtree(state, ignore_errors=True)  # a rerun would resume and append to the logs
    spec = os.path.join(out, f"endure-{round_}.toml")
    command = json.dumps([sys.executable, TRAINER, "--steps", str(steps), "--log-every", "1",
                          "--eval-batches", "0"])
    with open(spec, "w") as f:
        f.write(textwrap.dedent(f"""\
            [job]
            name = "pybench"
            command = {command}
            nodes = 2
            state_dir = "{state}"
            env = {{ PYTHONPATH = "{os.path.join(SOURCE, 'build', 'python')}" }}
            [checkpoint]
            every_steps = 0
            """))
    subprocess.run([ENDURE, "run", spec, "--quiet"], check=True, capture_output=True,
                   timeout=900)
    logs = []
    for root, _, names in os.walk(state):
        logs += [os.path.join(root, n) for n in names if n.endswith("-rank0.log")]
    if not logs:
        raise SystemExit(f"python_bench: no rank-0 log under {state}")
    with open(sorted(logs)[-1], errors="replace") as f:
        return f.read()


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(steps: int) -> str:
    env = dict(os.environ, PYTHONPATH=os.path.join(SOURCE, "build", "python"))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--redirects", "2", "--tee", "2", "--master_addr", "127.0.0.1",
                        "--master_port", str(free_port()), TRAINER,
                        "--steps", str(steps), "--log-every", "1", "--eval-batches", "0"],
                       check=True, capture_output=True, text=True, env=env, timeout=900)
    return p.stdout


def bench_overhead(out: str, steps: int):
    print()
    print(f"== Python trainer step time, 2 ranks, {steps} steps, no checkpoints: "
          "endure run vs torchrun (rounds interleaved; median over steps after the 5th)")
    endure_times, torchrun_times = [], []
    for r in range(2):
        endure_times += step_times(run_endure(out, steps, r), 5)
        torchrun_times += step_times(run_torchrun(steps), 5)
    e, t = statistics.median(endure_times), statistics.median(torchrun_times)
    print(f"endure run  {e:8.1f} ms/step (median of {len(endure_times)} steps)")
    print(f"torchrun    {t:8.1f} ms/step (median of {len(torchrun_times)} steps)")
    print(f"client overhead {100 * (e - t) / t:+.1f}% (target <= 1%)")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "runs/bench/python"
    max_mb = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    os.makedirs(out, exist_ok=True)
    for k in [k for k in os.environ if k.startswith("ENDURE_")]:
        del os.environ[k]
    bench_save(out, max_mb)
    bench_overhead(out, steps)


if __name__ == "__main__":
    main()
