#!/usr/bin/env bash
# Multi-host, the controller's host cut off: the controller and two agents
# each in a network namespace of its own, with mutual TLS. While the job
# trains, the controller's link (its veth) goes down for 5 s, well within
# the agents' controller grace and the heartbeat timeout, and comes back.
# The workers never need the controller to train: the job must complete
# with no incident, in its first generation (no worker restarted), with the
# parameters of the same job run without faults on one machine. As in every
# namespace test, the rendezvous port is one rank 0's host reported free.
#
# Usage: netns_controller_cut_test.sh ENDURE_BIN ENDURE_TRAIN_BIN
# Needs root and iproute2; exits 77 (ctest: skipped) where it cannot.
set -euo pipefail

endure=$1
train=$2
# shellcheck source=netns_lib.sh
source "$(dirname "$0")/netns_lib.sh"
netns_setup c h0 h1
controller_ip=$(netns_addr 0)

steps=150
checkpoint='[checkpoint]
every_steps = 10
[detection]
heartbeat_timeout = "30s"'
reference_run "$steps" "$checkpoint"

spec hosts "$work/hosts" "$steps" "$checkpoint" >"$work/hosts.toml"
mkdir -p "$work/hosts"
tls_and_token node0,node1 "$controller_ip"
netns_start 0 "$work/controller.log" "$work" "$endure" controller --spec "$work/hosts.toml" \
  --listen "$controller_ip:0" --tls-dir "$work/tls" --token-file "$work/token" \
  --address-file "$work/controller.addr"
controller=$started
await_file "$work/controller.addr" "$work/controller.log"
address=$(cat "$work/controller.addr")
for i in 0 1; do
  netns_start $((i + 1)) "$work/agent$i.log" "$work" "$endure" agent --controller "$address" \
    --node-id "node$i" --host "$(netns_addr $((i + 1)))" --tls-dir "$work/tls" \
    --token-file "$work/token" --work-dir "$work/hosts/nodes/node$i" --controller-grace 60s
done

await_step "$work/hosts" 10
netns_link 0 down
cut_at=$(status_step)
sleep 5
netns_link 0 up
echo "cut the controller off at step $cut_at for 5 s"

await_exit "$controller" 200
[ "$code" = 0 ] || { show controller.log agent0.log agent1.log; echo "FAIL: the controller exited with $code"; exit 1; }

PYTHONPATH=$(dirname "$0") /usr/bin/python3 - "$work" "$reference" "$net" "$steps" <<'PY' || { show controller.log agent0.log agent1.log; exit 1; }
import os, re, sys
import netns_checks
work, reference, net, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
report = netns_checks.report(work)
fail = netns_checks.completed_bit_exact(report, reference)
# The steps went on while the controller was cut off: the workers' logs
# run to the end without a second launch.
fail += netns_checks.no_incident_no_restart(report, work)
# Which node runs which rank follows the order the agents registered in.
logs = netns_checks.worker_logs(work)
rank0 = [p.split(os.sep)[-3] for p in logs if p.endswith("gen0-rank0.log")]
lines = re.findall(r"generation (\d+): rendezvous at ([0-9.]+):(\d+) \((.*)\)",
                   open(os.path.join(work, "controller.log")).read())
if (len(rank0) != 1 or len(lines) != 1 or
        lines[0][1] != "%s.%d" % (net, int(rank0[0][len("node"):]) + 2) or
        lines[0][3] != "free on the host of " + rank0[0]):
    fail.append("rendezvous: %s (rank 0 on %s)" % (lines, rank0))
if fail:
    print("FAIL: " + "; ".join(fail))
    sys.exit(1)
print("ok: completed through a 5 s cut of the controller, no incident, 1 generation, "
      "fingerprint %s, rendezvous %s:%s (%s)" % (reference, lines[0][1], lines[0][2], lines[0][3]))
PY
