"""Stock framework scripts under `endure run`, unmodified, on torch 2.x
(`make test-torch` runs them in the virtualenv of scripts/torch-venv; under
Debian's torch 1.13, which has no global optimizer hooks, they are skipped).

Each script trains with its framework's defaults, keeps the framework's own
checkpoints and resumes from the newest, as its documentation shows. The job
spec names no progress_pattern: the agent gives every Python worker
endure.autostep, which counts the optimizer's steps. A kill injected at step
25 (between two optimizer steps) must be recovered, the framework must
resume from its own checkpoint of step 20, and the report must say so: the
steps the script ran, the restore point, the steps lost. Evaluations and
saves during training are no hangs."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

ENDURE = os.environ.get("ENDURE_BIN", "build/bin/endure")


def _torch2_with(*modules):
    try:
        import torch
        if int(torch.__version__.split(".")[0]) < 2:
            return f"torch {torch.__version__} has no global optimizer hooks"
        for m in modules:
            __import__(m)
    except ImportError as e:
        return f"needs {e.name} (make test-torch installs it)"
    return None


LIGHTNING = textwrap.dedent("""\
    import sys, torch, lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
    from torch.utils.data import DataLoader, TensorDataset

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(8, 1)

        def training_step(self, b, i):
            x, y = b
            loss = torch.nn.functional.mse_loss(self.l(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def validation_step(self, b, i):
            x, y = b
            self.log("val_loss", torch.nn.functional.mse_loss(self.l(x), y))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    root, bar = sys.argv[1], sys.argv[2]
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(320, 8, generator=g), torch.randn(320, 1, generator=g))
    callbacks = [ModelCheckpoint(dirpath=root, every_n_train_steps=10, save_last=True,
                                 save_top_k=-1)]
    if bar == "tqdm":
        callbacks.append(TQDMProgressBar())
    trainer = L.Trainer(max_steps=50, accelerator="cpu", devices=1, logger=False,
                        val_check_interval=10, default_root_dir=root, callbacks=callbacks,
                        enable_model_summary=False)
    trainer.fit(M(), DataLoader(data, batch_size=16), DataLoader(data, batch_size=64),
                ckpt_path="last")
    print(f"global_step={trainer.global_step}", flush=True)
    """)

HUGGINGFACE = textwrap.dedent("""\
    import sys, torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    class Data(torch.utils.data.Dataset):
        def __init__(self, n):
            g = torch.Generator().manual_seed(0)
            self.x = torch.randint(0, 64, (n, 16), generator=g)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return {"input_ids": self.x[i], "labels": self.x[i]}

    out = sys.argv[1]
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=out, max_steps=50, per_device_train_batch_size=8,
                             save_steps=10, eval_strategy="steps", eval_steps=15,
                             logging_steps=10, report_to=[], use_cpu=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=Data(400), eval_dataset=Data(64))
    last = get_last_checkpoint(out)  # as the Trainer's examples (run_clm.py) resume
    print(f"resuming from {last}", flush=True)
    trainer.train(resume_from_checkpoint=last)
    print(f"global_step={trainer.state.global_step}", flush=True)
    """)


def run_job(directory, name, script, args):
    path = os.path.join(directory, name + "_train.py")  # not a module name it imports
    with open(path, "w") as f:
        f.write(script)
    state = os.path.join(directory, name)
    spec = os.path.join(directory, name + ".toml")
    with open(spec, "w") as f:
        f.write(textwrap.dedent(f"""\
            [job]
            name = "{name}"
            command = {json.dumps([sys.executable, path] + args)}
            nodes = 1
            state_dir = "{state}"
            [detection]
            startup_timeout = "120s"
            [recovery]
            backoff_initial = "0s"
            [[faults]]
            kind = "kill"
            rank = 0
            step = 25
            """))
    p = subprocess.run([ENDURE, "run", spec, "--quiet"], capture_output=True, text=True,
                       timeout=600)
    report = {}
    if os.path.exists(os.path.join(state, "report.json")):
        with open(os.path.join(state, "report.json")) as f:
            report = json.load(f)
    logs = ""
    log_dir = os.path.join(state, "nodes", "node0", "logs")
    if os.path.isdir(log_dir):
        for name in sorted(os.listdir(log_dir)):
            if name.endswith(".log"):
                with open(os.path.join(log_dir, name), errors="replace") as f:
                    logs += f"--- {name}\n" + f.read()
    return p, report, logs


class StockFrameworksWithAKill(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="endure-zerocode-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def check(self, p, report, logs, resumed_line):
        out = p.stdout + p.stderr + "\n" + logs[-6000:]
        self.assertEqual(p.returncode, 0, out)
        self.assertEqual(report["steps"], 50, out)
        incidents = report["incidents"]
        self.assertEqual([i["cause"] for i in incidents], ["signal 9 SIGKILL"],
                         json.dumps(incidents, indent=1))
        kill = incidents[0]
        self.assertEqual(kill["failed_at_step"], 24, kill)
        self.assertEqual(kill["restored_step"], 20, kill)
        self.assertEqual(kill["steps_lost"], 4, kill)
        self.assertIn(resumed_line, logs)
        self.assertIn("global_step=50", logs)
        self.assertNotIn("endure.autostep: off", logs)
        ledger = report["ledger_s"]
        self.assertGreater(ledger["productive"], 0.0, ledger)

    @unittest.skipIf(_torch2_with("lightning", "rich"), _torch2_with("lightning", "rich"))
    def test_lightning_with_its_rich_bar(self):
        root = os.path.join(self.dir, "ckpt")
        p, report, logs = run_job(self.dir, "rich", LIGHTNING, [root, "rich"])
        self.check(p, report, logs, "Restoring states from the checkpoint path")

    # Without rich installed Lightning draws its TQDMProgressBar; the venv has
    # rich (for the case above), so the script names that bar.
    @unittest.skipIf(_torch2_with("lightning"), _torch2_with("lightning"))
    def test_lightning_with_its_tqdm_bar(self):
        root = os.path.join(self.dir, "ckpt")
        p, report, logs = run_job(self.dir, "tqdm", LIGHTNING, [root, "tqdm"])
        self.check(p, report, logs, "Restoring states from the checkpoint path")

    @unittest.skipIf(_torch2_with("transformers", "accelerate"),
                     _torch2_with("transformers", "accelerate"))
    def test_huggingface_trainer(self):
        out = os.path.join(self.dir, "out")
        p, report, logs = run_job(self.dir, "hf", HUGGINGFACE, [out])
        self.check(p, report, logs, "resuming from " + os.path.join(out, "checkpoint-20"))


if __name__ == "__main__":
    unittest.main()
