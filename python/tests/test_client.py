"""The Python package without a controller: a stand-in agent socket receives
what a Session sends, checkpoints go through a real T0 slot and a real
durable directory, and faults fire in child processes."""

import contextlib
import io
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from unittest import mock

import torch

import endure
import endure.torch


def _has_fully_shard() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        return True
    except Exception:  # torch 1.13 under Python 3.11: a ValueError from its dataclasses
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeAgent:
    """A Unix datagram socket where a Session sends its reports."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "agent.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(5)

    def next(self, type_):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            m = json.loads(self.sock.recv(65536))
            if m["type"] == type_:
                return m
        raise AssertionError(f"no {type_} datagram")

    def close(self):
        self.sock.close()


def make_state(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    progress = {"epoch": 0, "seen": [], "rng": torch.get_rng_state()}
    return model, opt, sched, progress


def train(model, opt, sched, progress, steps, start=0):
    for step in range(start, steps):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(4, 8, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        progress["epoch"] = step // 3
        progress["seen"].append(step)


def params(model):
    return [p.detach().clone() for p in model.parameters()]


class CleanEnvironment(unittest.TestCase):
    """Each test in a temporary directory, without the ENDURE_* variables of
    whatever runs the suite; the environment is restored afterwards."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="endure-py-")
        self.env = mock.patch.dict(os.environ, {}, clear=False)
        self.env.start()
        for k in list(os.environ):
            if k.startswith("ENDURE_") or k in ("RANK", "WORLD_SIZE"):
                del os.environ[k]

    def tearDown(self):
        self.env.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class SessionTest(CleanEnvironment):
    def test_inactive_without_agent_is_a_no_op(self):
        s = endure.Session.from_env()
        self.assertFalse(s.active)
        self.assertIsNone(s.restore_plan)
        s.ready(0)
        s.begin_step(0)
        self.assertEqual(s.end_step(0, loss=2.5), 2.5)
        self.assertIsNone(s.end_step(1))

    def test_malformed_variable_names_it(self):
        os.environ["ENDURE_GENERATION"] = "seven"
        with self.assertRaisesRegex(ValueError, "ENDURE_GENERATION='seven'"):
            endure.Session.from_env()

    def test_reports_steps_and_fires_nan(self):
        agent = FakeAgent(self.dir)
        os.environ.update({
            "ENDURE_AGENT_SOCKET": agent.path, "ENDURE_TOKEN": "tok", "RANK": "1",
            "ENDURE_GENERATION": "3",
            "ENDURE_FAULTS": json.dumps([{"id": "n", "kind": "nan", "rank": 1, "step": 2}])})
        s = endure.Session.from_env()
        self.assertTrue(s.active)
        s.ready(0, restore_s=0.25)
        ready = agent.next("ready")
        self.assertEqual((ready["rank"], ready["generation"], ready["token"]), (1, 3, "tok"))
        self.assertEqual(ready["restore_s"], 0.25)
        s.begin_step(0)
        self.assertEqual(s.end_step(0, loss=torch.tensor(2.0), tokens=4096), 2.0)
        step = agent.next("step")
        self.assertEqual((step["step"], step["loss"], step["tokens"]), (1, 2.0, 4096))
        self.assertGreaterEqual(step["compute_s"], 0.0)
        s.begin_step(1)
        self.assertTrue(math.isnan(s.end_step(1, loss=1.9)))
        self.assertEqual(agent.next("fault")["kind"], "nan")
        self.assertEqual(agent.next("step")["loss"], "nan")
        s.begin_step(2)
        self.assertIsNone(s.end_step(2))  # no loss: progress, nothing to judge
        self.assertIsNone(agent.next("step")["loss"])
        agent.close()

    def test_a_ready_without_a_start_step_says_it_is_unknown(self):
        # A program that resumed a checkpoint of its own (endure.autostep's
        # case): the controller takes the step before its first as restored.
        agent = FakeAgent(self.dir)
        os.environ.update({"ENDURE_AGENT_SOCKET": agent.path, "ENDURE_TOKEN": "tok",
                           "RANK": "0", "ENDURE_GENERATION": "1"})
        s = endure.Session.from_env()
        s.ready(None)
        ready = agent.next("ready")
        self.assertEqual((ready["start_step"], ready.get("start_step_unknown")), (0, True))
        s.ready(4)
        ready = agent.next("ready")
        self.assertEqual((ready["start_step"], ready.get("start_step_unknown")), (4, None))
        agent.close()

    def test_stack_dump_on_signal_shows_python_frames(self):
        agent = FakeAgent(self.dir)
        stacks = os.path.join(self.dir, "rank-0.stacks")
        os.environ.update({"ENDURE_AGENT_SOCKET": agent.path, "ENDURE_TOKEN": "tok",
                           "ENDURE_STACKS_FILE": stacks})
        script = textwrap.dedent("""
            import os, signal, time, endure
            s = endure.Session.from_env()
            def waiting_for_the_allreduce():
                os.kill(os.getpid(), signal.SIGUSR2)
                time.sleep(0.2)
            waiting_for_the_allreduce()
        """)
        subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
        self.assertEqual(agent.next("stacks")["signal"], int(signal.SIGUSR2))
        with open(stacks) as f:
            text = f.read()
        self.assertIn("waiting_for_the_allreduce", text)
        self.assertIn('File "<string>"', text)
        agent.close()

    def test_kill_fault_kills_the_process(self):
        os.environ["ENDURE_FAULTS"] = json.dumps([{"id": "k", "kind": "kill", "rank": 0,
                                                   "step": 3}])
        script = ("import endure\ns = endure.Session.from_env()\n"
                  "for i in range(5):\n    s.begin_step(i)\n    print(i, flush=True)\n")
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, -signal.SIGKILL)
        self.assertEqual(p.stdout.split(), ["0", "1"])

    def test_log_fault_prints_its_line_and_exits(self):
        line = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"
        os.environ["ENDURE_FAULTS"] = json.dumps([{"id": "l", "kind": "log", "rank": 0,
                                                   "step": 1, "line": line}])
        p = subprocess.run([sys.executable, "-c",
                            "import endure\nendure.Session.from_env().begin_step(0)\n"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn(line, p.stderr)


    def agent_session(self, **env):
        agent = FakeAgent(self.dir)
        os.environ.update({"ENDURE_AGENT_SOCKET": agent.path, "ENDURE_TOKEN": "tok"})
        os.environ.update(env)
        return agent, endure.Session.from_env()

    def test_phase_is_sent_and_restored_by_the_context_manager(self):
        agent, s = self.agent_session()
        self.assertEqual(s.current_phase, "train")
        s.ready(3)
        s.phase("data")  # a plain call enters it for good
        m = agent.next("phase")
        self.assertEqual((m["phase"], m["step"], m["token"]), ("data", 3, "tok"))
        with s.phase("eval"):
            self.assertEqual(s.current_phase, "eval")
            self.assertEqual(agent.next("phase")["phase"], "eval")
        self.assertEqual(s.current_phase, "data")
        self.assertEqual(agent.next("phase")["phase"], "data")
        with self.assertRaisesRegex(ValueError, "not a phase name"):
            s.phase("Eval Loop")
        self.assertEqual(s.current_phase, "data")
        # An exception inside the block still returns to the previous phase.
        with self.assertRaises(RuntimeError):
            with s.phase("eval"):
                raise RuntimeError("boom")
        self.assertEqual(s.current_phase, "data")
        agent.close()

    def test_fingerprints_are_due_every_n_steps_and_checked(self):
        agent, s = self.agent_session(ENDURE_SDC_CHECK_EVERY="3")
        self.assertEqual(s.sdc_check_every, 3)
        self.assertEqual([i for i in range(10) if s.fingerprint_due(i)], [2, 5, 8])
        model = torch.nn.Linear(4, 2)
        fp = endure.fingerprint(model.named_parameters())
        s.report_fingerprint(5, fp)
        m = agent.next("fingerprint")
        self.assertEqual((m["step"], m["fingerprint"]), (6, fp))
        with self.assertRaisesRegex(ValueError, "16 lowercase hex digits"):
            s.report_fingerprint(5, "0123456789ABCDEF")
        agent.close()
        self.assertEqual(endure.Session.disabled().sdc_check_every, 0)

    def test_bitflip_is_due_once_and_flips_the_named_bit(self):
        agent, s = self.agent_session(ENDURE_FAULTS=json.dumps([
            {"id": "b", "kind": "bitflip", "rank": 0, "step": 2, "tensor": 1, "element": 5,
             "bit": 31}]))
        self.assertIsNone(s.bitflip_due(0))
        flip = s.bitflip_due(1)
        self.assertEqual(flip, endure.BitFlip(tensor=1, element=5, bit=31))
        self.assertEqual(agent.next("fault")["kind"], "bitflip")
        self.assertIsNone(s.bitflip_due(1))  # once
        model = torch.nn.Linear(2, 3)  # weight (3x2), bias (3): element 5 of 3 is 2
        with torch.no_grad():
            model.bias.copy_(torch.tensor([1.0, 2.0, 3.0]))
        before = endure.fingerprint(model.named_parameters())
        self.assertEqual(endure.torch.apply_bitflip(model.named_parameters(), flip), "bias")
        self.assertEqual(model.bias.tolist(), [1.0, 2.0, -3.0])  # bit 31: the sign
        self.assertNotEqual(endure.fingerprint(model.named_parameters()), before)
        # The default: bit 30 of element 0 of the first tensor, an exponent bit.
        t = torch.tensor([1.0])
        endure.torch.apply_bitflip([t], endure.BitFlip(0, 0, 30))
        self.assertTrue(math.isinf(t.item()))
        agent.close()

    def test_comm_slow_is_reported_as_communication_time(self):
        agent, s = self.agent_session(ENDURE_FAULTS=json.dumps([
            {"id": "cs", "kind": "comm-slow", "rank": 0, "step": 1, "factor": 3}]))
        s.begin_step(0)
        held = s.before_collective(0)
        self.assertGreaterEqual(held, 0.1)  # (3 - 1) x at least 50 ms
        self.assertLess(held, 2.0)
        self.assertEqual(agent.next("fault")["kind"], "comm-slow")
        s.end_step(0, loss=1.0)
        step = agent.next("step")
        self.assertGreaterEqual(step["comm_s"], 0.1)
        self.assertLess(step["compute_s"], 0.1)
        agent.close()

    def test_comm_fail_exits_with_the_collective_error(self):
        agent = FakeAgent(self.dir)
        os.environ.update({"ENDURE_AGENT_SOCKET": agent.path, "ENDURE_TOKEN": "tok",
                           "ENDURE_FAULTS": json.dumps([{"id": "cf", "kind": "comm-fail",
                                                         "rank": 0, "step": 2}])})
        script = ("import endure\ns = endure.Session.from_env()\n"
                  "for i in range(4):\n    s.before_collective(i)\n    print(i, flush=True)\n")
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stdout.split(), ["0"])
        self.assertIn("endure fault: collective failed: Connection reset by peer (comm-fail)",
                      p.stderr)
        m = agent.next("fault")
        self.assertEqual((m["id"], m["kind"], m["step"]), ("cf", "comm-fail", 2))
        agent.close()


class CheckpointerTest(CleanEnvironment):
    def test_entry_without_state_dict_is_a_type_error_naming_the_key(self):
        s = endure.Session.disabled()
        with self.assertRaisesRegex(TypeError, r"state\['lr'\].*state_dict"):
            endure.torch.Checkpointer(s, {"model": torch.nn.Linear(2, 2), "lr": 0.1})

    def test_unpicklable_value_is_a_type_error_naming_its_path(self):
        s = endure.Session.disabled()
        c = endure.torch.Checkpointer(s, {"extra": {"gen": torch.Generator()}},
                                      directory=self.dir)
        with self.assertRaisesRegex(TypeError, r"state\['extra'\]\['gen'\] is a Generator"):
            c.save(1)

    def test_directory_round_trip_resumes_bit_exact(self):
        ref = make_state()
        train(*ref, steps=6)

        first = make_state()
        train(*first, steps=4)
        s = endure.Session.disabled()
        names = ("model", "optimizer", "scheduler", "progress")
        c = endure.torch.Checkpointer(s, dict(zip(names, first)), directory=self.dir)
        self.assertTrue(c.save(4))

        second = make_state(seed=99)  # different initial values: all must be loaded
        c2 = endure.torch.Checkpointer(s, dict(zip(names, second)), directory=self.dir)
        self.assertEqual(c2.restore(), 4)
        self.assertEqual(second[3]["seen"], [0, 1, 2, 3])
        self.assertTrue(torch.equal(second[3]["rng"], first[3]["rng"]))
        train(*second, steps=6, start=4)
        for a, b in zip(params(ref[0]), params(second[0])):
            self.assertTrue(torch.equal(a, b))
        self.assertEqual(ref[2].state_dict(), second[2].state_dict())

    def test_corrupt_newest_step_falls_back_to_the_previous_one(self):
        state = make_state()
        s = endure.Session.disabled()
        c = endure.torch.Checkpointer(s, {"model": state[0]}, directory=self.dir, keep=0)
        c.save(1)
        train(*state, steps=1)
        c.save(2)
        shard = os.path.join(self.dir, "step-00000002", "shard-00000.bin")
        with open(shard, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0xFF]))
        fresh = make_state(seed=5)
        c2 = endure.torch.Checkpointer(s, {"model": fresh[0]}, directory=self.dir)
        self.assertEqual(c2.restore(), 1)

    def test_memory_snapshot_restored_through_a_restore_plan(self):
        agent = FakeAgent(self.dir)
        t0 = os.path.join(self.dir, "t0")
        os.makedirs(t0)
        os.environ.update({"ENDURE_AGENT_SOCKET": agent.path, "ENDURE_TOKEN": "tok",
                           "ENDURE_T0_DIR": t0})
        state = make_state()
        train(*state, steps=3)
        s = endure.Session.from_env()
        self.assertTrue(s.memory_checkpoints)
        names = ("model", "optimizer", "scheduler", "progress")
        c = endure.torch.Checkpointer(s, dict(zip(names, state)))
        self.assertTrue(c.save(3))
        snap = agent.next("snapshot")
        self.assertEqual((snap["step"], snap["shard"], snap["shards"]), (3, 0, 1))
        del s
        agent.close()

        # What an agent hands the next generation: a plan naming that slot.
        plan = {"step": 3, "sources": [{"shard": 0, "shards": 1, "tier": "T0", "node": "node0",
                                        "path": snap["path"], "bytes": snap["bytes"],
                                        "xxh3": snap["xxh3"], "loader_rank": 0}]}
        os.environ.clear()
        os.environ["ENDURE_RESTORE_PLAN"] = json.dumps(plan)
        s2 = endure.Session.from_env()
        fresh = make_state(seed=7)
        c2 = endure.torch.Checkpointer(s2, dict(zip(names, fresh)))
        self.assertEqual(c2.restore(), 3)
        self.assertEqual(c2.last_restore_summary, "step 3 from T0 x1")
        for a, b in zip(params(state[0]), params(fresh[0])):
            self.assertTrue(torch.equal(a, b))
        self.assertEqual(state[1].state_dict()["state"].keys(),
                         fresh[1].state_dict()["state"].keys())

        # The same plan with a wrong checksum: the copy is refused, not loaded.
        plan["sources"][0]["xxh3"] = "%016x" % (int(snap["xxh3"], 16) ^ 1)
        os.environ["ENDURE_RESTORE_PLAN"] = json.dumps(plan)
        c3 = endure.torch.Checkpointer(endure.Session.from_env(), {"model": make_state(9)[0]})
        with self.assertRaisesRegex(endure.DataLossError, "checksum"):
            c3.restore()

    def test_save_runs_in_the_checkpoint_phase(self):
        agent = FakeAgent(self.dir)
        os.environ.update({"ENDURE_AGENT_SOCKET": agent.path, "ENDURE_TOKEN": "tok"})
        s = endure.Session.from_env()
        c = endure.torch.Checkpointer(s, {"model": torch.nn.Linear(2, 2)},
                                      directory=os.path.join(self.dir, "ckpt"))
        self.assertTrue(c.save(1))
        self.assertEqual(agent.next("phase")["phase"], "checkpoint")
        self.assertEqual(agent.next("phase")["phase"], "train")
        self.assertEqual(s.current_phase, "train")
        agent.close()

    def test_state_larger_than_the_slot_names_the_key_to_raise(self):
        t0 = os.path.join(self.dir, "t0")
        os.makedirs(t0)
        os.environ.update({"ENDURE_T0_DIR": t0, "ENDURE_T0_SLOT_BYTES": "1024"})
        c = endure.torch.Checkpointer(endure.Session.from_env(),
                                      {"model": torch.nn.Linear(64, 64)})
        with self.assertRaisesRegex(ValueError, "checkpoint.memory_budget"):
            c.save(1)


class LoopTest(CleanEnvironment):
    """endure.torch.Loop without a job: the pieces of an in-process rejoin
    (the tests under `endure run` kill a rank of a real 2-rank job)."""

    NAMES = ("model", "optimizer", "scheduler", "progress")

    def test_the_state_a_peer_sends_loads_bit_exact(self):
        first = make_state()
        train(*first, steps=3)
        s = endure.Session.disabled()
        sender = endure.torch.Checkpointer(s, dict(zip(self.NAMES, first)))
        meta, refs, keep = sender._collect(3)
        data = endure.torch._pack(meta, refs)
        second = make_state(seed=99)
        receiver = endure.torch.Checkpointer(s, dict(zip(self.NAMES, second)))
        meta2, tensors = endure.torch._unpack(data, "test")
        receiver._load(meta2, tensors, "test")
        train(*first, steps=5, start=3)
        train(*second, steps=5, start=3)
        for a, b in zip(params(first[0]), params(second[0])):
            self.assertTrue(torch.equal(a, b))
        self.assertEqual(first[3]["seen"], second[3]["seen"])
        with self.assertRaisesRegex(endure.DataLossError, "test: malformed state"):
            endure.torch._unpack(data[:len(data) // 2], "test")
        with self.assertRaisesRegex(endure.DataLossError, "malformed state"):
            endure.torch._unpack(bytearray(b"\xff" * 16), "test")

    def test_slots_split_the_global_batch_by_the_current_world(self):
        loop = endure.torch.Loop(endure.Session.disabled(), {"m": torch.nn.Linear(2, 2)}, 1)
        shares = []
        for rank in range(3):
            loop.world_size, loop.rank = 3, rank
            shares.append(list(loop.slots(8)))
        self.assertEqual(shares, [[0, 1, 2], [3, 4, 5], [6, 7]])
        loop.world_size, loop.rank = 1, 0
        self.assertEqual(list(loop.slots(8)), list(range(8)))

    def test_a_bare_loop_restores_and_yields_the_steps_left(self):
        state = make_state()
        s = endure.Session.disabled()
        c = endure.torch.Checkpointer(s, dict(zip(self.NAMES, state)), directory=self.dir)
        train(*state, steps=3)
        self.assertTrue(c.save(3))
        loop = endure.torch.Loop(s, dict(zip(self.NAMES, make_state(5))), 6,
                                 directory=self.dir)
        self.assertEqual(list(loop), [3, 4, 5])
        self.assertEqual(loop.start_step, 3)

    def _rejoining_session(self, offer=None):
        path = os.path.join(self.dir, "rank1.rejoin")
        os.environ.update({"ENDURE_REJOIN_FILE": path, "ENDURE_GENERATION": "0",
                           "RANK": "1", "WORLD_SIZE": "1"})
        if offer is not None:
            with open(path, "w") as f:
                f.write("".join(f"{k}={v}\n" for k, v in offer.items()))
        return endure.Session.from_env()

    def test_a_rejoin_takes_the_offer_into_os_environ(self):
        s = self._rejoining_session()
        self.assertTrue(s.rejoin_offered_here)
        self.assertFalse(s.rejoin_pending())
        self.assertFalse(s.rejoin(0.05))  # no offer yet
        with open(os.environ["ENDURE_REJOIN_FILE"], "w") as f:
            f.write("ENDURE_GENERATION=2\nRANK=0\nMASTER_PORT=4242\n")
        self.assertTrue(s.rejoin_pending())
        self.assertTrue(s.rejoin(1.0))
        self.assertEqual((s.generation, s.rank), (2, 0))
        self.assertEqual(os.environ["RANK"], "0")  # what init_process_group reads
        self.assertEqual(os.environ["MASTER_PORT"], "4242")

    def test_a_failed_step_without_an_offer_raises_its_error(self):
        s = self._rejoining_session()
        loop = endure.torch.Loop(s, {"m": torch.nn.Linear(2, 2)}, 3, rejoin_timeout_s=0.05)
        with self.assertRaisesRegex(RuntimeError, "Connection closed by peer"):
            for step in loop:
                with loop.guard():
                    raise RuntimeError("Connection closed by peer")
        # The program's own error is never taken for a peer's.
        loop = endure.torch.Loop(s, {"m": torch.nn.Linear(2, 2)}, 3)
        with self.assertRaises(KeyError):
            for step in loop:
                with loop.guard():
                    raise KeyError("x")

    def test_a_failed_step_runs_again_in_the_generation_offered(self):
        s = self._rejoining_session()
        loop = endure.torch.Loop(s, {"m": torch.nn.Linear(2, 2)}, 3, rejoin_timeout_s=5)
        ran = []
        for step in loop:
            with loop.guard():
                if step == 1 and loop.rejoins == 0:
                    with open(os.environ["ENDURE_REJOIN_FILE"], "w") as f:
                        f.write("ENDURE_GENERATION=1\nRANK=0\nWORLD_SIZE=1\n")
                    raise RuntimeError("Connection closed by peer")
                ran.append(step)
        self.assertEqual(ran, [0, 1, 2])  # step 1 again, after the rejoin
        self.assertEqual((loop.rejoins, loop.rank, s.generation), (1, 0, 1))

    def test_a_step_stops_at_its_next_layer_once_a_later_generation_is_offered(self):
        # A peer died mid-step: the survivor does not compute the doomed step
        # to its end; the hooks of loop.ddp stop it, and it runs again.
        s = self._rejoining_session()
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        loop = endure.torch.Loop(s, {"m": model}, 2, rejoin_timeout_s=5)
        net = loop.ddp(model)
        attempts = []
        for step in loop:
            with loop.guard():
                attempts.append(step)
                if step == 0 and loop.rejoins == 0:
                    with open(os.environ["ENDURE_REJOIN_FILE"], "w") as f:
                        f.write("ENDURE_GENERATION=1\nRANK=0\nWORLD_SIZE=1\n")
                    deadline = time.monotonic() + 10
                    while not s.rejoin_pending() and time.monotonic() < deadline:
                        time.sleep(0.01)  # the session's watch reads it every 10 ms
                net(torch.ones(1, 2)).sum().backward()
                attempts.append("done")
        self.assertEqual(attempts, [0, 0, "done", 1, "done"])
        self.assertEqual(loop.rejoins, 1)
        net(torch.ones(1, 2))  # outside a step the hooks never stop anything

    @unittest.skipUnless(_has_fully_shard(), "FSDP's fully_shard needs torch 2.x")
    def test_a_sharded_model_rejoins_only_when_the_loop_builds_it_over_node_memory(self):
        # A dead rank's FSDP shard dies with it: the loop rejoins in place only
        # when it can build the state anew over the next group (a function)
        # and restore the dead rank's part from node memory; otherwise it
        # says why, and the job restarts from the tiers.
        try:
            from torch.distributed.fsdp import fully_shard
        except Exception:
            self.skipTest("FSDP's fully_shard needs torch >= 2.6")
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
        try:
            def build():
                model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
                fully_shard(model)
                return {"model": model}
            s = self._rejoining_session()
            plain = endure.torch.Loop(s, {"m": torch.nn.Linear(2, 2)}, 1)
            self.assertTrue(plain.rejoins_in_place)
            for state, why in [(build(), "pass a function that builds it"),
                               (build, "has no node-memory checkpoints")]:
                err = io.StringIO()
                with contextlib.redirect_stderr(err):
                    loop = endure.torch.Loop(s, state, 1)
                self.assertFalse(loop.rejoins_in_place)
                self.assertIn("the state is sharded (FSDP)", err.getvalue())
                self.assertIn(why, err.getvalue())
            os.environ["ENDURE_T0_DIR"] = self.dir
            loop = endure.torch.Loop(self._rejoining_session(), build, 1)
            self.assertTrue(loop.rejoins_in_place)
            self.assertIsInstance(loop.state["model"], torch.nn.Sequential)
        finally:
            os.environ.pop("ENDURE_T0_DIR", None)
            torch.distributed.destroy_process_group()

    def test_a_sharded_state_in_node_memory_is_restored_into_a_state_built_anew(self):
        # What a rejoin does: the state (an FSDP model and its AdamW, whose
        # moments are DTensors too) saved to node memory step by step, built
        # anew, and restored from this rank's own snapshot of the newest step.
        try:
            from torch.distributed.fsdp import fully_shard
        except Exception:
            self.skipTest("FSDP's fully_shard needs torch >= 2.6")
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
                           "ENDURE_REJOIN_FILE": os.path.join(self.dir, "rank0.rejoin"),
                           "ENDURE_GENERATION": "0", "RANK": "0", "WORLD_SIZE": "1",
                           "ENDURE_T0_DIR": self.dir})
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
        try:
            def build():
                torch.manual_seed(0)
                model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
                fully_shard(model)
                return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=0.1),
                        "data": {"position": 0}}
            loop = endure.torch.Loop(endure.Session.from_env(), build, 3)
            self.assertTrue(loop.rejoins_in_place)
            for step in loop:
                model, opt = loop.state["model"], loop.state["opt"]
                with loop.guard():
                    model(torch.ones(2, 4)).pow(2).sum().backward()
                    opt.step()
                    opt.zero_grad()
                loop.state["data"]["position"] = step + 1
                loop.checkpointer.save(step + 1)

            def full(state):
                model, opt = state["model"], state["opt"]
                moments = [opt.state[p]["exp_avg"] for p in model.parameters()]
                return [t.full_tensor() for t in list(model.parameters()) + moments]
            want = full(loop.state)
            loop._make_state()  # fresh: the initial parameters, no moments
            self.assertFalse(torch.equal(loop.state["model"][0].weight.full_tensor(), want[0]))
            self.assertEqual(loop.checkpointer._restore_rejoined(), 3)
            self.assertEqual(loop.checkpointer.last_restore_summary,
                             "step 3 from node memory (each rank its own shard)")
            got = full(loop.state)
            self.assertEqual(len(got), len(want))
            for a, b in zip(got, want):
                self.assertTrue(torch.equal(a, b))
            self.assertEqual(loop.state["data"], {"position": 3})
        finally:
            for v in ("ENDURE_T0_DIR", "ENDURE_REJOIN_FILE"):
                os.environ.pop(v, None)
            torch.distributed.destroy_process_group()

    def test_a_save_into_node_memory_overlaps_the_next_step_and_keeps_the_state_it_saw(self):
        # After the first save, a save's copy runs behind the program: the
        # optimizer's next update waits for it, and a buffer changed before
        # it ends (as a forward pass would) was saved as it was.
        os.environ.update({"ENDURE_GENERATION": "0", "RANK": "0", "WORLD_SIZE": "1",
                           "ENDURE_T0_DIR": self.dir})
        session = endure.Session.from_env()
        model = torch.nn.Linear(256, 256)
        model.register_buffer("seen", torch.zeros(4))
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        ckpt = endure.torch.Checkpointer(session, {"model": model, "opt": opt})
        self.assertTrue(ckpt.save(1))  # in the foreground: it checks the slot
        self.assertIsNone(ckpt._pending)
        weight, seen = model.weight.detach().clone(), model.seen.clone()
        self.assertTrue(ckpt.save(2))
        overlaps = hasattr(opt, "register_step_pre_hook")  # torch >= 2.0
        self.assertEqual(ckpt._pending is not None, overlaps)
        model.seen.add_(7)
        model(torch.ones(1, 256)).sum().backward()
        opt.step()  # waits for the copy first
        self.assertIsNone(ckpt._pending)
        self.assertFalse(torch.equal(model.weight, weight))
        meta, tensors = endure._endure.decode_shard_bytearray(
            session._impl.read_local_snapshot(2), "t0")
        saved = {name: endure.torch._tensor_from(dtype, shape, data, "t0")
                 for name, dtype, shape, data in tensors}
        self.assertTrue(torch.equal(saved["model/weight"], weight))
        self.assertTrue(torch.equal(saved["model/seen"], seen))
        del os.environ["ENDURE_T0_DIR"]

    def test_a_block_is_assembled_from_the_saved_blocks_that_overlap_it(self):
        # A 5x2 tensor saved by 3 ranks (rows 0-1, 2-3, 4) re-sharded for 2
        # (rows 0-2, 3-4): each new block takes the rows of every old one it
        # overlaps; rows that no saved block holds are a data loss.
        full = torch.arange(10.0).reshape(5, 2)
        saved = [([0, 0], full[0:2]), ([2, 0], full[2:4]), ([4, 0], full[4:5])]
        assemble = endure.torch._assemble
        self.assertTrue(torch.equal(assemble(saved, [3, 2], [0, 0], torch.float32, "t"),
                                    full[0:3]))
        self.assertTrue(torch.equal(assemble(saved, [2, 2], [3, 0], torch.float32, "t"),
                                    full[3:5]))
        # Replicated blocks (every rank the whole) overlap: any of them will do.
        self.assertTrue(torch.equal(
            assemble([([0, 0], full), ([0, 0], full)], [5, 2], [0, 0], torch.float32, "t"),
            full))
        with self.assertRaisesRegex(endure.DataLossError, "do not cover"):
            assemble(saved[:2], [2, 2], [3, 0], torch.float32, "t")

    def test_exact_gradients_of_a_failed_attempt_are_dropped(self):
        # A step cut short after one micro-batch: its next attempt sums only
        # its own two (a third, left over, would change the gradient).
        s = self._rejoining_session()
        model = torch.nn.Linear(2, 1, bias=False)
        loop = endure.torch.Loop(s, {"m": model}, 1, rejoin_timeout_s=5)
        exact = loop.exact_gradients(model.parameters())
        x = torch.tensor([[1.0, 2.0]])
        for step in loop:
            with loop.guard():
                (model(x).sum() / 2).backward()
                exact.take_slot()
                if loop.rejoins == 0:
                    with open(os.environ["ENDURE_REJOIN_FILE"], "w") as f:
                        f.write("ENDURE_GENERATION=1\nRANK=0\nWORLD_SIZE=1\n")
                    raise RuntimeError("Connection closed by peer")
                (model(x).sum() / 2).backward()
                exact.take_slot()
                exact.reduce(2)
        self.assertTrue(torch.equal(model.weight.grad, x), model.weight.grad)

    def test_a_standby_takes_its_assignment_into_os_environ(self):
        script = ("import os, endure; endure.await_assignment(); "
                  "print(os.environ['RANK'], os.environ.get('ENDURE_STANDBY'))")
        env = dict(os.environ, ENDURE_STANDBY="1")
        p = subprocess.run([sys.executable, "-c", script], input="RANK=3\nWORLD_SIZE=4\n",
                           env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stdout.strip()), (0, "3 None"), p.stderr)
        # Discarded before it was needed: its input closes empty, it exits 0.
        p = subprocess.run([sys.executable, "-c", script], input="", env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stdout), (0, ""), p.stderr)


if __name__ == "__main__":
    unittest.main()
