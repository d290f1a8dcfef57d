#!/usr/bin/env python3
"""A real Prometheus against a running Endure job (issue 29, item 3).

1. The shipped rules and dashboard, offline: `promtool check rules` and
   `promtool test rules` on deploy/prometheus/, `promtool check config` on the
   shipped prometheus.yml and on the one this test generates; every expression
   of deploy/grafana/endure.json parses (promtool, as recording rules) and
   names only metrics of docs/monitoring.md's table.
2. A 2-node job of endure-train with rank 1 held in a step (an injected hang
   whose timeout is far away) and SIGKILLed by this test once Prometheus has
   scraped the job and the alert below fires, and no durable checkpoint
   during the run, scraped every second by Debian's `prometheus`
   with the shipped alerts.yml (EndureNoDurableCheckpoint at a test-sized
   threshold). Through Prometheus' HTTP API (PromQL) it asserts:
   - endure_build_info has a series, endure_ettr samples in [0, 1];
   - every metric of the table is scraped with the table's type (metadata);
   - sum(endure_incidents_total) is 0 (or absent) before the kill and 1 after
     it, on one series whose `cause` is the incident's cause in report.json,
     and increase() by cause sees that one incident (as an alert would);
     one restart (a route of the table), one detection and one recovery
     observed in the histograms; no counter ever went down;
   - the alert EndureNoDurableCheckpoint fires while the job runs;
   - every dashboard expression is accepted by the server.

Usage: prometheus_test.py ENDURE_BIN ENDURE_TRAIN_BIN SOURCE_DIR
Exits 77 (ctest: skipped) without /usr/bin/prometheus or /usr/bin/promtool.
Stdlib only.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

from held_rank import hold_fault, held_rank_pid

PROMETHEUS, PROMTOOL = "/usr/bin/prometheus", "/usr/bin/promtool"

# The job: 2 nodes x 1 rank of a small GPT, about 40 s of training here
# beside Prometheus; rank 1 held in step KILL_STEP until this test kills it,
# after Prometheus' first scrape and the alert (ordered by those events, not
# by the machine's speed: a fast machine once reached the step before the
# first scrape). Memory checkpoints every 5 steps, but the 100000th would be
# the first durable one: no durable checkpoint is committed while the job runs.
STEPS, KILL_STEP = 1000, 400
# EndureNoDurableCheckpoint, test-sized: the shipped expression with this
# threshold instead of 1800 s and `for: 0s` instead of 5m.
AGE_THRESHOLD_S = 5


class Failure(Exception):
    pass



def cause_label(cause):
    """The metric label of an incident's cause (core::CauseLabel) for the
    families a crash gives; catalogue names are their own label."""
    parts = cause.split()
    if len(parts) == 3 and parts[0] == "signal" and parts[2].startswith("SIG"):
        return "signal_" + parts[2].lower()
    if cause.startswith("worker_exit code "):
        return "worker_exit"
    return cause

def check(cond, what):
    if not cond:
        raise Failure(what)


def ok(what):
    print("ok: " + what, flush=True)


def wait_for(what, predicate, timeout_s, interval_s=0.25, alive=None):
    """Polls predicate() until it returns a true value (returned); fails after
    timeout_s, or as soon as `alive()` (when given) says a process ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None and not alive():
            raise Failure("%s: the job ended first" % what)
        if time.monotonic() > deadline:
            raise Failure("%s: not within %g s" % (what, timeout_s))
        time.sleep(interval_s)


# --- docs/monitoring.md: the contract -------------------------------------

def contract_metrics(source):
    """{metric name: type} from the table under '## Metrics'."""
    text = open(os.path.join(source, "docs", "monitoring.md")).read()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    metrics = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`endure_"):
            continue
        names = re.findall(r"`(endure_\w+)`", cells[0])
        # "gauge (1)" -> gauge; "gauge, counter" pairs with two names.
        kinds = [re.sub(r"\s*\(.*\)", "", k).strip() for k in cells[1].split(",")]
        if len(kinds) == 1:
            kinds *= len(names)
        check(len(kinds) == len(names), "monitoring.md: cannot pair %r with %r" % (names, kinds))
        for name, kind in zip(names, kinds):
            check(kind in ("gauge", "counter", "histogram", "summary"),
                  "monitoring.md: %s has type %r" % (name, kind))
            metrics[name] = kind
    check(len(metrics) >= 30, "monitoring.md: only %d metrics parsed" % len(metrics))
    return metrics


def series_names(metrics):
    """Every series name the metrics expose (a histogram's _bucket/_sum/_count)."""
    names = set()
    for name, kind in metrics.items():
        if kind in ("histogram", "summary"):
            names.update(name + s for s in ("_bucket", "_sum", "_count"))
        if kind != "histogram":
            names.add(name)
    return names


# --- deploy/grafana/endure.json -------------------------------------------

def dashboard_exprs(path):
    """(where, expr) for every PromQL expression of the dashboard."""
    dashboard = json.load(open(path))
    found = []

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dashboard["panels"]):
        for t in p.get("targets", []):
            found.append(("panel %r %s" % (p.get("title"), t.get("refId")), t["expr"]))
    for a in dashboard.get("annotations", {}).get("list", []):
        if "expr" in a:
            found.append(("annotation %r" % a["name"], a["expr"]))
    return dashboard, found


def grafana_to_promql(expr):
    """The expression as Grafana sends it for 'all instances'."""
    for var, value in (("$instance", ".+"), ("$__rate_interval", "5m"), ("$__range", "1h")):
        expr = expr.replace(var, value)
    return expr


KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan"}


def metric_names_in(expr):
    """The metric names an expression selects: identifiers that are neither
    functions (followed by '('), keywords, label matchers, grouping labels,
    strings nor durations."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                 # strings
    e = re.sub(r"\{[^}]*\}", "", e)                               # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                              # ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", e):
        if m.group(2) or m.group(1).lower() in KEYWORDS:
            continue
        names.add(m.group(1))
    return names


# --- Prometheus' HTTP API -------------------------------------------------

class Prometheus:
    def __init__(self, base):
        self.base = base

    def get(self, path, **params):
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise Failure("%s %s: %s" % (path, params, body.get("error", body)))
        return body["data"]

    def query(self, q):
        """The instant vector of q now: [(labels, value)]."""
        data = self.get("/api/v1/query", query=q)
        check(data["resultType"] == "vector", "%s: a %s, not a vector" % (q, data["resultType"]))
        return [(s["metric"], float(s["value"][1])) for s in data["result"]]

    def scalar(self, q):
        """The one value of q now, or None when it has no series."""
        v = self.query(q)
        check(len(v) <= 1, "%s: %d series, expected at most one: %s" % (q, len(v), v))
        return v[0][1] if v else None


# --- The test --------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sized_rules(shipped):
    """alerts.yml with EndureNoDurableCheckpoint's threshold and `for` made
    test-sized (the same expression otherwise)."""
    text = open(shipped).read()
    start = text.index("- alert: EndureNoDurableCheckpoint")
    end = text.index("- alert:", start + 1)
    rule = text[start:end]
    check(rule.count("endure_durable_checkpoint_age_seconds > 1800") == 1 and rule.count("for: 5m") == 1,
          "alerts.yml: EndureNoDurableCheckpoint is not `..._age_seconds > 1800` for 5m")
    rule = (rule.replace("endure_durable_checkpoint_age_seconds > 1800",
                         "endure_durable_checkpoint_age_seconds > %d" % AGE_THRESHOLD_S)
            .replace("for: 5m", "for: 0s"))
    return ("# alerts.yml as shipped but for EndureNoDurableCheckpoint: the shipped\n"
            "# expression with a test-sized threshold (%d s, not 1800) and for: 0s.\n"
            % AGE_THRESHOLD_S + text[:start] + rule + text[end:])


def promtool(*args, cwd=None):
    r = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True)
    check(r.returncode == 0, "promtool %s failed:\n%s%s" % (" ".join(args), r.stdout, r.stderr))
    return r.stdout


def offline_checks(source, tmp, metrics):
    deploy = os.path.join(source, "deploy", "prometheus")
    promtool("check", "rules", os.path.join(deploy, "alerts.yml"))
    ok("promtool check rules deploy/prometheus/alerts.yml")
    out = promtool("test", "rules", "alerts_test.yml", cwd=deploy)
    check("SUCCESS" in out, "promtool test rules: %s" % out)
    ok("promtool test rules deploy/prometheus/alerts_test.yml")
    promtool("check", "config", os.path.join(deploy, "prometheus.yml"))
    ok("promtool check config deploy/prometheus/prometheus.yml")

    allowed = series_names(metrics) | {"up"}
    dashboard, exprs = dashboard_exprs(os.path.join(source, "deploy", "grafana", "endure.json"))
    check(dashboard.get("schemaVersion", 0) >= 36, "endure.json: schemaVersion %s" % dashboard.get("schemaVersion"))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    check(variables.get("DS_PROMETHEUS", {}).get("type") == "datasource", "endure.json: no DS_PROMETHEUS datasource variable")
    check("instance" in variables, "endure.json: no instance variable")
    check(len(exprs) >= 20, "endure.json: only %d expressions" % len(exprs))
    used = set()
    for where, expr in exprs:
        names = metric_names_in(expr)
        check(names, "endure.json %s: no metric in %r" % (where, expr))
        unknown = names - allowed
        check(not unknown, "endure.json %s: %s not in docs/monitoring.md (%r)" % (where, sorted(unknown), expr))
        used |= names
    for v in variables.values():
        for name in re.findall(r"\bendure_\w+", json.dumps(v.get("query", ""))):
            check(name in allowed, "endure.json variable %s: %s not in docs/monitoring.md" % (v["name"], name))
    # Each expression parses: promtool checks them as recording rules.
    rules = os.path.join(tmp, "dashboard_rules.yml")
    with open(rules, "w") as f:
        f.write("groups:\n  - name: dashboard\n    rules:\n")
        for i, (_, expr) in enumerate(exprs):
            f.write("      - record: dashboard:expr_%d\n        expr: %s\n" % (i, json.dumps(grafana_to_promql(expr))))
    promtool("check", "rules", rules)
    ok("endure.json: %d expressions parse, over %d metrics, all in docs/monitoring.md" % (len(exprs), len(used)))
    return exprs


def job_spec(train, state_dir):
    return """[job]
name = "promtest"
command = ["%s", "--steps", "%d", "--layers", "2", "--d-model", "64", "--context", "64",
           "--global-batch", "16", "--micro-batch", "8", "--threads", "1", "--log-every", "50",
           "--eval-batches", "1", "--sample-tokens", "16", "--data", "/usr/share/games/fortunes"]
nodes = 2
ranks_per_node = 1
state_dir = "%s"
[checkpoint]
every_steps = 5
# No durable checkpoint while the job runs (only the final step is persisted).
persist_every_steps = 100000
[recovery]
backoff_initial = "0s"
""" % (train, STEPS, state_dir) + hold_fault("hold-rank1", 1, KILL_STEP)


def incident_field(state, key):
    """report.json's incidents' `key`, once the job has written it."""
    try:
        return [i.get(key) for i in json.load(open(os.path.join(state, "report.json")))["incidents"]]
    except (OSError, ValueError, KeyError):
        return "(no report yet)"


def stop(proc, grace_s):
    """SIGTERM to the process group we started, then SIGKILL after grace_s."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def tail(path, lines=30):
    try:
        return "".join(open(path, errors="replace").readlines()[-lines:])
    except OSError:
        return "(none)"


def live_checks(endure, train, source, tmp, metrics, exprs):
    state = os.path.join(tmp, "state")
    spec = os.path.join(tmp, "job.toml")
    with open(spec, "w") as f:
        f.write(job_spec(train, state))
    rules = os.path.join(tmp, "alerts.yml")
    with open(rules, "w") as f:
        f.write(test_sized_rules(os.path.join(source, "deploy", "prometheus", "alerts.yml")))

    job = prom = None
    job_log, prom_log = os.path.join(tmp, "job.log"), os.path.join(tmp, "prometheus.log")
    try:
        job = subprocess.Popen([endure, "run", spec, "--quiet"], cwd=tmp, stdout=open(job_log, "w"),
                               stderr=subprocess.STDOUT, start_new_session=True)
        alive = lambda: job.poll() is None
        addr_file = os.path.join(state, "http.addr")
        wait_for("STATE_DIR/http.addr", lambda: os.path.exists(addr_file) and open(addr_file).read().strip(),
                 60, alive=alive)
        target = open(addr_file).read().strip()

        port = free_port()
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write("""# Generated by tests/prometheus_test.py: the job's controller, every second.
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - alerts.yml
scrape_configs:
  - job_name: endure
    static_configs:
      - targets: ["%s"]
""" % target)
        promtool("check", "config", config)
        ok("promtool check config on the generated config (scraping %s)" % target)
        prom = subprocess.Popen([PROMETHEUS, "--config.file=" + config,
                                 "--storage.tsdb.path=" + os.path.join(tmp, "tsdb"),
                                 "--web.listen-address=127.0.0.1:%d" % port, "--log.level=warn"],
                                cwd=tmp, stdout=open(prom_log, "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        api = Prometheus("http://127.0.0.1:%d" % port)

        def ready():
            check(prom.poll() is None, "prometheus exited:\n" + tail(prom_log))
            try:
                with urllib.request.urlopen(api.base + "/-/ready", timeout=2) as r:
                    return r.status == 200
            except (urllib.error.URLError, OSError):
                return False
        wait_for("Prometheus ready", ready, 60)

        # The first scrape: the job's build, and no incident yet.
        build = wait_for("a scrape with endure_build_info", lambda: api.query("endure_build_info"), 60,
                         alive=alive)
        incidents_before = api.scalar("sum(endure_incidents_total)")
        step_before = api.scalar("endure_step")
        check(len(build) == 1 and build[0][1] == 1 and build[0][0].get("version"),
              "endure_build_info: %s" % build)
        check(step_before is None or step_before < KILL_STEP,
              "the job was at step %s at Prometheus' first scrape, past the kill (step %d): raise KILL_STEP"
              % (step_before, KILL_STEP))
        check(incidents_before in (None, 0.0), "sum(endure_incidents_total) before the kill: %s" % incidents_before)
        ok("endure_build_info %s; before the kill (step %s) sum(endure_incidents_total) = %s"
           % (build[0][0], step_before, incidents_before))

        # The durable checkpoint alert fires while the job runs.
        firing = wait_for("EndureNoDurableCheckpoint firing",
                          lambda: api.query('ALERTS{alertname="EndureNoDurableCheckpoint",alertstate="firing"}'),
                          60, alive=alive)
        check(alive(), "the job ended before the alert was seen")
        age = api.scalar("endure_durable_checkpoint_age_seconds")
        durable = api.scalar("endure_durable_checkpoint_step")
        check(age is not None and age > AGE_THRESHOLD_S, "endure_durable_checkpoint_age_seconds = %s" % age)
        check(durable == -1, "endure_durable_checkpoint_step = %s, expected -1 (none)" % durable)
        ok("EndureNoDurableCheckpoint firing %s while the job runs (age %.1f s, durable step %s)"
           % (firing[0][0].get("instance"), age, durable))

        # The kill: one incident, and its recovery.
        pid = wait_for("rank 1 held in step %d" % KILL_STEP,
                       lambda: held_rank_pid(state, 1, KILL_STEP), 120, alive=alive)
        os.kill(pid, signal.SIGKILL)
        wait_for("sum(endure_incidents_total) >= 1",
                 lambda: (api.scalar("sum(endure_incidents_total)") or 0) >= 1, 120, alive=alive)
        counted = {q: None for q in ("endure_restarts_total", "endure_detection_seconds_count",
                                     "endure_recovery_seconds_count")}
        def recovered():
            counted.update((q, api.scalar("sum(%s)" % q)) for q in counted)
            return all((v or 0) >= 1 for v in counted.values())
        try:
            wait_for("the restart, detection and recovery counted", recovered, 60, alive=alive)
        except Failure as e:
            raise Failure("%s (last seen: %s; report.json's recovered_after_s: %s)" % (e, ", ".join(
                "sum(%s) = %s" % kv for kv in counted.items()), incident_field(state, "recovered_after_s")))
        incidents = [(m, v) for m, v in api.query("endure_incidents_total") if v > 0]
        check(len(incidents) == 1 and incidents[0][1] == 1,
              "endure_incidents_total after the kill: %s, expected one series at 1" % incidents)
        cause = incidents[0][0].get("cause", "")
        check(cause, "endure_incidents_total has no cause label: %s" % incidents)
        # What an alert or a dashboard computes: increase() sees the kill only
        # when the cause's series was there (at 0) before it; a series born
        # at 1 has no increase (Prometheus' "avoid missing metrics").
        seen = api.query('sum by (cause) (increase(endure_incidents_total[10m])) > 0.5')
        check(len(seen) == 1 and seen[0][0].get("cause") == cause and round(seen[0][1]) == 1,
              "increase(endure_incidents_total[10m]) by cause: %s, expected %r at 1; its series' lowest "
              "value in the run: %s (1: it was not exported at 0 before the kill)" % (seen, cause, api.scalar(
                  'min_over_time(endure_incidents_total{cause=%s}[10m])' % json.dumps(cause))))
        restarts = [(m, v) for m, v in api.query("endure_restarts_total") if v > 0]
        check(len(restarts) == 1 and restarts[0][1] == 1
              and restarts[0][0].get("route") in ("in_process", "spare", "shrink", "full_restart"),
              "endure_restarts_total after the kill: %s" % restarts)
        for h in ("endure_detection_seconds", "endure_recovery_seconds"):
            count = api.scalar("sum(%s_count)" % h)
            inf = api.scalar('sum(%s_bucket{le="+Inf"})' % h)
            total = api.scalar("sum(%s_sum)" % h)
            check(count == 1 and inf == 1 and total is not None and total >= 0,
                  "%s: count %s, +Inf bucket %s, sum %s; expected one observation" % (h, count, inf, total))
        ok("after the kill: endure_incidents_total{cause=%r} = 1, endure_restarts_total{route=%r} = 1, "
           "one detection and one recovery observed" % (cause, restarts[0][0]["route"]))

        # ETTR: samples, in [0, 1].
        ettr = api.query("endure_ettr")
        samples = api.scalar("count_over_time(endure_ettr[10m])")
        check(len(ettr) == 1 and 0 <= ettr[0][1] <= 1 and samples and samples >= 2,
              "endure_ettr: %s, %s samples" % (ettr, samples))
        ok("endure_ettr = %.3f, %d samples" % (ettr[0][1], samples))

        # Names and types, as Prometheus scraped them.
        meta = api.get("/api/v1/metadata")
        wrong = []
        for name, kind in sorted(metrics.items()):
            got = sorted({m["type"] for m in meta.get(name, [])})
            if got != [kind]:
                wrong.append("%s: %s, not %s" % (name, got or "absent", kind))
        check(not wrong, "scraped metadata differs from docs/monitoring.md:\n  " + "\n  ".join(wrong))
        ok("all %d metrics of docs/monitoring.md scraped with their types" % len(metrics))

        # Counters never went down (no controller restart in this run).
        for name in sorted(series_names({n: k for n, k in metrics.items() if k != "gauge"})):
            n = api.scalar("max(resets(%s[10m]))" % name)
            check(not n, "%s went down %s time(s) during the run" % (name, n))
        ok("no counter went down")

        # Every dashboard expression runs on the server; note the empty ones.
        empty = []
        for where, expr in exprs:
            data = api.get("/api/v1/query", query=grafana_to_promql(expr))
            if not data["result"]:
                empty.append(where)
        ok("the server runs all %d dashboard expressions (%d with no data in this job: %s)"
           % (len(exprs), len(empty), "; ".join(empty) or "none"))

        # The job completes; report.json's one incident is the series' cause.
        wait_for("the job's end", lambda: job.poll() is not None, 240)
        check(job.returncode == 0, "endure run exited %s" % job.returncode)
        report = json.load(open(os.path.join(state, "report.json")))
        causes = [i.get("cause") for i in report.get("incidents", [])]
        # The label folds a family into one value (docs/monitoring.md):
        # "signal 9 SIGKILL" is signal_sigkill, "worker_exit code 3" worker_exit.
        labels = [cause_label(c) for c in causes]
        check(labels == [cause], "report.json incidents' causes %s (labels %s), the metric's %r"
              % (causes, labels, cause))
        ok("the job completed; report.json's incident cause %r is the metric's %r" % (causes[0], cause))
    except Failure:
        print("== job.log\n" + tail(job_log) + "== prometheus.log\n" + tail(prom_log), file=sys.stderr)
        raise
    finally:
        stop(job, 15)
        stop(prom, 10)


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    endure, train, source = (os.path.abspath(a) for a in sys.argv[1:4])
    for tool in (PROMETHEUS, PROMTOOL):
        if not os.access(tool, os.X_OK):
            print("SKIP: %s is missing (Debian's prometheus package)" % tool)
            return 77
    tmp = tempfile.mkdtemp(prefix="endure-prometheus-test-")
    try:
        metrics = contract_metrics(source)
        exprs = offline_checks(source, tmp, metrics)
        live_checks(endure, train, source, tmp, metrics, exprs)
    except Failure as e:
        print("FAIL: %s\n(kept %s)" % (e, tmp), file=sys.stderr)
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
