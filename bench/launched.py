"""examples/python/train_gpt.py under a torchrun-style launcher (torchrun,
NVIDIA resiliency-ext's ft_launcher), for the benchmarks that compare Endure
with them: rank 0's step lines with the time they were read, the workers to
kill or stop, and the same ETTR count as Endure's ledger."""

import os
import re
import shutil
import signal
import statistics
import subprocess
import threading
import time

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(SOURCE, "examples", "python", "train_gpt.py")
PYTHONPATH = os.path.join(SOURCE, "build", "python")
# Rank 0's step lines (torchrun's --tee prefixes them with its role and rank).
STEP_LINE = re.compile(r"^(?:\[default0\]:)?step\s+(\d+)/\d+ loss")
# The world size an adapted script logs with its steps (bench/peers).
WORLD = re.compile(r" world (\d+)\s*$")


def median(values):
    values = [v for v in values if v == v]  # NaN: not measured
    return statistics.median(values) if values else float("nan")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_tree():
    """Every process's parent and command line, from /proc."""
    parent, cmdline = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline[int(entry)] = f.read()
        except OSError:
            continue
        parent[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return parent, cmdline


def ancestors(parent, p, pid):
    """`p`'s ancestors in `parent` up to `pid` (included, when it is one)
    or the end of the chain."""
    q = parent.get(p)
    while q is not None and q != pid and q > 1:
        yield q
        q = parent.get(q)
    yield q


def descendants(pid):
    parent, _ = process_tree()
    return [p for p in parent if pid in ancestors(parent, p, pid)]


def workers(pid, script=TRAINER):
    """The training processes under a launcher: its descendants (started
    from any of its threads) that run `script` (or were spawned by
    multiprocessing), not its own helpers, nor the processes the workers
    start themselves (resiliency-ext's in-process monitor)."""
    parent, cmdline = process_tree()
    name = os.path.basename(script).encode()
    found = set()
    for p, cmd in cmdline.items():
        if pid not in ancestors(parent, p, pid):
            continue
        argv = [os.path.basename(a) for a in cmd.split(b"\0")]
        launcher = any(a in (b"torchrun", b"ft_launcher", b"torch.distributed.run")
                       for a in argv[:3])
        if not launcher and (name in argv or b"spawn_main" in cmd):
            found.add(p)
    return [p for p in found if not any(q in found for q in ancestors(parent, p, pid))]


def rank_of(pid, key):
    """The value of `key` (RANK, REPLICA_GROUP_ID) in a process's
    environment as it started; None when unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                k, _, v = item.partition(b"=")
                if k == key.encode():
                    return v.decode()
    except OSError:
        pass
    return None


class Launcher:
    """train_gpt.py with 2 workers under `launcher` (its argv up to the
    script: torchrun's flags are added), with its own disk checkpoints every
    `ckpt_every` steps. `script` replaces train_gpt.py (an adapted copy);
    with `spawner`, `launcher` is the whole argv up to the script (a
    bench/peers/spawn.py command). Rank 1 is the worker whose environment
    says `rank_key` = 1."""

    def __init__(self, out, name, launcher, steps, ckpt_every=20, script=TRAINER,
                 spawner=False, rank_key="RANK"):
        ckpt = os.path.join(out, name + "-ckpt")
        shutil.rmtree(ckpt, ignore_errors=True)
        env = dict(os.environ, PYTHONPATH=PYTHONPATH, OMP_NUM_THREADS="1")
        for k in [k for k in env if k.startswith("ENDURE_")]:
            del env[k]
        self.script = script
        self.rank_key = rank_key
        self.steps = []  # (time, step)
        self.worlds = []  # the world size each step line gives (2 where it says none)
        self.start = time.monotonic()
        self.log = open(os.path.join(out, name + ".out"), "w")
        flags = [] if spawner else ["--nproc_per_node", "2", "--max_restarts", "1000",
                                    "--master_addr", "127.0.0.1", "--master_port",
                                    str(free_port())]
        self.p = subprocess.Popen(
            launcher + flags + [script, "--steps", str(steps), "--log-every", "1",
                                "--eval-batches", "0", "--ckpt-dir", ckpt, "--ckpt-every",
                                str(ckpt_every)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.log.write(line)
            m = STEP_LINE.search(line)
            if m:
                self.steps.append((time.monotonic(), int(m.group(1))))
                w = WORLD.search(line)
                self.worlds.append(int(w.group(1)) if w else 2)

    def wait(self, limit_s=3600):
        """Its exit code; past `limit_s` it is killed (a negative code)."""
        try:
            self.p.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            self.stop()
            self.p.wait()
        self.stop()  # what it left behind (a helper that waits for other agents)
        self.reader.join(timeout=30)
        self.end = time.monotonic()
        self.log.close()
        return self.p.returncode

    def stop(self):
        """Kills the launcher's session: it, its workers and its helpers
        (resiliency-ext's rank monitors hold sockets a later launcher waits on)."""
        # torchrun 2.x starts each worker in a session of its own; the
        # workers' own helpers may start theirs.
        tree = descendants(self.p.pid)
        for sig in (signal.SIGCONT, signal.SIGKILL):
            for group in [self.p.pid] + tree:
                try:
                    os.killpg(group, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            for p in tree:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass

    def last_step(self):
        return self.steps[-1][1] if self.steps else 0

    def wait_for_step(self, step):
        while self.last_step() < step and self.p.poll() is None:
            time.sleep(0.002)

    def signal_rank1(self, sig):
        """Sends `sig` to the worker of rank 1; the time, or None without one."""
        pids = [p for p in workers(self.p.pid, self.script) if rank_of(p, self.rank_key) == "1"]
        if not pids:
            return None
        os.kill(pids[0], sig)
        return time.monotonic()

    def kill_one(self, rng):
        pids = sorted(workers(self.p.pid, self.script))
        if not pids:
            return None
        os.kill(rng.choice(pids), signal.SIGKILL)
        return time.monotonic()

    def recovered_after(self, at, step_at):
        """Seconds from `at` (rank 0 had logged step `step_at`) to the first
        step after it that counts: a restarted job's first step (a step
        number not above the one reached), or, where the survivors kept
        their state (an in-process restart), the next step; the steps lost;
        and the world size of that step."""
        for (t, step), world in zip(self.steps, self.worlds):
            if t > at and step <= step_at + 1:
                return t - at, max(0, step_at - (step - 1)), world
        return float("nan"), 0, 0

    def ettr(self):
        """Productive time / wall, as Endure's ledger counts it: the time of
        each step that survives into the final model (its last computation),
        the first step of each attempt at the median step time (its line
        also covers the restart)."""
        last, prev = {}, None
        for t, step in self.steps:
            last[step] = t - prev[0] if prev and step == prev[1] + 1 else None
            prev = (t, step)
        med = median([d for d in last.values() if d is not None])
        return sum(d if d is not None else med for d in last.values()) / (self.end - self.start)

    def poisson_kills(self, rng, mtbf_s, horizon_s):
        """Kills a random worker at a seeded Poisson schedule's times until
        `horizon_s` after the start; returns how many."""
        times, t = [], 0.0
        while True:
            t += rng.expovariate(1.0 / mtbf_s)
            if t >= horizon_s:
                return self.kills_at(times, rng)
            times.append(t)

    def kills_at(self, times, rng):
        """Kills a random worker at each of `times` (seconds after the
        start) while it runs; returns how many."""
        killed = 0
        for t in times:
            while time.monotonic() < self.start + t and self.p.poll() is None:
                time.sleep(0.01)
            if self.p.poll() is not None:
                return killed
            killed += self.kill_one(rng) is not None
        return killed
