#!/usr/bin/env python3
"""PyTorch programs' recovery (`make bench`, printed figures, one run): the
same DDP job, examples/python/train_gpt.py (2 ranks, gloo, the demo model),
with the same failure, under

  (a) Endure in process (`[recovery] in_process`, the default): the
      surviving rank keeps its process and state (endure.torch.Loop), the
      killed one starts in a warm standby interpreter and takes the state
      from it;
  (b) Endure, full restart from the checkpoint tiers (in_process = false;
      every-step checkpoints in node memory, warm standbys);
  (c) torchrun 2.x (the virtualenv's, default --monitor-interval) with
      --max-restarts and the script's own disk checkpoints every 20 steps;
  (d) NVIDIA resiliency-ext's ft_launcher, the same way;
  (e) resiliency-ext's in-process wrapper (bench/peers/inprocess_train_gpt.py,
      the script's model and step inside `inprocess.Wrapper`, one process per
      rank as the wrapper expects): the surviving rank goes on without the
      killed one;
  (f) torchft 0.2 (bench/peers/torchft_train_gpt.py: a lighthouse, two
      replica groups of one rank each under torchrun): the surviving replica
      goes on alone, the killed one is restarted and heals from it.

Failures: a SIGKILL of rank 1 as step 25 (of 50) begins, rounds interleaved;
the time from the kill to the first productive step after it, the steps
lost, the world size after; then a SIGSTOP of rank 1 (once per system; the
peers have no hang detection for a script without their client, so their
figure is how long the job stood still, bounded); then ETTR under a seeded
Poisson schedule of kills (MTBF 30 s, about ETTR_SECONDS of training): Endure
injects the schedule; the other systems' workers are killed at the times its
kills fell (seconds after the job's start), a random worker each time. ETTR is
Endure's ledger for Endure; for the launchers the same count from rank 0's
step lines (the time of each step that survives into the final model, over
the wall time).

Runs under the torch 2.x virtualenv of scripts/torch-venv (all systems with
the same torch); without it, says so and stops.

Usage: python_recovery_bench.py OUT_DIR [ROUNDS] [ETTR_SECONDS]
(BENCH_PY_PARTS: which parts to run, of kill,stop,ettr; all.
BENCH_PY_STOP_LIMIT: seconds a launcher's stopped job is watched; 60.)
"""

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time

from launched import PYTHONPATH, SOURCE, STEP_LINE, TRAINER, Launcher, free_port, median

sys.path.insert(0, os.path.join(SOURCE, "tests"))
from held_rank import rank_pid  # noqa: E402  (tests/held_rank.py)

ENDURE = os.path.join(SOURCE, "build", "bin", "endure")
PEERS = os.path.join(SOURCE, "bench", "peers")
VENV_BIN = os.path.dirname(sys.executable)

STEPS = 50
KILL_STEP = 25  # 1-based: rank 1 dies as this step begins
LAUNCHER_CKPT_EVERY = 20
KILL_LIMIT_S = 90  # a launcher's run with one kill, at most (a clean one takes about 15 s)


def median_range(values):
    values = [v for v in values if v == v]
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


# ---- Endure ----

def endure_spec(out, name, steps, in_process, faults=""):
    state = os.path.join(out, name)
    shutil.rmtree(state, ignore_errors=True)
    command = json.dumps([sys.executable, TRAINER, "--steps", str(steps), "--log-every", "1",
                          "--eval-batches", "0"])
    spec = os.path.join(out, name + ".toml")
    with open(spec, "w") as f:
        f.write(f'[job]\nname = "{name}"\ncommand = {command}\nnodes = 2\nranks_per_node = 1\n'
                f'state_dir = "{state}"\nenv = {{ PYTHONPATH = "{PYTHONPATH}", '
                f'OMP_NUM_THREADS = "1" }}\n'
                "[checkpoint]\nevery_steps = 1\npersist_every_steps = 20\n"
                '[detection]\nstartup_timeout = "120s"\n'
                # Kills hit random ranks of 2 nodes, so the same node fails
                # again soon; isolating it is for real clusters.
                f"[recovery]\nwarm_standby = true\nevict_node_after = 0\nmax_restarts = 1000\n"
                f'backoff_initial = "0s"\nin_process = {"true" if in_process else "false"}\n'
                f"{faults}")
    return spec, state


def endure_report(state):
    with open(os.path.join(state, "report.json")) as f:
        return json.load(f)


def endure_kill(out, name, in_process):
    fault = f'[[faults]]\nkind = "kill"\nrank = 1\nstep = {KILL_STEP}\n'
    spec, state = endure_spec(out, name, STEPS, in_process, fault)
    with open(os.path.join(out, name + ".out"), "w") as log:
        p = subprocess.run([ENDURE, "run", spec, "--quiet"], stdout=log,
                           stderr=subprocess.STDOUT, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"python_recovery_bench: {name} failed; see {log.name}")
    inc = endure_report(state)["incidents"][0]
    return inc["recovered_after_s"], inc["steps_lost"], inc.get("route") or "", 2


def rank0_step(state):
    """The last step rank 0 of generation 0 logged."""
    nodes = os.path.join(state, "nodes")
    best = 0
    for n in os.listdir(nodes) if os.path.isdir(nodes) else []:
        path = os.path.join(nodes, n, "logs", "gen0-rank0.log")
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                for line in f:
                    m = STEP_LINE.search(line)
                    if m:
                        best = max(best, int(m.group(1)))
    return best


def endure_stop(out, name):
    """Rank 1 SIGSTOPped once rank 0 logged step KILL_STEP - 1."""
    spec, state = endure_spec(out, name, STEPS, True)
    with open(os.path.join(out, name + ".out"), "w") as log:
        p = subprocess.Popen([ENDURE, "run", spec, "--quiet"], stdout=log,
                             stderr=subprocess.STDOUT)
        pid = None
        while p.poll() is None and (pid is None or rank0_step(state) < KILL_STEP - 1):
            pid = pid or rank_pid(state, 1)
            time.sleep(0.01)
        if pid is not None:
            os.kill(pid, signal.SIGSTOP)
        p.wait(timeout=1800)
    inc = endure_report(state)["incidents"][0]
    return inc["detected_after_s"], inc["recovered_after_s"] - inc["detected_after_s"]


# ---- torchrun 2.x and ft_launcher ----

def launcher(out, name, key, steps):
    if key == "inprocess":
        spawn = [sys.executable, os.path.join(PEERS, "spawn.py"), "ranks", "2", str(free_port()),
                 "--", sys.executable]
        return Launcher(out, name, spawn, steps, script=os.path.join(PEERS, "inprocess_train_gpt.py"),
                        spawner=True)
    if key == "torchft":
        spawn = [sys.executable, os.path.join(PEERS, "spawn.py"), "torchft", "2",
                 str(free_port()), "--"]
        return Launcher(out, name, spawn, steps, script=os.path.join(PEERS, "torchft_train_gpt.py"),
                        spawner=True, rank_key="REPLICA_GROUP_ID")
    return Launcher(out, name, [os.path.join(VENV_BIN, key)], steps, LAUNCHER_CKPT_EVERY)


# How each peer goes on after a kill.
PEER_ROUTE = {
    "torchrun": "restart of every worker",
    "ft_launcher": "restart of every worker",
    "inprocess": "in process, without the killed rank",
    "torchft": "the survivor alone; the restarted replica heals",
}


def launcher_kill(out, name, key):
    run = launcher(out, name, key, STEPS)
    run.wait_for_step(KILL_STEP - 1)
    step = run.last_step()
    killed = run.signal_rank1(signal.SIGKILL)
    if killed is None:
        run.stop()
        run.wait()
        raise SystemExit(f"python_recovery_bench: {name}: no worker to kill; see {run.log.name}")
    # torchrun 2.x's restarted workers sometimes hang in gloo's rendezvous
    # (connectFullMesh) until its timeout: a bounded wait, and said.
    run.wait(limit_s=KILL_LIMIT_S)
    recover, lost, world = run.recovered_after(killed, step)
    finished = run.last_step() == STEPS
    return recover, lost, PEER_ROUTE[key] + (
        "" if finished else f"; did not finish within {KILL_LIMIT_S:.0f} s (see {run.log.name})"), \
        world


def launcher_stop(out, name, key, limit_s):
    run = launcher(out, name, key, STEPS)
    run.wait_for_step(KILL_STEP - 1)
    stopped = run.signal_rank1(signal.SIGSTOP)
    step = run.last_step()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and run.p.poll() is None and \
            not any(t > stopped and s <= step + 1 for t, s in run.steps):
        time.sleep(0.05)
    run.stop()
    run.wait()
    recover, _, world = run.recovered_after(stopped, step)
    return recover, world


# ---- the benchmark ----

SYSTEMS = [
    ("(a) Endure, in process, warm standby", "endure-inproc"),
    ("(b) Endure, full restart, warm standbys", "endure-full"),
    ("(c) torchrun 2.x, own checkpoints every 20", "torchrun"),
    ("(d) resiliency-ext ft_launcher, the same", "ft_launcher"),
    ("(e) resiliency-ext in-process wrapper", "inprocess"),
    ("(f) torchft 0.2, lighthouse + 2 replica groups", "torchft"),
]


def kill_once(out, key, i):
    if key == "endure-inproc":
        return endure_kill(out, f"kill-inproc{i}", True)
    if key == "endure-full":
        return endure_kill(out, f"kill-full{i}", False)
    return launcher_kill(out, f"kill-{key}{i}", key)


def kills(out, rounds):
    import torch
    print(f"== SIGKILL of rank 1 at step {KILL_STEP} of {STEPS}: train_gpt.py, 2 ranks, gloo, "
          f"torch {torch.__version__}; {rounds} rounds interleaved, median (range)")
    print(f"{'system':44} {'kill to productive, s':>24} {'lost':>5} {'world':>6}  route")
    results = {key: [] for _, key in SYSTEMS}
    for i in range(rounds):
        for _, key in SYSTEMS:
            results[key].append(kill_once(out, key, i))
    for title, key in SYSTEMS:
        rows = results[key]
        notes = sorted(set(r[2] for r in rows))
        recovered = [r for r in rows if r[0] == r[0]]
        lost = median([r[1] for r in recovered])
        worlds = sorted(set(r[3] for r in recovered))
        print(f"{title:44} {median_range([r[0] for r in rows]):>24} "
              f"{'-' if lost != lost else str(int(lost)):>5} "
              f"{'/'.join(map(str, worlds)) or '-':>6}  {' | '.join(notes)}")
    inproc = median([r[0] for r in results["endure-inproc"]])
    torchrun = median([r[0] for r in results["torchrun"]])
    wrapper = median([r[0] for r in results["inprocess"]])
    clean = endure_report(endure_run_clean(out))
    step_s = clean["ledger_s"]["productive"] / clean["steps"]
    print(f"(a): {inproc:.3f} s against one step + 0.3 s = {step_s + 0.3:.3f} s "
          f"({'met' if inproc <= step_s + 0.3 else 'missed'}); {torchrun / inproc:.1f}x faster "
          f"than torchrun (target >= 10x); {wrapper / inproc:.2f}x the in-process wrapper's "
          f"{wrapper:.3f} s (target > 1)")
    return step_s


def endure_run_clean(out):
    spec, state = endure_spec(out, "clean", STEPS, True)
    with open(os.path.join(out, "clean.out"), "w") as log:
        subprocess.run([ENDURE, "run", spec, "--quiet"], stdout=log, stderr=subprocess.STDOUT,
                       timeout=1800, check=True)
    return state


def stops(out, limit_s):
    print()
    print(f"== SIGSTOP of rank 1 at step {KILL_STEP} (one trial each; a launcher's job is "
          f"watched {limit_s:.0f} s)")
    detected, productive = endure_stop(out, "stop-endure")
    print(f"{'Endure (hang: stacks, restart from T0)':44} detected after {detected:.3f} s, "
          f"productive {productive:.3f} s later (target <= 3 s: "
          f"{'met' if productive <= 3.0 else 'missed'})")
    for title, key in SYSTEMS[2:]:
        recover, world = launcher_stop(out, f"stop-{key}", key, limit_s)
        said = f"productive after {recover:.3f} s (world {world})" if recover == recover else \
            f"no step within {limit_s:.0f} s"
        print(f"{title:44} {said}")


def ettr(out, seconds):
    clean = endure_report(os.path.join(out, "clean")) if os.path.exists(
        os.path.join(out, "clean", "report.json")) else endure_report(endure_run_clean(out))
    step_s = clean["ledger_s"]["productive"] / clean["steps"]
    steps = max(100, int(seconds / step_s))
    print()
    print(f"== ETTR under a Poisson schedule of kills, MTBF 30 s, seed 1, about {seconds:.0f} s "
          f"of training ({steps} steps); the same kill times for every system")
    print(f"{'system':44} {'wall_s':>8} {'kills':>6} {'ETTR':>6}")
    schedule = (f'[faults_schedule]\nmtbf = "30s"\nseed = 1\nkind = "kill"\n'
                f'horizon = "{int(seconds)}s"\n')
    kill_times = None
    for title, key, in_process in [(SYSTEMS[0][0], "inproc", True),
                                   (SYSTEMS[1][0], "full", False)]:
        spec, state = endure_spec(out, f"ettr-{key}", steps, in_process, schedule)
        with open(os.path.join(out, f"ettr-{key}.out"), "w") as log:
            subprocess.run([ENDURE, "run", spec, "--quiet"], stdout=log,
                           stderr=subprocess.STDOUT, timeout=7200)
        r = endure_report(state)
        print(f"{title:44} {r['wall_s']:8.1f} {len(r['incidents']):6d} {r['ettr']:6.3f}")
        if kill_times is None:
            # The schedule's kills as they fell (seconds after the job's
            # start): the launchers' jobs get theirs at the same times.
            kill_times = sorted(i["injected_at_s"] for i in r["incidents"]
                                if i.get("injected_at_s") is not None)
    for title, key in SYSTEMS[2:]:
        run = launcher(out, f"ettr-{key}", key, steps)
        killed = run.kills_at(kill_times, random.Random(1))
        code = run.wait(limit_s=3 * seconds + 600)
        note = "" if run.last_step() == steps else \
            f"  (ended at step {run.last_step()} of {steps}, exit {code}: see {run.log.name})"
        print(f"{title:44} {run.end - run.start:8.1f} {killed:6d} {run.ettr():6.3f}{note}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/endure_python_recovery_bench"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 180
    parts = os.environ.get("BENCH_PY_PARTS", "kill,stop,ettr").split(",")
    limit_s = float(os.environ.get("BENCH_PY_STOP_LIMIT", "60"))
    for tool in ("torchrun", "ft_launcher", "torchft_lighthouse"):
        if not os.path.exists(os.path.join(VENV_BIN, tool)):
            print(f"python_recovery_bench: skipped: no {tool} beside {sys.executable}; "
                  "run it with the python of scripts/torch-venv")
            return
    os.makedirs(out, exist_ok=True)
    if "kill" in parts:
        kills(out, rounds)
    if "stop" in parts:
        stops(out, limit_s)
    if "ettr" in parts:
        ettr(out, seconds)


if __name__ == "__main__":
    main()
