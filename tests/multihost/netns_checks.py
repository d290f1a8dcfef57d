"""Checks on a job's outcome shared by the network-namespace tests.

Each returns a list of failures (empty: the check holds), so that a test
reports every one it finds. The tests run their Python with PYTHONPATH set
to this directory.
"""
import glob
import json
import os


def report(work):
    """The job's report.json (the controller's state directory is work/hosts)."""
    with open(os.path.join(work, "hosts", "report.json")) as f:
        return json.load(f)


def completed_bit_exact(report, reference):
    """The job completed with the parameters of the failure-free reference run."""
    fail = []
    if not report.get("completed"):
        fail.append("the job did not complete: " + str(report.get("verdict")))
    if report.get("param_fingerprint") != reference:
        fail.append("fingerprint %s, reference %s" % (report.get("param_fingerprint"), reference))
    return fail


def worker_logs(work):
    """Every worker log of every node, as paths."""
    return sorted(glob.glob(os.path.join(work, "hosts", "nodes", "node*", "logs",
                                         "gen*-rank*.log")))


def no_incident_no_restart(report, work):
    """No incident, one generation, and each rank's only worker log of generation 0."""
    fail = []
    if report.get("incidents"):
        fail.append("expected no incident: " + json.dumps(report.get("incidents")))
    if report.get("generations") != 1:
        fail.append("expected one generation (no worker restarted), got %s" %
                    report.get("generations"))
    logs = worker_logs(work)
    if sorted(os.path.basename(p) for p in logs) != ["gen0-rank0.log", "gen0-rank1.log"]:
        fail.append("workers launched: " + str(logs))
    return fail
