"""The Python reference trainer (examples/python/train_gpt.py) under
`endure run`, real processes on this machine: a killed rank, a hang, a NaN
loss and a lost node are each recovered, the incidents name their causes,
the hang shows the script's Python frames, and the final parameters are bit
for bit those of a run without faults."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

ENDURE = os.environ.get("ENDURE_BIN", "build/bin/endure")
SOURCE = os.environ.get("ENDURE_SOURCE_DIR", os.getcwd())
sys.path.insert(0, os.path.join(SOURCE, "tests"))
from held_rank import rank_pid  # noqa: E402  (tests/held_rank.py)
TRAINER = os.path.join(SOURCE, "examples", "python", "train_gpt.py")
# A smaller model than the demo's, so that the suite stays fast.
ARGS = ["--steps", "30", "--layers", "2", "--d-model", "64", "--context", "64",
        "--global-batch", "16", "--micro-batch", "8", "--log-every", "5"]


def spec(state_dir, faults="", checkpoint="every_steps = 1\npersist_every_steps = 5\n"):
    command = json.dumps([sys.executable, TRAINER] + ARGS)
    return textwrap.dedent(f"""\
        [job]
        name = "py"
        command = {command}
        nodes = 2
        ranks_per_node = 1
        state_dir = "{state_dir}"
        env = {{ PYTHONPATH = "{os.environ.get('PYTHONPATH', '')}" }}
        [checkpoint]
        """) + checkpoint + textwrap.dedent("""\
        [detection]
        hang_timeout_floor = "2s"
        startup_timeout = "60s"
        [recovery]
        max_restarts = 10
        backoff_initial = "0s"
        repair_delay = "1s"
        """) + faults


def fault(fault_id, kind, rank, step):
    """One [[faults]] entry of a job spec."""
    return f'[[faults]]\nid = "{fault_id}"\nkind = "{kind}"\nrank = {rank}\nstep = {step}\n'


def read(path):
    with open(path) as f:
        return f.read()


def run(directory, name, text):
    path = os.path.join(directory, name + ".toml")
    with open(path, "w") as f:
        f.write(text)
    p = subprocess.run([ENDURE, "run", path, "--quiet"], capture_output=True, text=True,
                       timeout=600)
    report_path = os.path.join(directory, name, "report.json")
    report = {}
    if os.path.exists(report_path):
        with open(report_path) as f:
            report = json.load(f)
    return p, report


class PythonTrainerUnderEndureRun(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="endure-pyrun-")
        p, report = run(cls.dir, "reference", spec(os.path.join(cls.dir, "reference")))
        cls.reference = report.get("param_fingerprint", "")
        cls.reference_output = p.stdout + p.stderr

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_reference_run_reports_steps_and_ettr(self):
        self.assertEqual(len(self.reference), 16, self.reference_output)

    def test_kill_hang_nan_and_lost_node_recover_bit_exact(self):
        faults = (fault("kill", "kill", rank=1, step=6) + fault("hang", "hang", rank=0, step=12) +
                  fault("nan", "nan", rank=1, step=18) +
                  fault("agent", "kill-agent", rank=1, step=24))
        p, report = run(self.dir, "faults", spec(os.path.join(self.dir, "faults"), faults))
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertEqual(report["exit_code"], 0)
        self.assertEqual(report["steps"], 30)
        incidents = report["incidents"]
        self.assertEqual([i["cause"] for i in incidents],
                         ["signal 9 SIGKILL", "hang", "loss_nan", "node_lost"],
                         json.dumps(incidents, indent=1))
        kill, hang, nan, lost = incidents
        self.assertEqual(kill["rank"], 1)
        # Every-step checkpoints in T0: rank 1 dies as step 6 begins, with
        # step 5 done everywhere; rank 0's snapshot of step 5 may still be
        # on its way into T0 then on a busy machine (CI saw "step 5
        # incomplete: no verified copy of shard 0"), and step 4 is restored.
        self.assertIn(kill["restored_step"], (4, 5), kill)
        self.assertEqual(kill["steps_lost"], kill["failed_at_step"] - kill["restored_step"], kill)
        self.assertEqual(hang["rank"], 0)
        stacks = "\n".join(s if isinstance(s, str) else json.dumps(s) for s in hang["stacks"])
        self.assertIn("train_gpt.py", stacks)
        self.assertIn("in main", stacks)
        self.assertLess(nan["restored_step"], 18)
        self.assertGreater(report["ettr"], 0.0)
        ledger = sum(report["ledger_s"].values())
        self.assertAlmostEqual(ledger, report["wall_s"], delta=0.01 * report["wall_s"])
        self.assertEqual(report["param_fingerprint"], self.reference, out)

    def test_a_stopped_rank_is_a_hang_with_the_python_frames_of_the_ranks_that_answer(self):
        # Rank 1 is stopped from outside (SIGSTOP, as a wedged interpreter)
        # once rank 0 has logged step 5 (of 30): it cannot dump its own stacks.
        # Rank 0, waiting for it in the allreduce, answers with faulthandler;
        # rank 1 is read from outside within the stack deadline (py-spy
        # where it is installed beside the interpreter or on PATH: Python
        # frames; gdb otherwise), and the stop does not wait for it.
        state = os.path.join(self.dir, "stopped")
        path = os.path.join(self.dir, "stopped.toml")
        with open(path, "w") as f:
            f.write(spec(state))
        p = subprocess.Popen([ENDURE, "run", path, "--quiet"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        try:
            pid = self._rank_after_step(state, rank=1, step=5, job=p)
            os.kill(pid, signal.SIGSTOP)
            out, _ = p.communicate(timeout=600)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        with open(os.path.join(state, "report.json")) as f:
            report = json.load(f)
        self.assertEqual(p.returncode, 0, out)
        self.assertEqual(report["steps"], 30)
        incidents = report["incidents"]
        self.assertEqual([i["cause"] for i in incidents], ["hang"], json.dumps(incidents, indent=1))
        hang = incidents[0]
        stacks = {s.split(":", 1)[0]: s for s in hang["stacks"]}
        self.assertEqual(sorted(stacks), ["rank 0", "rank 1"], hang["stacks"])
        self.assertIn("Python stacks (faulthandler):", stacks["rank 0"])
        self.assertIn("train_gpt.py", stacks["rank 0"])
        self.assertIn("The process is stopped (SIGSTOP)", stacks["rank 1"])
        trainer_bin = os.path.dirname(sys.executable)
        if os.path.exists(os.path.join(trainer_bin, "py-spy")) or shutil.which("py-spy"):
            self.assertIn("Python stacks (py-spy, read from outside):", stacks["rank 1"])
            self.assertIn("train_gpt.py", stacks["rank 1"])
        # Capture (2 s deadline) and stop (the stopped rank is continued to
        # take its SIGTERM, not SIGKILLed after the 2 s grace), with room
        # for a busy machine.
        self.assertLess(hang["teardown_s"], 2.0 + 2.0, hang)
        self.assertEqual(report["param_fingerprint"], self.reference, out)

    @staticmethod
    def _rank_after_step(state, rank, step, job):
        """The pid of `rank` of generation 0 once rank 0 has logged `step`."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and job.poll() is None:
            logs = [os.path.join(state, "nodes", n, "logs", "gen0-rank0.log")
                    for n in (os.listdir(os.path.join(state, "nodes"))
                              if os.path.isdir(os.path.join(state, "nodes")) else [])]
            logged = any(os.path.exists(l) and f"step {step:6d}/" in read(l) for l in logs)
            if logged:
                pid = rank_pid(state, rank)
                if pid is not None:
                    return pid
            time.sleep(0.05)
        raise AssertionError(f"rank 0 never logged step {step}, or rank {rank} was not found")

    def _in_process_kill(self, name, recovery=""):
        """Rank 1 SIGKILLed as step 12 (of 30) begins, with [recovery]
        in_process = true: (report, output, node logs and agent logs by node)."""
        faults = fault("kill", "kill", rank=1, step=12)
        text = spec(os.path.join(self.dir, name), faults).replace(
            "[recovery]\n", "[recovery]\nin_process = true\n" + recovery)
        p, report = run(self.dir, name, text)
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertEqual(report["steps"], 30, out)
        nodes = os.path.join(self.dir, name, "nodes")
        logs = {n: {f: read(os.path.join(nodes, n, "logs", f))
                    for f in os.listdir(os.path.join(nodes, n, "logs")) if f.endswith(".log")}
                for n in os.listdir(nodes)}
        agents = {n: read(os.path.join(nodes, n, "agent.log")) for n in os.listdir(nodes)}
        incidents = report["incidents"]
        self.assertEqual([i["cause"] for i in incidents], ["signal 9 SIGKILL"],
                         json.dumps(incidents, indent=1))
        kill = incidents[0]
        self.assertEqual(kill["route"], "in_process", kill)
        # At most the step in flight is lost: the survivor kept its state.
        self.assertLessEqual(kill["failed_at_step"] - kill["restored_step"], 1, kill)
        self.assertEqual(kill["steps_lost"], kill["failed_at_step"] - kill["restored_step"])
        # Rank 0's process served both generations: it rejoined in place,
        # and no generation-1 worker of rank 0 was started.
        survivor = [n for n in logs if "gen0-rank0.log" in logs[n]]
        self.assertEqual(len(survivor), 1, logs.keys())
        self.assertNotIn("gen1-rank0.log", logs[survivor[0]])
        self.assertIn("rejoined generation 1 at step", logs[survivor[0]]["gen0-rank0.log"])
        self.assertEqual(report["param_fingerprint"], self.reference, out)
        return report, out, logs, agents

    def test_a_killed_rank_is_replaced_in_process_and_its_peer_keeps_its_state(self):
        self._in_process_kill("inprocess")

    def test_a_warm_standby_interpreter_takes_the_killed_rank(self):
        # train_gpt.py waits in endure.await_assignment() with torch loaded.
        _, _, _, agents = self._in_process_kill("standby", "warm_standby = true\n")
        self.assertTrue(any("rank 1 starts in a warm standby" in a for a in agents.values()),
                        agents)

    def test_a_lost_node_moves_to_a_warm_spare_and_the_peer_keeps_its_state(self):
        faults = fault("agent", "kill-agent", rank=1, step=12)
        text = spec(os.path.join(self.dir, "spare"), faults).replace(
            "ranks_per_node = 1\n", "ranks_per_node = 1\nspares = 1\n").replace(
            "[recovery]\n", "[recovery]\nwarm_standby = true\n")
        p, report = run(self.dir, "spare", text)
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertEqual(report["steps"], 30, out)
        incidents = report["incidents"]
        self.assertEqual([(i["cause"], i["route"]) for i in incidents], [("node_lost", "spare")],
                         json.dumps(incidents, indent=1))
        lost = incidents[0]
        self.assertLessEqual(lost["failed_at_step"] - lost["restored_step"], 1, lost)
        # The spare (whichever node registered last) kept a standby
        # interpreter of the job's program, with the job's environment, and
        # rank 1 started in it.
        nodes = os.path.join(self.dir, "spare", "nodes")
        agents = [read(os.path.join(nodes, n, "agent.log")) for n in os.listdir(nodes)]
        self.assertTrue(any("rank 1 starts in a warm standby" in a for a in agents), agents)
        self.assertEqual(report["param_fingerprint"], self.reference, out)

    def test_durable_only_checkpoints_recover_bit_exact(self):
        # memory = false: the trainer commits to the durable directory itself.
        faults = fault("kill", "kill", rank=0, step=14)
        # A full restart (not in process, where rank 1 would keep step 13),
        # so that the restore reads the durable directory.
        p, report = run(self.dir, "durable", spec(
            os.path.join(self.dir, "durable"), faults,
            checkpoint="every_steps = 5\nmemory = false\n").replace(
                "[recovery]\n", "[recovery]\nin_process = false\n"))
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertEqual([i["cause"] for i in report["incidents"]], ["signal 9 SIGKILL"])
        self.assertEqual(report["incidents"][0]["restored_step"], 10)
        self.assertEqual(report["param_fingerprint"], self.reference, out)


class PythonTrainerShrinksAndGrowsBack(unittest.TestCase):
    def test_a_lost_node_without_a_spare_shrinks_and_grows_back_bit_exact(self):
        # 3 nodes, min_nodes = 2; node 2 dies at step 10. The two others go
        # on in process with 3 micro-batches each instead of 2, and the job
        # grows back when endure run's replacement node registers (after
        # repair_delay, 1 s; the job has 140 steps left, several seconds).
        # With --exact-sum (fixed-point gradient sums) the parameters are
        # those of a run that never shrank, bit for bit.
        directory = tempfile.mkdtemp(prefix="endure-pyshrink-")
        try:
            def job(name, faults=""):
                text = spec(os.path.join(directory, name), faults).replace(
                    "nodes = 2\n", "nodes = 3\nmin_nodes = 2\n")
                text = text.replace(json.dumps(ARGS)[1:-1], json.dumps(
                    ["--steps", "150", "--layers", "2", "--d-model", "64", "--context", "64",
                     "--global-batch", "24", "--micro-batch", "4", "--log-every", "10",
                     "--exact-sum"])[1:-1])
                self.assertIn("--exact-sum", text)
                p, report = run(directory, name, text)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                self.assertEqual(report["steps"], 150)
                return report
            reference = job("never-shrank")
            report = job("shrinks", fault("agent", "kill-agent", rank=2, step=10))
            incidents = report["incidents"]
            self.assertEqual([(i["cause"], i["route"]) for i in incidents],
                             [("node_lost", "shrink")], json.dumps(incidents, indent=1))
            self.assertLessEqual(incidents[0]["failed_at_step"] - incidents[0]["restored_step"],
                                 1, incidents[0])
            resizes = report["resizes"]
            self.assertEqual([(r["from_nodes"], r["to_nodes"]) for r in resizes], [(2, 3)],
                             resizes)
            self.assertEqual(report["param_fingerprint"], reference["param_fingerprint"])
        finally:
            shutil.rmtree(directory, ignore_errors=True)


FSDP_TRAINER = os.path.join(SOURCE, "examples", "python", "train_fsdp.py")


def _has_fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401  (torch >= 2.6)
        return True
    except Exception:  # torch 1.x has no fully_shard
        return False


@unittest.skipUnless(_has_fully_shard(), "FSDP's fully_shard needs torch >= 2.6 (make test-torch)")
class ShardedTrainerRejoinsInPlace(unittest.TestCase):
    """examples/python/train_fsdp.py: the reference GPT sharded by fully_shard,
    each rank holding its part of the parameters and optimizer state."""

    def _job(self, directory, name, faults="", nodes=2, args=None):
        text = spec(os.path.join(directory, name), faults).replace(
            json.dumps(TRAINER), json.dumps(FSDP_TRAINER)).replace(
            "[recovery]\n", "[recovery]\nin_process = true\nwarm_standby = true\n")
        if args is not None:
            text = text.replace(json.dumps(ARGS)[1:-1], json.dumps(args)[1:-1])
        if nodes != 2:
            text = text.replace("nodes = 2\n", f"nodes = {nodes}\nmin_nodes = {nodes - 1}\n")
        self.assertIn("train_fsdp.py", text)
        p, report = run(directory, name, text)
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        return report, out

    def test_a_killed_rank_is_replaced_in_process_from_each_nodes_memory_bit_exact(self):
        # Rank 1 is killed as step 12 begins. Rank 0 keeps its process, the
        # state is built anew over generation 1's group, and both ranks
        # restore step 11 from their own node's memory (the replacement
        # reads what the killed rank saved there): no step lost, and the
        # parameters of a run without the kill, bit for bit.
        directory = tempfile.mkdtemp(prefix="endure-pyfsdp-")
        try:
            reference, _ = self._job(directory, "reference")
            report, out = self._job(directory, "kill", fault("kill", "kill", rank=1, step=12))
            self.assertEqual(report["steps"], 30, out)
            incidents = report["incidents"]
            self.assertEqual([(i["cause"], i["route"]) for i in incidents],
                             [("signal 9 SIGKILL", "in_process")], json.dumps(incidents, indent=1))
            self.assertEqual(incidents[0]["failed_at_step"], incidents[0]["restored_step"],
                             incidents[0])
            # The loop said its ranks restore their parts from the tiers: the
            # route and the restore say so, and the generation had a plan.
            self.assertIn("every rank restores its part of the (sharded) state from the tiers",
                          incidents[0]["route_reason"])
            self.assertIn("each rank restores its part of the state (sharded)",
                          incidents[0]["restore"])
            logs = os.path.join(directory, "kill", "nodes")
            survivor = [read(os.path.join(logs, n, "logs", "gen0-rank0.log"))
                        for n in os.listdir(logs)
                        if os.path.exists(os.path.join(logs, n, "logs", "gen0-rank0.log"))]
            self.assertEqual(len(survivor), 1)
            self.assertIn("rejoined generation 1 at step 11 as rank 0 of 2", survivor[0])
            self.assertIn("(step 11 from node memory (each rank its own shard))", survivor[0])
            self.assertTrue(reference["param_fingerprint"])
            self.assertEqual(report["param_fingerprint"], reference["param_fingerprint"], out)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def test_a_lost_node_shrinks_and_grows_back_re_sharding_the_state(self):
        # 3 nodes, min_nodes = 2: node 2's agent dies at step 10. The two
        # others go on in process: the state is re-sharded from 3 ranks'
        # blocks to 2 (from the plan's copies), and again to 3 when the
        # replacement node comes.
        directory = tempfile.mkdtemp(prefix="endure-pyfsdp-shrink-")
        try:
            args = ["--steps", "60", "--layers", "2", "--d-model", "64", "--context", "64",
                    "--global-batch", "24", "--micro-batch", "4", "--log-every", "10"]
            report, out = self._job(directory, "shrinks",
                                    fault("agent", "kill-agent", rank=2, step=10), 3, args)
            self.assertEqual(report["steps"], 60, out)
            incidents = report["incidents"]
            self.assertEqual([(i["cause"], i["route"]) for i in incidents],
                             [("node_lost", "shrink")], json.dumps(incidents, indent=1))
            self.assertEqual([(r["from_nodes"], r["to_nodes"]) for r in report["resizes"]],
                             [(2, 3)], report["resizes"])
            self.assertIn("every rank restored its part of the (sharded) state from the tiers",
                          report["resizes"][0]["reason"])
        finally:
            shutil.rmtree(directory, ignore_errors=True)


# An unmodified torchrun-style DDP script: no endure import, its own process# An unmodified torchrun-style DDP script: no endure import, its own process
# group from the environment, progress only in what rank 0 prints. Rank 1
# hangs in step 15 of the first attempt (as a rank stuck in a collective
# would), so rank 0 stops inside the next allreduce.
DDP_SCRIPT = textwrap.dedent("""\
    import os, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("ENDURE_GENERATION", "0"))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(30):
        if attempt == 0 and rank == 1 and i + 1 == 15:
            while True:
                time.sleep(1)
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.05)
        if rank == 0:
            print(f"step {i + 1}/30 loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    """)


def ddp_spec(name, command, state, detection=""):
    """A 2-node job of an unmodified script whose rank 0 prints "step N/M loss
    L": its progress comes from that pattern."""
    return textwrap.dedent(f"""\
        [job]
        name = "{name}"
        command = {json.dumps(command)}
        nodes = 2
        state_dir = "{state}"
        [detection]
        startup_timeout = "60s"
        progress_pattern = 'step (?P<step>\\d+)/\\d+ loss (?P<loss>\\S+)'
        """) + detection + '[recovery]\nbackoff_initial = "0s"\n'


class UnmodifiedDdpScript(unittest.TestCase):
    def test_progress_pattern_detects_a_hang_with_the_learned_timeout(self):
        directory = tempfile.mkdtemp(prefix="endure-pyddp-")
        try:
            script = os.path.join(directory, "ddp_train.py")
            with open(script, "w") as f:
                f.write(DDP_SCRIPT)
            state = os.path.join(directory, "ddp")
            text = ddp_spec("ddp", [sys.executable, script], state, 'hang_timeout_floor = "2s"\n')
            p, report = run(directory, "ddp", text)
            out = p.stdout + p.stderr
            self.assertEqual(p.returncode, 0, out)
            self.assertEqual(report["steps"], 30, out)
            self.assertGreater(report["ettr"], 0.0)
            self.assertGreater(report["ledger_s"]["productive"], 0.0)
            incidents = report["incidents"]
            self.assertEqual([i["cause"] for i in incidents], ["hang"], out)
            # The learned timeout (2 s floor over ~60 ms steps), not the
            # 60 s start-up timeout.
            self.assertLess(incidents[0]["detected_after_s"], 10.0, incidents[0])
            self.assertEqual(sorted(report["nodes"]), ["node0", "node1"])  # none evicted
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def test_a_script_that_resumes_from_its_own_snapshot_books_only_what_it_redid(self):
        directory = tempfile.mkdtemp(prefix="endure-pyresume-")
        try:
            script = os.path.join(directory, "ddp_resume.py")
            with open(script, "w") as f:
                f.write(RESUMING_DDP_SCRIPT)
            state = os.path.join(directory, "resume")
            text = ddp_spec("resume", [sys.executable, script, os.path.join(directory, "own")], state)
            p, report = run(directory, "resume", text)
            out = p.stdout + p.stderr
            self.assertEqual(p.returncode, 0, out)
            self.assertEqual(report["steps"], 30, out)
            incidents = report["incidents"]
            self.assertEqual(len(incidents), 1, json.dumps(incidents, indent=1))
            kill = incidents[0]
            # Rank 1 died in step 13 of the first attempt; rank 0 had printed
            # step 12. The script resumed from its own snapshot of step 10.
            self.assertEqual(kill["failed_at_step"], 12, kill)
            self.assertEqual(kill["restored_step"], 10, kill)
            self.assertEqual(kill["steps_lost"], 2, kill)
            # A script that does not rejoin is restarted whole, and the
            # incident says why the in-process route was not taken.
            self.assertEqual(kill["route"], "full_restart", kill)
            self.assertIn("cannot rejoin in place", kill["route_reason"], kill)
            # Recompute is steps 11 and 12 (the run's 28 productive steps
            # share its productive time), not the twelve since the start.
            ledger = report["ledger_s"]
            per_step = ledger["productive"] / 28
            self.assertGreater(ledger["recompute"], 0.5 * per_step, ledger)
            self.assertLess(ledger["recompute"], 6 * per_step, ledger)
        finally:
            shutil.rmtree(directory, ignore_errors=True)


# An unmodified DDP script that keeps its own snapshot (every 5 steps, in the
# directory it is given: model, optimizer and step, written to a temporary
# file and renamed) and resumes from it. Rank 1 of the first attempt dies
# in step 13, as a process killed from outside does, once rank 0 printed
# step 12.
RESUMING_DDP_SCRIPT = textwrap.dedent("""\
    import os, signal, sys, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("ENDURE_GENERATION", "0"))
    own = sys.argv[1]
    os.makedirs(own, exist_ok=True)
    path = os.path.join(own, "snapshot.pt")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    if os.path.exists(path):
        saved = torch.load(path)
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        start = saved["step"]
    for i in range(start, 30):
        if attempt == 0 and rank == 1 and i + 1 == 13:
            while not os.path.exists(os.path.join(own, "printed-12")):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.1)
        if rank == 0:
            if (i + 1) % 5 == 0:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                            "step": i + 1}, path + ".tmp")
                os.replace(path + ".tmp", path)
            print(f"step {i + 1}/30 loss {loss.item():.4f}", flush=True)
            if i + 1 == 12:
                open(os.path.join(own, "printed-12"), "w").close()
    dist.destroy_process_group()
    """)


# A program whose progress bar the job's pattern does not match: a hundred
# lines over 22 s, then the lines the pattern is for.
UNMATCHED_SCRIPT = """\
import sys, time
for i in range(250):
    print(f"Epoch 0: {i}/250 [00:00<00:22]", flush=True)
    time.sleep(0.09)
for step in range(1, 4):
    print(f"step {step}/3 loss 2.0", flush=True)
"""


class UnmatchedProgressPattern(unittest.TestCase):
    def test_a_pattern_that_matches_nothing_is_a_warning_in_the_status_and_the_report(self):
        directory = tempfile.mkdtemp(prefix="endure-unmatched-")
        try:
            script = os.path.join(directory, "bar.py")
            with open(script, "w") as f:
                f.write(UNMATCHED_SCRIPT)
            state = os.path.join(directory, "bar")
            path = os.path.join(directory, "bar.toml")
            with open(path, "w") as f:
                f.write(textwrap.dedent(f"""\
                    [job]
                    name = "bar"
                    command = {json.dumps([sys.executable, script])}
                    nodes = 1
                    state_dir = "{state}"
                    [detection]
                    startup_timeout = "120s"
                    progress_pattern = 'step (?P<step>\\d+)/\\d+ loss (?P<loss>\\S+)'
                    """))
            job = subprocess.Popen([ENDURE, "run", path, "--quiet"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
            live = []
            status_path = os.path.join(state, "status.json")
            while job.poll() is None and not live:
                try:
                    with open(status_path) as f:
                        live = json.load(f).get("warnings", [])
                except (OSError, ValueError):
                    pass  # not written yet, or being replaced
                time.sleep(0.2)
            out, _ = job.communicate(timeout=300)
            self.assertEqual(job.returncode, 0, out)
            self.assertEqual(len(live), 1, "the live status warned while the job ran: " + out)
            # At least 100 lines over at least 20 s (NodeMachine's thresholds).
            self.assertRegex(live[0], r"node0: \[detection\] progress_pattern matched none of "
                                      r"the (\d{3}) lines its workers printed over (2\d|1\d\d)\.\ds "
                                      r"\(the last: 'Epoch 0: \d+/250")
            with open(os.path.join(state, "report.json")) as f:
                report = json.load(f)
            self.assertEqual(report["warnings"], live)
            self.assertEqual(report["steps"], 3, out)  # it matched in the end
        finally:
            shutil.rmtree(directory, ignore_errors=True)


class PythonTrainerUnderTorchrun(unittest.TestCase):
    """The reference trainer runs unchanged under Debian's torchrun, and
    resumes bit-exact from its own durable checkpoints."""

    def torchrun(self, ckpt, faults=None):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ)
        for k in [k for k in env if k.startswith("ENDURE_")]:
            del env[k]
        if faults:
            env["ENDURE_FAULTS"] = json.dumps(faults)  # honoured without an agent too
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
             "--redirects", "2", "--tee", "2", "--max_restarts", "0",
             "--master_addr", "127.0.0.1", "--master_port", str(port), TRAINER] + ARGS +
            ["--ckpt-dir", ckpt, "--ckpt-every", "5"],
            capture_output=True, text=True, env=env, timeout=600)

    @staticmethod
    def fingerprint(p):
        prints = [line.split("param_fingerprint=")[1].strip()
                  for line in p.stdout.splitlines() if "param_fingerprint=" in line]
        return prints[0] if len(prints) == 1 else None

    def test_resumes_bit_exact_from_its_checkpoints(self):
        directory = tempfile.mkdtemp(prefix="endure-pytorchrun-")
        try:
            whole = self.torchrun(os.path.join(directory, "whole"))
            self.assertEqual(whole.returncode, 0, whole.stdout + whole.stderr)
            part = os.path.join(directory, "part")
            # Rank 1 is killed in step 13: the job fails after its step-10 checkpoint.
            killed = self.torchrun(part, [{"id": "k", "kind": "kill", "rank": 1, "step": 13}])
            self.assertNotEqual(killed.returncode, 0, killed.stdout)
            resumed = self.torchrun(part)
            self.assertEqual(resumed.returncode, 0, resumed.stdout + resumed.stderr)
            self.assertIn("restored step 10 from", resumed.stdout)
            self.assertIsNotNone(self.fingerprint(whole), whole.stdout)
            self.assertEqual(self.fingerprint(resumed), self.fingerprint(whole))
        finally:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
