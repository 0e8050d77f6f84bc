#!/usr/bin/env python3
"""Turns a rendered kustomization (kubectl kustomize) into what deploy/test/run_pods.sh
needs to run each pod of it with podman, as the kubelet would run it.

  podspec.py RENDER.yaml OUT_DIR

For every pod of every onlineps Deployment and StatefulSet (pods are named <workload>-<i>
for both; a StatefulSet's index is its pod-index label) it writes OUT_DIR/<pod>/:
  env      KEY=VALUE lines: the ConfigMaps of envFrom, then env in order, with the
           downward API (pod name, namespace, labels, annotations) and $(VAR) filled in
  argv     the container's command and args, NUL-separated (args only: the image's
           ENTRYPOINT, tini, stays)
  spec.sh  shell assignments: container (its name), image, command_set (1 when `command` replaces the
           ENTRYPOINT), the DNS names the pod answers to (its own, the StatefulSet's
           <pod>.<serviceName>, every Service selecting it), the admin port, the probes,
           preStop, the grace period, the security context, volumes, limits. `claims`
           are "<volume>:<mountPath>" for run_pods.sh's named volumes: a StatefulSet
           claim's is <template>-<pod>, a PersistentVolumeClaim volume's the claim's
           name (one volume for every pod that mounts it, as the claim is; it must be a
           PersistentVolumeClaim of the render)
and OUT_DIR/pods: "<pod> <component>" lines in workload order. One container per pod
(the onlineps manifests have no sidecars); anything else in the render is refused.
Workloads are onlineps' own and etcd's (components/etcd; its component is `etcd`).
Secrets in RENDER.yaml (e.g. make-curve-secrets.sh's output appended to the render) are
written to OUT_DIR/secrets/<name>/<key>, one file per key, for run_pods.sh to mount.
Exit 0 ok, 1 a manifest this script does not handle (printed), 2 usage.
"""
import base64
import math
import os
import re
import shlex
import sys

import yaml  # python3-yaml (Debian; yamllint depends on it)

POD_INDEX = "apps.kubernetes.io/pod-index"
WORKLOADS = ("onlineps", "etcd")  # app.kubernetes.io/name of the workloads run


def fail(msg):
    print(f"podspec.py: {msg}", file=sys.stderr)
    sys.exit(1)


def expand(s, env):
    """The kubelet's $(VAR) expansion: $$ is a literal $, unknown names stay."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, s)


def field_value(path, pod):
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return pod[m.group(1)].get(m.group(2), "")
    values = {"metadata.name": pod["name"], "metadata.namespace": pod["namespace"]}
    if path not in values:
        fail(f"pod {pod['name']}: fieldRef {path} is not filled in by this script")
    return values[path]


def quantity(q):
    """A Kubernetes quantity as a number: 500m -> 0.5, 2Gi -> 2**31, "1" -> 1."""
    m = re.fullmatch(r"([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?", str(q))
    if not m:
        fail(f"quantity {q!r} is not handled")
    scale = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2)]
    return float(m.group(1)) * scale


def resource_value(ref, c, pod):
    """resourceFieldRef as the kubelet fills it in: the value / divisor, rounded up."""
    kind, _, name = ref["resource"].partition(".")
    value = c.get("resources", {}).get(kind, {}).get(name)
    if kind not in ("limits", "requests") or value is None:
        fail(f"pod {pod['name']}: resourceFieldRef {ref['resource']} is not set on the container")
    return str(math.ceil(quantity(value) / quantity(ref.get("divisor", "1"))))


def container_env(c, pod, config_maps):
    env = {}
    for src in c.get("envFrom", []):
        ref = src.get("configMapRef", {}).get("name")
        if ref is None or ref not in config_maps:
            fail(f"pod {pod['name']}: envFrom {src} is not a ConfigMap of the render")
        env.update({k: str(v) for k, v in (config_maps[ref].get("data") or {}).items()})
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(str(e["value"]), env)
        elif "fieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = field_value(e["valueFrom"]["fieldRef"]["fieldPath"], pod)
        elif "resourceFieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = resource_value(e["valueFrom"]["resourceFieldRef"], c, pod)
        else:
            fail(f"pod {pod['name']}: env {e['name']} comes from {e.get('valueFrom')}, not handled")
    return env


def selects(service, labels):
    sel = service["spec"].get("selector") or {}
    return sel and all(labels.get(k) == v for k, v in sel.items())


def probe(c, kind, ports):
    p = c.get(kind)
    if not p:
        return {}
    get = p.get("httpGet") or fail(f"{kind} of {c['name']} is not httpGet")
    port = ports.get(get["port"], get["port"])
    return {f"{kind}_path": get["path"], f"{kind}_port": int(port),
            f"{kind}_period": int(p.get("periodSeconds", 10)),
            f"{kind}_failures": int(p.get("failureThreshold", 3))}


def shell(name, value):
    if isinstance(value, list):
        return f"{name}=({' '.join(shlex.quote(str(v)) for v in value)})"
    return f"{name}={shlex.quote(str(value))}"


def pod_spec(w, c, pod, services, objects):
    spec = w["spec"]["template"]["spec"]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
    aliases = [pod["name"]]
    if w["kind"] == "StatefulSet":
        aliases.append(f"{pod['name']}.{w['spec']['serviceName']}")
    aliases += [s["metadata"]["name"] for s in services if selects(s, pod["labels"])]
    psc = spec.get("securityContext", {})
    csc = c.get("securityContext", {})
    out = {
        "container": c["name"],
        "image": c["image"],
        "command_set": 1 if c.get("command") else 0,
        "aliases": aliases,
        "admin_port": ports.get("http-metrics", ""),
        "grace": spec.get("terminationGracePeriodSeconds", 30),
        "prestop": c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", []),
        "run_as": f"{csc.get('runAsUser', psc.get('runAsUser', ''))}:"
                  f"{csc.get('runAsGroup', psc.get('runAsGroup', ''))}",
        "fs_group": psc.get("fsGroup", ""),
        "read_only": 1 if csc.get("readOnlyRootFilesystem") else 0,
        "drop_all": 1 if "ALL" in csc.get("capabilities", {}).get("drop", []) else 0,
        "no_new_privs": 1 if csc.get("allowPrivilegeEscalation") is False else 0,
        "cpu_limit": c.get("resources", {}).get("limits", {}).get("cpu", ""),
        "memory_limit": c.get("resources", {}).get("limits", {}).get("memory", ""),
    }
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        out.update(probe(c, kind, ports))
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
    pvcs = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    tmpfs, claim_mounts, secret_mounts = [], [], []
    for m in c.get("volumeMounts", []):
        v = volumes.get(m["name"])
        if m["name"] in claims:  # the StatefulSet's PVC <template>-<pod>
            claim_mounts.append(f"{m['name']}-{pod['name']}:{m['mountPath']}")
        elif v is not None and "persistentVolumeClaim" in v:  # e.g. components/bridge-state
            claim = v["persistentVolumeClaim"]["claimName"]
            if claim not in pvcs:
                fail(f"pod {pod['name']}: volume {m['name']}: PersistentVolumeClaim {claim} is not in the render")
            if m.get("readOnly") or v["persistentVolumeClaim"].get("readOnly") or m.get("subPath"):
                fail(f"pod {pod['name']}: volume {m['name']}: a read-only or subPath claim mount is not handled")
            claim_mounts.append(f"{claim}:{m['mountPath']}")
        elif v is not None and "emptyDir" in v:
            tmpfs.append(f"{m['mountPath']}:{v['emptyDir'].get('sizeLimit', '64Mi')}")
        elif v is not None and "secret" in v:
            for item in v["secret"].get("items", []):
                if item["path"] != item["key"]:
                    fail(f"pod {pod['name']}: Secret item {item} (a path other than its key)")
            secret_mounts.append(f"{v['secret']['secretName']}:{m['mountPath']}")
        else:
            fail(f"pod {pod['name']}: volume {m['name']} is neither a claim, an emptyDir nor a Secret")
    out.update(tmpfs=tmpfs, claims=claim_mounts, secrets=secret_mounts)
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        sys.exit(2)
    render, out_dir = sys.argv[1:]
    with open(render, encoding="utf-8") as f:
        objects = [o for o in yaml.safe_load_all(f) if isinstance(o, dict)]
    config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    for o in (o for o in objects if o["kind"] == "Secret"):
        d = os.path.join(out_dir, "secrets", o["metadata"]["name"])
        os.makedirs(d, exist_ok=True)
        data = {k: base64.b64decode(v) for k, v in (o.get("data") or {}).items()}
        data.update({k: v.encode() for k, v in (o.get("stringData") or {}).items()})
        for k, v in data.items():
            with open(os.path.join(d, k), "wb") as f:
                f.write(v)
    services = [o for o in objects if o["kind"] == "Service"]
    pods = []
    for w in (o for o in objects if o["kind"] in ("StatefulSet", "Deployment")):
        template = w["spec"]["template"]
        labels = template["metadata"].get("labels", {})
        if labels.get("app.kubernetes.io/name") not in WORKLOADS:
            fail(f"{w['kind']} {w['metadata']['name']} is neither onlineps nor etcd (not handled)")
        containers = template["spec"]["containers"]
        if len(containers) != 1 or template["spec"].get("initContainers"):
            fail(f"{w['kind']} {w['metadata']['name']}: one container per pod expected")
        c = containers[0]
        for i in range(w["spec"].get("replicas", 1)):
            pod = {"name": f"{w['metadata']['name']}-{i}",
                   "namespace": w["metadata"].get("namespace", "default"),
                   "labels": dict(labels),
                   "annotations": dict(template["metadata"].get("annotations", {}))}
            if w["kind"] == "StatefulSet":
                pod["labels"][POD_INDEX] = str(i)
                pod["labels"]["statefulset.kubernetes.io/pod-name"] = pod["name"]
            env = container_env(c, pod, config_maps)
            argv = [expand(str(a), env) for a in c.get("command", []) + c.get("args", [])]
            d = os.path.join(out_dir, pod["name"])
            os.makedirs(d, exist_ok=True)
            for k, v in env.items():
                if "\n" in v:
                    fail(f"pod {pod['name']}: env {k} has a newline (podman --env-file cannot)")
            with open(os.path.join(d, "env"), "w", encoding="utf-8") as f:
                f.writelines(f"{k}={v}\n" for k, v in env.items())
            with open(os.path.join(d, "argv"), "w", encoding="utf-8") as f:
                f.write("".join(a + "\0" for a in argv))
            with open(os.path.join(d, "spec.sh"), "w", encoding="utf-8") as f:
                f.writelines(shell(k, v) + "\n" for k, v in pod_spec(w, c, pod, services, objects).items())
            pods.append(f"{pod['name']} {labels.get('app.kubernetes.io/component', '')}\n")
    with open(os.path.join(out_dir, "pods"), "w", encoding="utf-8") as f:
        f.writelines(pods)


if __name__ == "__main__":
    main()
