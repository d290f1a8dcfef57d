"""`endure run --nproc-per-node N script.py ARGS` (issue 26, item 2): a
torchrun script runs unchanged, with torchrun's environment, without a job
spec; a rank that dies is recovered; a bad flag exits 2 naming it."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

ENDURE = os.environ.get("ENDURE_BIN", "build/bin/endure")

# A script as one runs it under torchrun: plain torch.distributed, env://,
# nothing of Endure's. Rank 1 dies once, in the first attempt, after the
# collective (TORCHELASTIC_RESTART_COUNT says which attempt this is).
SCRIPT = textwrap.dedent("""\
    import argparse, json, os, sys
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--die-once", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if args.die_once and rank == 1 and not os.path.exists(os.path.join(args.out, "died")):
        open(os.path.join(args.out, "died"), "w").close()
        sys.exit(7)
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
            "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS"]
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"world": world, "sum": t.item(), "tag": args.tag, "attempt": attempt,
                   "env": {k: os.environ.get(k) for k in keys}}, f)
    dist.destroy_process_group()
    """)


class TorchrunStyleLauncher(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="endure-launch-")
        self.script = os.path.join(self.dir, "plain_ddp.py")
        with open(self.script, "w") as f:
            f.write(SCRIPT)
        self.out = os.path.join(self.dir, "out")
        os.makedirs(self.out)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def endure_run(self, *args):
        env = dict(os.environ)
        env.pop("OMP_NUM_THREADS", None)
        # The workers' `python3` is the one on PATH, as a user's venv would
        # have it: this interpreter's, which has torch.
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        return subprocess.run([ENDURE, "run", *args], cwd=self.dir, env=env,
                              capture_output=True, text=True, timeout=300)

    def ranks(self):
        out = {}
        for r in range(2):
            with open(os.path.join(self.out, f"rank{r}.json")) as f:
                out[r] = json.load(f)
        return out

    def test_a_torchrun_script_runs_unchanged_with_torchruns_environment(self):
        # As torchrun's documentation writes it for one machine.
        p = self.endure_run("--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
                            "--rdzv-endpoint=localhost:0", "--quiet", "plain_ddp.py",
                            "--out", self.out, "--tag", "a b")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        ranks = self.ranks()
        for r, got in ranks.items():
            self.assertEqual(got["world"], 2)
            self.assertEqual(got["sum"], 3.0)  # 1 + 2: one collective over both
            self.assertEqual(got["tag"], "a b")  # the script's arguments as given
            env = got["env"]
            self.assertEqual(env["RANK"], str(r))
            self.assertEqual(env["LOCAL_RANK"], str(r))
            self.assertEqual(env["LOCAL_WORLD_SIZE"], "2")
            self.assertEqual(env["GROUP_RANK"], "0")
            self.assertEqual(env["GROUP_WORLD_SIZE"], "1")
            self.assertEqual(env["ROLE_RANK"], str(r))
            self.assertEqual(env["ROLE_NAME"], "default")
            self.assertEqual(env["TORCHELASTIC_RUN_ID"], "plain_ddp")
            self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], "0")
            self.assertEqual(env["OMP_NUM_THREADS"], "1")
        # Its state, logs and report where a new user finds them.
        with open(os.path.join(self.dir, "endure-plain_ddp", "report.json")) as f:
            report = json.load(f)
        self.assertTrue(report["completed"], report)
        self.assertEqual(report["incidents"], [])

    def test_a_rank_that_dies_is_recovered_and_the_attempt_counted(self):
        p = self.endure_run("--nproc-per-node", "2", "--run-id", "once", "--quiet",
                            "plain_ddp.py", "--out", self.out, "--tag", "x", "--die-once")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        ranks = self.ranks()
        self.assertEqual(ranks[0]["attempt"], ranks[1]["attempt"])
        self.assertGreaterEqual(ranks[1]["attempt"], 1)
        self.assertEqual(ranks[1]["env"]["TORCHELASTIC_RUN_ID"], "once")
        with open(os.path.join(self.dir, "endure-once", "report.json")) as f:
            report = json.load(f)
        self.assertTrue(report["completed"], report)
        self.assertEqual(len(report["incidents"]), 1, report["incidents"])
        self.assertEqual(report["incidents"][0]["cause"], "worker_exit code 7")
        self.assertEqual(report["incidents"][0]["rank"], 1)

    def test_a_bad_flag_exits_2_naming_it(self):
        for args, named in [
            (["--nproc-per-node", "2", "--bogus", "plain_ddp.py"], "--bogus"),
            (["--nproc-per-node", "none", "plain_ddp.py"], "--nproc-per-node: 'none'"),
            (["--nnodes", "3:2", "plain_ddp.py"], "--nnodes: '3:2'"),
            (["--max-restarts", "0", "plain_ddp.py"], "--max-restarts"),
            (["--nproc-per-node", "2"], "no script"),
            (["--node-rank", "1", "plain_ddp.py"], "unknown flag --node-rank"),
        ]:
            p = self.endure_run(*args)
            self.assertEqual(p.returncode, 2, (args, p.stdout, p.stderr))
            self.assertIn(named, p.stderr, args)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "endure-plain_ddp")))


if __name__ == "__main__":
    unittest.main()
