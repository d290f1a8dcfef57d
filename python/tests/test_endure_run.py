"""The Python reference trainer (examples/python/train_gpt.py) under
`endure run`, real processes on this machine: a killed rank, a hang, a NaN
loss and a lost node are each recovered, the incidents name their causes,
the hang shows the script's Python frames, and the final parameters are bit
for bit those of a run without faults."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

ENDURE = os.environ.get("ENDURE_BIN", "build/bin/endure")
SOURCE = os.environ.get("ENDURE_SOURCE_DIR", os.getcwd())
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
        faults = textwrap.dedent("""\
            [[faults]]
            id = "kill"
            kind = "kill"
            rank = 1
            step = 6
            [[faults]]
            id = "hang"
            kind = "hang"
            rank = 0
            step = 12
            [[faults]]
            id = "nan"
            kind = "nan"
            rank = 1
            step = 18
            [[faults]]
            id = "agent"
            kind = "kill-agent"
            rank = 1
            step = 24
            """)
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
        self.assertEqual(kill["restored_step"], 5, kill)  # every-step checkpoints in T0
        self.assertEqual(hang["rank"], 0)
        stacks = "\n".join(s if isinstance(s, str) else json.dumps(s) for s in hang["stacks"])
        self.assertIn("train_gpt.py", stacks)
        self.assertIn("in main", stacks)
        self.assertLess(nan["restored_step"], 18)
        self.assertGreater(report["ettr"], 0.0)
        ledger = sum(report["ledger_s"].values())
        self.assertAlmostEqual(ledger, report["wall_s"], delta=0.01 * report["wall_s"])
        self.assertEqual(report["param_fingerprint"], self.reference, out)

    def test_durable_only_checkpoints_recover_bit_exact(self):
        # memory = false: the trainer commits to the durable directory itself.
        faults = textwrap.dedent("""\
            [[faults]]
            id = "kill"
            kind = "kill"
            rank = 0
            step = 14
            """)
        p, report = run(self.dir, "durable", spec(
            os.path.join(self.dir, "durable"), faults,
            checkpoint="every_steps = 5\nmemory = false\n"))
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertEqual([i["cause"] for i in report["incidents"]], ["signal 9 SIGKILL"])
        self.assertEqual(report["incidents"][0]["restored_step"], 10)
        self.assertEqual(report["param_fingerprint"], self.reference, out)


if __name__ == "__main__":
    unittest.main()
