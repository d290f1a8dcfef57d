#!/usr/bin/env python3
"""False alarms (`make bench`, printed figures, one run; issue 27): clean jobs
of several shapes under `endure run`, with every detector at its defaults and
nothing injected, and what the detectors did about them per 10,000 steps:
incidents, rollbacks, skipped steps, stragglers flagged, pairwise tests and
strikes. The target for each is 0. Shapes (small batches, so that the loss
is as noisy as it gets):

  - endure-train, 2 nodes x 1 rank and 2 nodes x 2 ranks (2 layers, d-model 64,
    context 64, global batch 8), every step into node memory;
  - the Python twin, examples/python/train_gpt.py, 2 nodes x 1 rank;
  - an unmodified DDP script (bench/plain_ddp.py: no Endure import) whose
    progress is read from its output with a progress_pattern.

Then, so that quiet is not bought with blindness, the same endure-train job
(2 x 1) with one injected anomaly each: a NaN loss and a 3x loss spike, both
on every rank as an anomaly of the summed loss shows (transient ones: the
replay does not reproduce them), and a bitflip in a parameter
(caught by the fingerprint check every 10 steps): the step it struck, the
step and time it was detected at, and what the replay said.

Usage: false_alarm_bench.py OUT_DIR [STEPS_SCALE]
STEPS_SCALE (default 1.0) scales every clean run's steps (10,000 in all at 1.0).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(SOURCE, "build", "bin")
PYTHONPATH = os.path.join(SOURCE, "build", "python")
PYTHON = "/usr/bin/python3"

TRAIN_SMALL = ["--layers", "2", "--d-model", "64", "--heads", "2", "--context", "64",
               "--global-batch", "8", "--log-every", "500", "--eval-batches", "1",
               "--sample-tokens", "0", "--threads", "1"]


def run_job(out, name, command, nodes, ranks_per_node, sections, env=None):
    """`endure run` of one job; returns (report, seconds, controller log)."""
    state = os.path.join(out, name)
    shutil.rmtree(state, ignore_errors=True)
    spec = os.path.join(out, name + ".toml")
    env_line = ""
    if env:
        env_line = "env = { " + ", ".join(f'{k} = "{v}"' for k, v in env.items()) + " }\n"
    with open(spec, "w") as f:
        f.write(f'[job]\nname = "{name}"\ncommand = {json.dumps(command)}\n'
                f'nodes = {nodes}\nranks_per_node = {ranks_per_node}\nstate_dir = "{state}"\n'
                f'{env_line}{sections}')
    start = time.monotonic()
    p = subprocess.run([os.path.join(BIN, "endure"), "run", spec, "--quiet"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    took = time.monotonic() - start
    try:
        with open(os.path.join(state, "report.json")) as f:
            report = json.load(f)
    except (OSError, ValueError):
        sys.exit(f"{name}: no report (exit {p.returncode}):\n{p.stdout[-3000:]}")
    try:
        with open(os.path.join(state, "controller.log")) as f:
            log = f.read()
    except OSError:
        log = ""
    return report, took, log, p.returncode


def counts(report, log):
    incidents = report.get("incidents", [])
    return {
        "incidents": len(incidents),
        "rollbacks": sum(1 for i in incidents if str(i.get("action", "")).startswith("roll_back")),
        "skipped": len(report.get("skipped_steps", [])),
        "stragglers": len(report.get("stragglers", []))
        + sum(1 for i in incidents if i.get("cause") == "straggler"),
        "pairwise": sum(1 for i in incidents if "pairwise test" in i.get("reason", "")),
        "strikes": len(re.findall(r"strike against ", log)),
    }


def clean_runs(out, scale):
    steps = lambda n: max(50, int(n * scale))
    every_step = "[checkpoint]\nevery_steps = 1\npersist_every_steps = 100\n"
    shapes = [
        ("endure-train 2x1", "train21", 2, 1, steps(3500),
         lambda n: [os.path.join(BIN, "endure-train"), "--steps", str(n), "--micro-batch", "4"]
         + TRAIN_SMALL, every_step, None),
        ("endure-train 2x2", "train22", 2, 2, steps(2500),
         lambda n: [os.path.join(BIN, "endure-train"), "--steps", str(n), "--micro-batch", "2"]
         + TRAIN_SMALL, every_step, None),
        ("Python twin 2x1", "twin21", 2, 1, steps(2000),
         lambda n: [PYTHON, os.path.join(SOURCE, "examples", "python", "train_gpt.py"),
                    "--steps", str(n), "--layers", "2", "--d-model", "64", "--heads", "2",
                    "--context", "64", "--global-batch", "8", "--micro-batch", "4",
                    "--log-every", "500", "--eval-batches", "1", "--threads", "1"],
         every_step, {"PYTHONPATH": PYTHONPATH}),
        ("plain DDP, pattern", "ddp21", 2, 1, steps(2000),
         lambda n: [PYTHON, os.path.join(SOURCE, "bench", "plain_ddp.py"), "--steps", str(n),
                    "--data", "/usr/share/games/fortunes/fortunes"],
         "[detection]\nprogress_pattern = 'step (?P<step>\\d+)/\\d+ loss (?P<loss>\\S+)'\n", None),
    ]
    print("clean runs, detectors at their defaults (the target is 0 in every column):")
    header = ("shape", "steps", "wall_s", "mode", "incidents", "rollbacks", "skipped", "stragglers",
              "pairwise", "strikes")
    print("%-20s %6s %7s %8s %9s %9s %8s %10s %8s %7s" % header)
    total = {k: 0 for k in header[4:]}
    total_steps = 0
    for label, name, nodes, rpn, n, command, sections, env in shapes:
        report, took, log, rc = run_job(out, name, command(n), nodes, rpn, sections, env)
        if rc != 0 or report.get("steps", 0) != n:
            print(f"{label}: exit {rc}, {report.get('steps')} of {n} steps: "
                  f"{report.get('verdict', '')}")
        c = counts(report, log)
        total_steps += report.get("steps", 0)
        for k in total:
            total[k] += c[k]
        print("%-20s %6d %7.1f %8s %9d %9d %8d %10d %8d %7d" % (
            label, report.get("steps", 0), took, report.get("anomaly_mode", "-"), c["incidents"],
            c["rollbacks"], c["skipped"], c["stragglers"], c["pairwise"], c["strikes"]))
        for i in report.get("incidents", []):
            print(f"    incident: {i.get('cause')} at step {i.get('failed_at_step')}: "
                  f"{i.get('reason', '')[:300]}")
        for s in report.get("stragglers", []):
            print(f"    straggler kept: {s.get('reason', '')[:300]}")
    per = 10000.0 / max(1, total_steps)
    print("%-20s %6d %7s %8s %9.2f %9.2f %8.2f %10.2f %8.2f %7.2f" % (
        "per 10,000 steps", total_steps, "", "", total["incidents"] * per,
        total["rollbacks"] * per, total["skipped"] * per, total["stragglers"] * per,
        total["pairwise"] * per, total["strikes"] * per))


def injected_runs(out):
    print()
    print("injected anomalies, endure-train 2x1, 400 steps, detectors at their defaults:")
    print("%-12s %8s %9s %10s %12s  %s" % ("anomaly", "at_step", "detected", "after_s", "steps_lost",
                                           "verdict of the replay"))
    cases = [
        # On every rank, as a real anomaly of the summed loss shows.
        ("NaN", 'kind = "nan"\nrank = 0\nstep = 300\n[[faults]]\nkind = "nan"\nrank = 1\n'
         'step = 300\n', ""),
        ("3x spike", 'kind = "spike"\nrank = 0\nstep = 300\nfactor = 3\n[[faults]]\n'
         'kind = "spike"\nrank = 1\nstep = 300\nfactor = 3\n', ""),
        ("bitflip", 'kind = "bitflip"\nrank = 1\nstep = 300\n', "sdc_check_every = 10\n"),
    ]
    for label, fault, detection in cases:
        sections = ("[checkpoint]\nevery_steps = 1\npersist_every_steps = 100\n"
                    f"[detection]\n{detection}[recovery]\nin_process = false\n"
                    f"[[faults]]\n{fault}")
        command = [os.path.join(BIN, "endure-train"), "--steps", "400", "--micro-batch", "4"] \
            + TRAIN_SMALL
        report, _, _, rc = run_job(out, "inject-" + label.split()[0].lower(), command, 2, 1,
                                   sections)
        incidents = report.get("incidents", [])
        if not incidents:
            print("%-12s %8d %9s %10s %12s  %s" % (label, 300, "MISSED", "-", "-", f"exit {rc}"))
            continue
        i = incidents[0]
        reason = i.get("reason", "")
        m = re.search(r"replay of step \d+: ([^;]*)", reason)
        verdict = m.group(1)[:90] if m else ("fingerprints: " + reason[:80])
        # A loss anomaly's failed_at_step is the step before it.
        detected = i.get("failed_at_step", -1) + (1 if i.get("cause", "").startswith("loss_") else 0)
        print("%-12s %8d %9s %10.3f %12d  %s" % (
            label, 300, f"step {detected}", i.get("detected_after_s", -1.0),
            i.get("steps_lost", -1), verdict))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = os.path.abspath(sys.argv[1])
    scale = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    os.makedirs(out, exist_ok=True)
    clean_runs(out, scale)
    injected_runs(out)


if __name__ == "__main__":
    main()
