#!/usr/bin/python3
"""Structural check of the Kubernetes manifests in deploy/k8s/.

Debian 12 packages no offline schema validator (no kubeconform or kubeval;
its kubectl validates only against a running API server), so this checks what
would break the deployment, with python3-yaml:

- every document: apiVersion and kind known together, metadata.name a DNS
  name, unique per kind;
- Deployment and StatefulSet: the selector non-empty and matching the pod
  template's labels, replicas, containers with a name, the expected image and
  a command; ports named and in range; a liveness probe (httpGet /healthz:
  the process answers) and a readiness probe (httpGet /readyz: able to serve)
  on a declared port; env entries with a string value or a
  valid fieldRef; volume mounts of declared volumes; secret volumes naming the
  Secret the manifests define, and the token file inside such a mount under a
  key that Secret has;
- StatefulSet: serviceName is a headless Service selecting its pods;
- Service: a selector that selects the pods of exactly one workload, and
  target ports those pods declare; the workers' TPUEMU_RESOLVER names the
  Service in front of the tpu-resolver pods, on one of its ports;
- the workers' shell command, run with a stub tpu-worker for every ordinal:
  pod N gets --host-id host(N/4) --core N%4, every (host, core) once;
- TPUEMU_* variables the daemons know (from their --help, when given).

  k8s_check.py [--known-env FILE] [--pending-env NAME,...] FILE...
  k8s_check.py --self-test DIR      mutate copies of DIR's files, expect each to fail
Exit 0 when every check passes, 1 otherwise.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

IMAGE = "tpuemu:latest"
KINDS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "Service": "v1", "Secret": "v1"}
WORKLOADS = ("Deployment", "StatefulSet")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
FIELD_PATHS = {"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
               "spec.serviceAccountName", "status.hostIP", "status.podIP", "status.podIPs"}
CORES_PER_HOST = 4


class Checker:
    def __init__(self, known_env=None, pending_env=()):
        self.errors = []
        self.notes = []
        self.known_env = known_env
        self.pending_env = set(pending_env)

    def err(self, where, msg):
        self.errors.append(f"{where}: {msg}")

    def load(self, paths):
        docs = []
        for p in paths:
            try:
                with open(p) as f:
                    for i, d in enumerate(yaml.safe_load_all(f)):
                        if d is None:
                            continue
                        if not isinstance(d, dict):
                            self.err(f"{p} document {i + 1}", "not a mapping")
                            continue
                        docs.append((f"{os.path.basename(p)}", d))
            except yaml.YAMLError as e:
                self.err(p, f"not valid YAML: {e}")
        return docs

    def run(self, paths):
        docs = self.load(paths)
        objs = {}
        for src, d in docs:
            kind, api = d.get("kind"), d.get("apiVersion")
            name = (d.get("metadata") or {}).get("name")
            where = f"{src}: {kind or '?'}/{name or '?'}"
            if kind not in KINDS:
                self.err(where, f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
                continue
            if api != KINDS[kind]:
                self.err(where, f"apiVersion {api!r}, expected {KINDS[kind]!r}")
            if not isinstance(name, str) or not DNS_SUBDOMAIN.match(name) or len(name) > 63:
                self.err(where, "metadata.name missing or not a DNS name")
                continue
            if (kind, name) in objs:
                self.err(where, "defined twice")
            objs[(kind, name)] = (where, d)
        self.objs = objs
        secrets = {n: d for (k, n), (_, d) in objs.items() if k == "Secret"}
        for (kind, name), (where, d) in objs.items():
            if kind == "Secret":
                self.check_secret(where, d)
        for (kind, name), (where, d) in objs.items():
            if kind in WORKLOADS:
                self.check_workload(where, kind, d, secrets)
        for (kind, name), (where, d) in objs.items():
            if kind == "Service":
                self.check_service(where, d)
        for (kind, name), (where, d) in objs.items():
            if kind == "StatefulSet":
                self.check_statefulset(where, d)
        self.check_resolver_address()
        if not any(k == "Secret" for k, _ in objs):
            self.err("manifests", "no Secret defines the cluster token")
        return not self.errors

    # ---- kinds

    def check_secret(self, where, d):
        keys = set((d.get("stringData") or {}).keys()) | set((d.get("data") or {}).keys())
        if not keys:
            self.err(where, "no data or stringData")
        if d.get("type", "Opaque") != "Opaque":
            self.err(where, f"type {d.get('type')!r}, expected Opaque")

    def pod_labels(self, d):
        return ((d.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}

    def containers(self, d):
        return (((d.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []

    def check_workload(self, where, kind, d, secrets):
        spec = d.get("spec") or {}
        sel = (spec.get("selector") or {}).get("matchLabels")
        labels = self.pod_labels(d)
        if not isinstance(sel, dict) or not sel:
            self.err(where, "spec.selector.matchLabels missing or empty")
        elif any(labels.get(k) != v for k, v in sel.items()):
            self.err(where, f"selector {sel} does not match the pod template's labels {labels}")
        if not isinstance(spec.get("replicas"), int) or spec["replicas"] < 1:
            self.err(where, "spec.replicas missing or < 1")
        if kind == "Deployment":
            st = (spec.get("strategy") or {}).get("type", "RollingUpdate")
            if st not in ("Recreate", "RollingUpdate"):
                self.err(where, f"strategy {st!r}")
        pod = (spec.get("template") or {}).get("spec") or {}
        volumes = {v.get("name"): v for v in pod.get("volumes") or []}
        cs = self.containers(d)
        if not cs:
            self.err(where, "no containers")
        for c in cs:
            self.check_container(f"{where} container {c.get('name', '?')}", c, volumes, secrets)
        for vname, v in volumes.items():
            if "secret" in v:
                sn = v["secret"].get("secretName")
                if sn not in secrets:
                    self.err(where, f"volume {vname} mounts Secret {sn!r}, which no manifest defines")

    def check_container(self, where, c, volumes, secrets):
        if not isinstance(c.get("name"), str) or not DNS_LABEL.match(c["name"]):
            self.err(where, "name missing or not a DNS label")
        if c.get("image") != IMAGE:
            self.err(where, f"image {c.get('image')!r}, expected {IMAGE!r}")
        cmd = c.get("command")
        if not isinstance(cmd, list) or not cmd or not all(isinstance(x, str) for x in cmd):
            self.err(where, "command missing or not a list of strings")
        ports = c.get("ports") or []
        names, numbers = set(), set()
        for p in ports:
            n, num = p.get("name"), p.get("containerPort")
            if not isinstance(num, int) or not 1 <= num <= 65535:
                self.err(where, f"port {n!r}: containerPort {num!r} is not a port number")
            if not isinstance(n, str) or len(n) > 15 or not DNS_LABEL.match(n) or n in names:
                self.err(where, f"port name {n!r} missing, too long or repeated")
            names.add(n)
            numbers.add(num)
        # liveness must not depend on anything outside the process (a resolver
        # outage would get every worker restarted); readiness does
        for probe, want in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            pr = c.get(probe)
            if not isinstance(pr, dict) or "httpGet" not in pr:
                self.err(where, f"no {probe} with httpGet")
                continue
            hg = pr["httpGet"]
            if hg.get("path") != want:
                self.err(where, f"{probe} path {hg.get('path')!r}, expected {want}")
            port = hg.get("port")
            if not ((isinstance(port, str) and port in names) or (isinstance(port, int) and port in numbers)):
                self.err(where, f"{probe} port {port!r} is not a port the container declares ({sorted(names)})")
        env = {}
        for e in c.get("env") or []:
            n = e.get("name")
            if not isinstance(n, str) or not n:
                self.err(where, "env entry without a name")
                continue
            if ("value" in e) == ("valueFrom" in e):
                self.err(where, f"env {n}: exactly one of value and valueFrom")
            elif "value" in e:
                if not isinstance(e["value"], str):
                    self.err(where, f"env {n}: value {e['value']!r} must be a string (quote it)")
                env[n] = e["value"]
            else:
                fp = ((e["valueFrom"] or {}).get("fieldRef") or {}).get("fieldPath")
                if fp not in FIELD_PATHS and not (isinstance(fp, str) and fp.startswith("metadata.labels['")):
                    self.err(where, f"env {n}: fieldRef {fp!r} is not a downward-API field")
                env[n] = None
            if n.startswith("TPUEMU_") and self.known_env is not None and n not in self.known_env:
                if n in self.pending_env:
                    self.notes.append(f"{n} ({where}): not known to this build's daemons; its interface is taken as given")
                else:
                    self.err(where, f"env {n}: no daemon reads this variable")
        c["_env"] = env
        mounts = {}
        for m in c.get("volumeMounts") or []:
            if m.get("name") not in volumes:
                self.err(where, f"volumeMount {m.get('name')!r} names no volume of the pod")
            elif not str(m.get("mountPath", "")).startswith("/"):
                self.err(where, f"volumeMount {m.get('name')!r}: mountPath not absolute")
            else:
                mounts[m["mountPath"].rstrip("/")] = volumes[m["name"]]
        tf = env.get("TPUEMU_TOKEN_FILE")
        if "TPUEMU_TOKEN_FILE" not in env:
            self.err(where, "no TPUEMU_TOKEN_FILE: a daemon on a pod network needs the cluster token")
        elif tf:
            d, key = os.path.split(tf)
            v = mounts.get(d)
            if not v or "secret" not in v:
                self.err(where, f"TPUEMU_TOKEN_FILE {tf} is not inside a mounted Secret volume")
            else:
                s = secrets.get(v["secret"].get("secretName")) or {}
                items = v["secret"].get("items")
                keys = ({i.get("path") for i in items} if items else
                        set((s.get("stringData") or {}).keys()) | set((s.get("data") or {}).keys()))
                if key not in keys:
                    self.err(where, f"TPUEMU_TOKEN_FILE {tf}: the Secret has no key {key!r} ({sorted(keys)})")

    def selected(self, sel):
        return [(n, w, d) for (k, n), (w, d) in self.objs.items()
                if k in WORKLOADS and all(self.pod_labels(d).get(a) == b for a, b in sel.items())]

    def check_service(self, where, d):
        spec = d.get("spec") or {}
        sel = spec.get("selector")
        if not isinstance(sel, dict) or not sel:
            self.err(where, "spec.selector missing or empty")
            return
        hits = self.selected(sel)
        if len(hits) != 1:
            self.err(where, f"selector {sel} selects the pods of {len(hits)} workloads "
                     f"({', '.join(h[0] for h in hits) or 'none'}), expected exactly one")
            return
        cs = self.containers(hits[0][2])
        names = {p.get("name") for c in cs for p in c.get("ports") or []}
        numbers = {p.get("containerPort") for c in cs for p in c.get("ports") or []}
        ports = spec.get("ports") or []
        if not ports:
            self.err(where, "no ports")
        for p in ports:
            if not isinstance(p.get("port"), int) or not 1 <= p["port"] <= 65535:
                self.err(where, f"port {p.get('port')!r} is not a port number")
            tp = p.get("targetPort", p.get("port"))
            if not ((isinstance(tp, str) and tp in names) or (isinstance(tp, int) and tp in numbers)):
                self.err(where, f"targetPort {tp!r} is not a port the selected pods declare")

    def check_statefulset(self, where, d):
        spec = d.get("spec") or {}
        sn = spec.get("serviceName")
        svc = self.objs.get(("Service", sn))
        if not svc:
            self.err(where, f"serviceName {sn!r} is not a Service of the manifests")
        else:
            ss = svc[1].get("spec") or {}
            if ss.get("clusterIP") != "None":
                self.err(where, f"serviceName {sn!r} is not a headless Service (clusterIP: None)")
            labels = self.pod_labels(d)
            if not all(labels.get(a) == b for a, b in (ss.get("selector") or {}).items()) or not ss.get("selector"):
                self.err(where, f"Service {sn!r} does not select this StatefulSet's pods")
        self.check_ordinals(where, d)

    def check_ordinals(self, where, d):
        name = d["metadata"]["name"]
        replicas = (d.get("spec") or {}).get("replicas")
        for c in self.containers(d):
            cmd, args = c.get("command") or [], c.get("args") or []
            if cmd[:2] != ["/bin/sh", "-c"] or not args:
                self.err(where, "the worker command is not `/bin/sh -c SCRIPT` deriving host and core from the ordinal")
                continue
            if not isinstance(replicas, int) or replicas < 1:
                return
            seen = {}
            with tempfile.TemporaryDirectory() as tmp:
                stub = os.path.join(tmp, "tpu-worker")
                with open(stub, "w") as f:
                    f.write('#!/bin/sh\necho "$@"\n')
                os.chmod(stub, 0o755)
                for n in range(replicas):
                    env = {"PATH": f"{tmp}:/usr/bin:/bin", "POD_NAME": f"{name}-{n}"}
                    r = subprocess.run(["/bin/sh", "-c", args[0]], env=env, capture_output=True, text=True, timeout=10)
                    m = re.fullmatch(r".*--host-id (\S+) --core (\d+)\s*", r.stdout, re.S)
                    if r.returncode != 0 or not m:
                        self.err(where, f"pod {name}-{n}: the command ran {r.returncode} and gave {r.stdout.strip()!r} {r.stderr.strip()!r}")
                        return
                    host, core = m.group(1), int(m.group(2))
                    want = (f"host{n // CORES_PER_HOST}", n % CORES_PER_HOST)
                    if (host, core) != want:
                        self.err(where, f"pod {name}-{n} gets --host-id {host} --core {core}, expected {want[0]} {want[1]}")
                    if (host, core) in seen:
                        self.err(where, f"pods {seen[(host, core)]} and {name}-{n} are both {host}/{core}")
                    seen[(host, core)] = f"{name}-{n}"

    def check_resolver_address(self):
        for (k, n), (where, d) in self.objs.items():
            if k not in WORKLOADS:
                continue
            for c in self.containers(d):
                addr = (c.get("_env") or {}).get("TPUEMU_RESOLVER")
                if addr is None:
                    continue
                host, _, port = addr.rpartition(":")
                svc = self.objs.get(("Service", host))
                if not svc:
                    self.err(where, f"TPUEMU_RESOLVER {addr}: no Service {host!r}")
                    continue
                sp = svc[1].get("spec") or {}
                if not port.isdigit() or int(port) not in {p.get("port") for p in sp.get("ports") or []}:
                    self.err(where, f"TPUEMU_RESOLVER {addr}: Service {host} has no port {port}")
                hits = self.selected(sp.get("selector") or {}) if sp.get("selector") else []
                if not any("tpu-resolver" in (cc.get("command") or [])[:1] for h in hits for cc in self.containers(h[2])):
                    self.err(where, f"TPUEMU_RESOLVER {addr}: Service {host} does not select the tpu-resolver pods")


def manifest_files(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d)
                  if f.endswith((".yaml", ".yml", ".yaml.example")))


# Each mutation: (file, old, new, what it breaks); the self-test fails if a
# mutation does not apply (the manifests changed) or the check still passes.
MUTATIONS = [
    ("workers.yaml", "  selector:\n    matchLabels:\n      app.kubernetes.io/name: tpuemu\n      app.kubernetes.io/component: worker\n  template:",
     "  template:", "the StatefulSet without a selector"),
    ("resolver.yaml", "kind: Deployment", "kind: Deploymnet", "a misspelled kind"),
    ("resolver.yaml", "apiVersion: apps/v1", "apiVersion: v1", "a Deployment in the wrong API group"),
    ("resolver.yaml", "        app.kubernetes.io/component: resolver\n    spec:",
     "        app.kubernetes.io/component: resolvr\n    spec:", "pod labels the selector does not match"),
    ("resolver.yaml", "  selector:\n    app.kubernetes.io/name: tpuemu\n    app.kubernetes.io/component: resolver\n",
     "  selector:\n    app.kubernetes.io/name: tpuemu\n", "a Service selecting the pods of two workloads"),
    ("workers.yaml", "  serviceName: tpu-worker", "  serviceName: tpu-workers", "serviceName naming no Service"),
    ("workers.yaml", "  clusterIP: None\n", "", "the StatefulSet's Service not headless"),
    ("workers.yaml", "            secretName: tpuemu-token", "            secretName: tpuemu-tokens", "a Secret no manifest defines"),
    ("token-secret.yaml.example", "  token: ", "  tok: ", "the Secret without the token file's key"),
    ("workers.yaml", "              port: metrics\n            initialDelaySeconds",
     "              port: metric\n            initialDelaySeconds", "a probe on an undeclared port"),
    ("resolver.yaml", "      targetPort: control", "      targetPort: 8471", "a Service targetPort no pod declares"),
    ("workers.yaml", '              value: "9471"', "              value: 9471", "an unquoted env number"),
    ("workers.yaml", '--core "$((n % 4))"', '--core "$((n % 2))"', "two pods on one host/core"),
    ("workers.yaml", '              value: "tpu-resolver:8470"', '              value: "tpu-resolvr:8470"',
     "TPUEMU_RESOLVER naming no Service"),
    ("workers.yaml", "          image: tpuemu:latest", "          image: tpuemu", "another image"),
    ("resolver.yaml", "              mountPath: /run/secrets/tpuemu", "              mountPath: /run/secrets/tpu",
     "the token file outside the Secret's mount"),
    ("workers.yaml", "          command: [\"/bin/sh\", \"-c\"]\n", "", "a container without a command"),
    ("resolver.yaml", "  replicas: 1\n", "  replicas: 1\n  replicas: [\n", "broken YAML"),
    ("workers.yaml", "              path: /readyz", "              path: /healthz",
     "readiness on the liveness endpoint"),
    ("workers.yaml", "          livenessProbe:\n            httpGet:\n              path: /healthz",
     "          livenessProbe:\n            httpGet:\n              path: /readyz",
     "liveness on the readiness endpoint (a resolver outage restarts every worker)"),
]


def self_test(d, known_env, pending):
    base = Checker(known_env, pending)
    if not base.run(manifest_files(d)):
        print("self-test: the unmodified manifests fail:\n  " + "\n  ".join(base.errors))
        return 1
    bad = 0
    for fname, old, new, what in MUTATIONS:
        with tempfile.TemporaryDirectory() as tmp:
            for f in manifest_files(d):
                shutil.copy(f, tmp)
            p = os.path.join(tmp, fname)
            text = open(p).read()
            if old not in text:
                print(f"self-test: mutation '{what}' does not apply to {fname} any more; update MUTATIONS")
                bad += 1
                continue
            open(p, "w").write(text.replace(old, new, 1))
            ch = Checker(known_env, pending)
            if ch.run(manifest_files(tmp)):
                print(f"self-test: FAIL: {what} ({fname}) passed the check")
                bad += 1
            else:
                print(f"self-test: ok: {what} is refused: {ch.errors[0]}")
    return 1 if bad else 0


def main(argv):
    known, pending, files, st = None, [], [], None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--known-env":
            known = set(open(argv[i + 1]).read().split())
            i += 2
        elif a == "--pending-env":
            pending = [x for x in argv[i + 1].split(",") if x]
            i += 2
        elif a == "--self-test":
            st = argv[i + 1]
            i += 2
        else:
            files.append(a)
            i += 1
    if st:
        return self_test(st, known, pending)
    if not files:
        print(__doc__)
        return 2
    ch = Checker(known, pending)
    ok = ch.run(files)
    for n in sorted(set(ch.notes)):
        print(f"note: {n}")
    if not ok:
        print("k8s manifests: FAIL\n  " + "\n  ".join(ch.errors))
        return 1
    kinds = sorted(f"{k}/{n}" for k, n in ch.objs)
    print(f"k8s manifests: ok ({len(kinds)} objects: {', '.join(kinds)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
