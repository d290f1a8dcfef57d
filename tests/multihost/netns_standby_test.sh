#!/usr/bin/env bash
# Multi-host, standby controllers: etcd (host e), two controllers (hosts c0,
# c1) and two agents (hosts h0, h1) each in a network namespace of its own,
# with mutual TLS (one controller certificate, valid for both controllers'
# addresses). Both controllers run the same spec on one state directory
# (the same path on both hosts, as a shared mount would be) with a 2 s
# leadership lease in etcd; the agents list both. Once the job trains
# (step 10), the leader, found from its log, is killed (SIGKILL). The
# standby must take over and have both agents attached within the lease and
# 3 s, carrying on the same run: the job completes with no incident, in its
# first generation (no worker restarted), with the parameters of the same job
# run without faults on one machine, and the new leader exits 0.
#
# Usage: netns_standby_test.sh ENDURE_BIN ENDURE_TRAIN_BIN
# Needs root, iproute2 and /usr/bin/etcd (Debian's etcd-server); exits 77
# (ctest: skipped) where it cannot.
set -euo pipefail

endure=$1
train=$2
# shellcheck source=netns_lib.sh
source "$(dirname "$0")/netns_lib.sh"
[ -x /usr/bin/etcd ] || skip "/usr/bin/etcd is missing: install Debian's etcd-server"
netns_setup e c0 c1 h0 h1
lease=2
port=7460  # each controller on a host of its own: the same port on both

steps=150
checkpoint='[checkpoint]
every_steps = 10'
reference_run "$steps" "$checkpoint"

spec standby "$work/hosts" "$steps" "$checkpoint" >"$work/hosts.toml"
mkdir -p "$work/hosts"
tls_and_token node0,node1 "$(netns_addr 1)" "$(netns_addr 2)"
netns_etcd 0

controllers=()
addresses=()
for c in 0 1; do
  addresses+=("$(netns_addr $((c + 1))):$port")
  netns_start $((c + 1)) "$work/controller$c.log" "$work" "$endure" controller \
    --spec "$work/hosts.toml" --state-dir "$work/hosts" --listen "${addresses[$c]}" \
    --etcd "$etcd_endpoint" --lease "${lease}s" --tls-dir "$work/tls" --token-file "$work/token"
  controllers+=("$started")
done
# One leads, the other stands by (their race to the leader key decides).
await_log "$work/controller0.log" "leading job 'standby'|standing by for job 'standby'"
await_log "$work/controller1.log" "leading job 'standby'|standing by for job 'standby'"
leader=-1
for c in 0 1; do
  if grep -q "leading job 'standby' on ${addresses[$c]} " "$work/controller$c.log"; then
    [ "$leader" = -1 ] || { show controller0.log controller1.log; echo "FAIL: both controllers lead"; exit 1; }
    leader=$c
  fi
done
[ "$leader" != -1 ] || { show controller0.log controller1.log; echo "FAIL: no controller leads"; exit 1; }
standby=$((1 - leader))
grep -q "standing by for job 'standby' (the leader is ${addresses[$leader]})" \
  "$work/controller$standby.log" ||
  { show controller0.log controller1.log; echo "FAIL: controller$standby does not stand by for controller$leader"; exit 1; }

for i in 0 1; do
  netns_start $((i + 3)) "$work/agent$i.log" "$work" "$endure" agent \
    --controller "${addresses[0]},${addresses[1]}" --node-id "node$i" --host "$(netns_addr $((i + 3)))" \
    --tls-dir "$work/tls" --token-file "$work/token" --work-dir "$work/hosts/nodes/node$i" \
    --controller-grace 60s
done

await_step "$work/hosts" 10
reattached='reconnected to the controller after'
if grep -q "$reattached" "$work/agent0.log" "$work/agent1.log"; then
  show agent0.log agent1.log
  echo "FAIL: an agent lost its controller before the leader was killed"
  exit 1
fi
killed_at_step=$(status_step)
kill -KILL "${controllers[$leader]}"
killed=$(date +%s.%N)
# Until both agents are attached to the standby (each says so once the new
# leader accepted its resuming registration).
deadline=$((SECONDS + 30))
until grep -q "$reattached" "$work/agent0.log" && grep -q "$reattached" "$work/agent1.log"; do
  [ $SECONDS -lt $deadline ] ||
    { show controller$standby.log agent0.log agent1.log; echo "FAIL: the agents did not move to controller$standby"; exit 1; }
  sleep 0.05
done
attached=$(date +%s.%N)
takeover=$(/usr/bin/python3 -c 'import sys; print("%.2f" % (float(sys.argv[2]) - float(sys.argv[1])))' "$killed" "$attached")
echo "killed the leader controller$leader at step $killed_at_step; both agents attached to controller$standby after ${takeover}s"

await_exit "${controllers[$standby]}" 200
[ "$code" = 0 ] ||
  { show controller$standby.log agent0.log agent1.log; echo "FAIL: controller$standby exited with $code"; exit 1; }

PYTHONPATH=$(dirname "$0") /usr/bin/python3 - "$work" "$reference" "$standby" "${addresses[$standby]}" "$takeover" "$lease" <<'PY' || { show controller0.log controller1.log agent0.log agent1.log; exit 1; }
import os, re, sys
import netns_checks
work, reference, standby, address = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
takeover, lease = float(sys.argv[5]), float(sys.argv[6])
report = netns_checks.report(work)
fail = netns_checks.completed_bit_exact(report, reference)
if report.get("run") != 1:
    fail.append("expected run 1, got %s" % report.get("run"))
fail += netns_checks.no_incident_no_restart(report, work)
if takeover > lease + 3:
    fail.append("takeover took %.2f s, more than the lease (%g s) and 3 s" % (takeover, lease))
# The standby led on its own address, then carried the killed leader's run on.
log = open(os.path.join(work, "controller%s.log" % standby)).read()
led = re.search(r"leading job 'standby' on %s after ([0-9.]+)s" % re.escape(address), log)
if not led:
    fail.append("controller%s never says it leads on %s" % (standby, address))
if "carrying on run 1" not in log:
    fail.append("controller%s did not carry on run 1" % standby)
for i in (0, 1):
    if "node%d came back resuming generation 0" % i not in log:
        fail.append("node%d did not resume generation 0 on controller%s" % (i, standby))
# Each agent's own measure of its outage.
moved = []
for i in (0, 1):
    m = re.search(r"reconnected to the controller after ([0-9.]+)(ms|s)",
                  open(os.path.join(work, "agent%d.log" % i)).read())
    moved.append(float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0))
    if moved[-1] > lease + 3:
        fail.append("node%d was away from a controller for %.2f s" % (i, moved[-1]))
if fail:
    print("FAIL: " + "; ".join(fail))
    sys.exit(1)
print("ok: standby took over in %.2f s (lease %g s; agents away %.2f s, %.2f s), carried on run 1, "
      "completed with no incident, 1 generation, fingerprint %s" %
      (takeover, lease, moved[0], moved[1], reference))
PY
