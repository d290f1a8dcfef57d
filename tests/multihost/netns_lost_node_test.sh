#!/usr/bin/env bash
# Multi-host, a killed rank and a lost node: the controller (host c) and
# three agents (hosts h0, h1, h2; h2 a spare) each in a network namespace of
# its own, with mutual TLS. A job of two nodes has rank 1 killed at step 12;
# later node1's link is cut for good (its veth down), and once its
# heartbeats are overdue (3 s; no hang is judged while it is quiet, although
# the hang floor, 2 s, passes first) the spare takes its rank. The durable tier (T2) is
# one shared directory that each host mounts at a path of its own (a
# symlink under each host's --checkpoint-root; the spec names it relatively),
# and with no peer replicas the lost node's shard comes back from T2 on the
# spare's path. The job must complete with the parameters of the same job
# run without faults on one machine, with two incidents (the kill, the lost
# node); every rendezvous port must be one that rank 0's host reported free;
# no host may have resolved T2 under the directory it was started in.
#
#
# MODE (third argument):
#   tiers      [recovery] in_process = false: every recovery restarts from the
#              tiers, and the spare restores node1's shard from T2 (above);
#   in_process the default: the kill is recovered in process (rank 0 keeps
#              its state, rank 1 takes it over the new group) and the lost
#              node's rank moves to the spare in place (route spare), taking
#              the state from node0 across the namespaces; nothing restored
#              from the tiers, no step recomputed.
#
# Usage: netns_lost_node_test.sh ENDURE_BIN ENDURE_TRAIN_BIN [MODE]
# Needs root and iproute2; exits 77 (ctest: skipped) where it cannot.
set -euo pipefail

endure=$1
train=$2
mode=${3:-tiers}
case $mode in
  tiers) routes='in_process = false' ;;
  in_process) routes='' ;;
  *) echo "unknown mode '$mode' (tiers or in_process)" >&2; exit 2 ;;
esac
# shellcheck source=netns_lib.sh
source "$(dirname "$0")/netns_lib.sh"
netns_setup c h0 h1 h2
controller_ip=$(netns_addr 0)

steps=60
checkpoint="$routes
"'[checkpoint]
dir = "shared/ckpt"
every_steps = 5
replicas = 0
[detection]
heartbeat_timeout = "3s"'
# The reference runs where its state is: T2 under its own directory.
mkdir -p "$work/reference"
cd "$work/reference"
reference_run "$steps" "$checkpoint"
cd - >/dev/null

# One shared store, mounted at each host's own path.
mkdir -p "$work/store" "$work/ctl" "$work/cwd"
ln -s "$work/store" "$work/ctl/shared"
for h in 0 1 2; do
  mkdir -p "$work/root$h"
  ln -s "$work/store" "$work/root$h/shared"
done
spec hosts "$work/hosts" "$steps" "$checkpoint
[[faults]]
kind = \"kill\"
rank = 1
step = 12" >"$work/hosts.toml"
mkdir -p "$work/hosts"
tls_and_token node0,node1,node2 "$controller_ip"

netns_start 0 "$work/controller.log" "$work/ctl" "$endure" controller --spec "$work/hosts.toml" \
  --listen "$controller_ip:0" --tls-dir "$work/tls" --token-file "$work/token" \
  --address-file "$work/controller.addr"
controller=$started
await_file "$work/controller.addr" "$work/controller.log"
address=$(cat "$work/controller.addr")

start_agent() {  # start_agent I: node I on host h I (namespace I + 1)
  netns_start $(($1 + 1)) "$work/agent$1.log" "$work/cwd" "$endure" agent --controller "$address" \
    --node-id "node$1" --host "$(netns_addr $(($1 + 1)))" --tls-dir "$work/tls" \
    --token-file "$work/token" --work-dir "$work/hosts/nodes/node$1" \
    --checkpoint-root "$work/root$1"
}
start_agent 0
start_agent 1
# The spare registers once the job runs on node0 and node1.
await_step "$work/hosts" 1
start_agent 2

# Past the kill and its restart, with durable steps: node1's host drops
# off the network, workers and all.
await_step "$work/hosts" 27
netns_link 2 down
echo "cut node1's link at step $(status_step)"

await_exit "$controller" 200
[ "$code" = 0 ] || { show controller.log agent0.log agent1.log agent2.log; echo "FAIL: the controller exited with $code"; exit 1; }

PYTHONPATH=$(dirname "$0") /usr/bin/python3 - "$work" "$reference" "$net" "$mode" <<'PY' || { show controller.log agent0.log agent2.log; exit 1; }
import glob, json, os, re, sys
import netns_checks
work, reference, net, mode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
report = netns_checks.report(work)
fail = netns_checks.completed_bit_exact(report, reference)
causes = [i.get("cause", "") for i in report.get("incidents", [])]
if len(causes) != 2 or "SIGKILL" not in causes[0] or causes[1] != "node_lost":
    fail.append("expected the kill, then node_lost: " + json.dumps(report.get("incidents")))
if "node2" not in report.get("nodes", []):
    fail.append("the spare node2 never took part: " + json.dumps(report.get("nodes")))
# Every rendezvous on a port rank 0's host reported free, at its address.
addresses = {"node%d" % i: "%s.%d" % (net, i + 2) for i in range(3)}
lines = re.findall(r"generation (\d+): rendezvous at ([0-9.]+):(\d+) \((.*)\)",
                   open(os.path.join(work, "controller.log")).read())
if len(lines) != report.get("generations"):
    fail.append("%d rendezvous lines for %s generations" % (len(lines), report.get("generations")))
for gen, addr, port, origin in lines:
    m = re.fullmatch(r"free on the host of (node\d)", origin)
    if not m or addresses[m.group(1)] != addr:
        fail.append("generation %s: rendezvous at %s:%s (%s)" % (gen, addr, port, origin))
routes = [i.get("route") for i in report.get("incidents", [])]
if mode == "in_process":
    # Both in place: the kill's rank and the lost node's took the state from
    # a peer; no restore plan went to the spare, nothing was recomputed.
    if routes != ["in_process", "spare"]:
        fail.append("expected the routes in_process, spare: " + json.dumps(routes))
    for i in report.get("incidents", []):
        if i.get("steps_lost") != 0 or not i.get("restore", "").startswith("in process"):
            fail.append("incident %s lost %s steps, restore %r" %
                        (i.get("id"), i.get("steps_lost"), i.get("restore")))
elif routes != ["full_restart", "full_restart"]:
    fail.append("expected two full restarts: " + json.dumps(routes))
# T2 under each agent's root: the spare restored node1's shard from there.
plans = sorted(glob.glob(os.path.join(work, "hosts", "nodes", "node2", "logs", "*.restore-plan.json")))
t2 = [s for p in plans for s in json.load(open(p))["sources"] if s["tier"] == "T2"]
if mode == "tiers" and not t2:
    fail.append("node2 restored nothing from T2: " + str(plans))
if mode == "in_process" and t2:
    fail.append("node2 restored from T2 although its peer held the state: " + str(t2))
for s in t2:
    if not s["path"].startswith(os.path.join(work, "root2", "shared", "ckpt") + "/"):
        fail.append("node2's T2 source is not under its checkpoint root: " + s["path"])
if os.listdir(os.path.join(work, "cwd")):
    fail.append("something resolved under the agents' working directory: " +
                str(os.listdir(os.path.join(work, "cwd"))))
if not glob.glob(os.path.join(work, "store", "ckpt", "step-*")):
    fail.append("no durable step in the shared store")
if fail:
    print("FAIL: " + "; ".join(fail))
    sys.exit(1)
print("ok (%s): completed across 4 namespaces, fingerprint %s, incidents %s, routes %s, "
      "rendezvous %s, %s" % (mode, reference, causes, routes,
      ", ".join("g%s %s:%s" % l[:3] for l in lines),
      "T2 restore on node2 from " + t2[0]["path"] if t2 else "no tier read"))
PY
