"""The deployment recipes in docs/deploy/ against the `endure` they deploy.

docs/deploy/slurm.sbatch must be valid bash, and docs/deploy/kubernetes.yaml
valid YAML of the objects it says; every `endure VERB` they run may use only
flags that `endure VERB --help` lists, and must pass the ones it marks
REQUIRED; beyond loopback every process gets --tls-dir, and the Kubernetes
secrets that hold keys are mounted 0400.

Usage: deploy_docs_test.py ENDURE_BIN DOCS_DIR
"""
import re
import shlex
import subprocess
import sys
import unittest

import yaml

ENDURE, DOCS = sys.argv[1], sys.argv[2]
del sys.argv[1:3]


def verb_flags(verb):
    """(every long flag of `endure VERB`, the REQUIRED ones)."""
    out = subprocess.run([ENDURE, verb, "--help"], capture_output=True, text=True, check=True).stdout
    flags, required = set(), set()
    for line in out.splitlines():
        m = re.match(r"\s+(?:-\w,)?(--[a-z][a-z0-9-]*)", line)
        if m:
            flags.add(m.group(1))
            if "REQUIRED" in line:
                required.add(m.group(1))
    return flags, required


class Recipe(unittest.TestCase):
    def check_invocation(self, where, words):
        """`words` = ["endure", VERB, args...] as the recipe runs it."""
        self.assertEqual(words[0], "endure", where)
        verb = words[1]
        known, required = verb_flags(verb)
        self.assertTrue(known, f"{where}: `endure {verb}` is not a verb")
        used = {w.split("=", 1)[0] for w in words[2:] if w.startswith("--")}
        self.assertFalse(used - known, f"{where}: `endure {verb}` has no {sorted(used - known)}")
        self.assertFalse(required - used, f"{where}: `endure {verb}` needs {sorted(required - used)}")
        if verb in ("controller", "agent"):
            self.assertIn("--tls-dir", used, f"{where}: beyond loopback {verb} needs --tls-dir")
        return used


class SlurmRecipe(Recipe):
    path = f"{DOCS}/deploy/slurm.sbatch"

    def test_is_valid_bash(self):
        subprocess.run(["bash", "-n", self.path], check=True)

    def test_every_endure_call_uses_real_flags(self):
        with open(self.path) as f:
            text = f.read()
        # Join continued lines; the agent's command is a quoted bash -c script.
        joined = re.sub(r"\\\n\s*", " ", text)
        verbs = []
        for line in joined.splitlines():
            line = line.strip()
            m = re.search(r"(?:^|exec |&& )(endure [a-z]+ .*)", line)
            if not m or line.startswith("#"):
                continue
            words = shlex.split(m.group(1).rstrip("&").replace("$(", "X(").replace("\"", ""),
                                posix=True)
            words = [w for w in words if not w.startswith("X(")]
            verbs.append(words[1])
            self.check_invocation(self.path, words)
        self.assertEqual(sorted(set(verbs)), ["agent", "certs", "controller"])


class KubernetesRecipe(Recipe):
    path = f"{DOCS}/deploy/kubernetes.yaml"

    def setUp(self):
        with open(self.path) as f:
            self.docs = [d for d in yaml.safe_load_all(f) if d]

    def containers(self):
        for d in self.docs:
            spec = d.get("spec", {}).get("template", {}).get("spec")
            if spec:
                yield d, spec

    def test_has_the_objects_it_describes(self):
        kinds = sorted(d["kind"] for d in self.docs)
        self.assertEqual(kinds, ["DaemonSet", "Deployment", "Namespace", "Service"])

    def test_every_endure_container_uses_real_flags(self):
        verbs = {}
        for d, spec in self.containers():
            for c in spec["containers"]:
                words = list(c["command"]) + [str(a) for a in c.get("args", [])]
                verbs[words[1]] = (d, spec, words, self.check_invocation(d["metadata"]["name"], words))
        self.assertEqual(sorted(verbs), ["agent", "controller"])
        # The agents reach the controller through its Service, at the port it listens on.
        _, _, agent, _ = verbs["agent"]
        _, _, controller, _ = verbs["controller"]
        service = next(d for d in self.docs if d["kind"] == "Service")
        target = agent[agent.index("--controller") + 1]
        host, port = target.rsplit(":", 1)
        self.assertTrue(host.startswith(service["metadata"]["name"] + "."), target)
        ports = {p["port"]: p["targetPort"] for p in service["spec"]["ports"]}
        listen = controller[controller.index("--listen") + 1]
        self.assertEqual(ports.get(int(port)), int(listen.rsplit(":", 1)[1]))

    def test_keys_are_mounted_for_their_owner_only(self):
        for d, spec in self.containers():
            for v in spec.get("volumes", []):
                if "secret" in v:
                    self.assertEqual(v["secret"].get("defaultMode"), 0o400,
                                     f"{d['metadata']['name']}: secret volume {v['name']}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
