#!/usr/bin/env node
// Proves that checks.mjs refuses broken manifests (tests/system/deploy_lint.sh). Takes the
// renders of deploy/k8s/overlays/curve and deploy/k8s/overlays/replicated, adds Secrets
// made here the way make-curve-secrets.sh makes them (fresh random keys, the binaries'
// key-file layout), checks that each passes, then breaks one thing at a time and checks
// that checks.mjs refuses it naming the problem: the CURVE and Secret wiring on the
// first; the replicated layout, the etcd reference, the etcd StatefulSet, its
// NetworkPolicy and CURVE being required on the second; update strategies the API server
// refuses (Recreate with rollingUpdate) on the first. A few variants that must pass
// (an etcd outside the render, 3 replicas per shard, a Recreate bridge, ...) are checked too. The cases
// run in this process (checkManifests); checks.mjs itself runs twice as a command, on
// an intact and a broken render, for its exit status.
//
//   node deploy/validate/checks_test.mjs CURVE_RENDER.yaml REPLICATED_RENDER.yaml
//
// Exit status: 0 every case behaves, 1 a case does not (printed), 2 usage.
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments, stringify } from "yaml";
import { checkManifests } from "./checks.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const [curveRender, replicatedRender] = process.argv.slice(2);
if (!curveRender || !replicatedRender) {
  console.error("usage: checks_test.mjs CURVE_RENDER.yaml REPLICATED_RENDER.yaml");
  process.exit(2);
}

const Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
function z85(bytes) {
  let out = "";
  for (let i = 0; i < bytes.length; i += 4) {
    let v = bytes.readUInt32BE(i);
    let chunk = "";
    for (let j = 0; j < 5; j++) {
      chunk = Z85[v % 85] + chunk;
      v = Math.floor(v / 85);
    }
    out += chunk;
  }
  return out;
}
const key = () => z85(randomBytes(32));
const pubFile = (k) => `# onlineps CURVE public key\ncurve\n    public-key = "${k}"\n`;
const certFile = (k) => `# onlineps CURVE certificate: keep secret (mode 0600)\ncurve\n    public-key = "${k.pub}"\n    secret-key = "${k.sec}"\n`;
const b64 = (s) => Buffer.from(s).toString("base64");
const secret = (name, data) => ({
  apiVersion: "v1",
  kind: "Secret",
  metadata: { name, namespace: "onlineps" },
  data: Object.fromEntries(Object.entries(data).map(([k, v]) => [k, b64(v)])),
});

const keys = Object.fromEntries(["ps", "worker", "bridge"].map((r) => [r, { pub: key(), sec: key() }]));
const objectsOf = (f) => parseAllDocuments(readFileSync(f, "utf8")).map((d) => d.toJS()).filter(Boolean);
// psAllow: the shards' allow list (make-curve-secrets.sh: the workers' key and the
// shards' own, for the replicas and for onlineps_ps_cli in a PS pod).
const secrets = (psAllow) => [
  secret("onlineps-curve-ps", { cert: certFile(keys.ps), "server.pub": pubFile(keys.ps.pub), allow: psAllow }),
  secret("onlineps-curve-worker", { cert: certFile(keys.worker), "server.pub": pubFile(keys.ps.pub), allow: pubFile(keys.bridge.pub) }),
  secret("onlineps-curve-bridge", { cert: certFile(keys.bridge), "server.pub": pubFile(keys.worker.pub) }),
];
const curveBase = [...objectsOf(curveRender), ...secrets(pubFile(keys.worker.pub) + pubFile(keys.ps.pub))];
const replicatedBase = [...objectsOf(replicatedRender), ...secrets(pubFile(keys.worker.pub) + pubFile(keys.ps.pub))];

const find = (objs, kind, name) => objs.find((o) => o.kind === kind && o.metadata.name === name);
const ps = (o) => find(o, "StatefulSet", "onlineps-ps").spec.template.spec;
const worker = (o) => find(o, "Deployment", "onlineps-worker").spec.template.spec;
const bridge = (o) => find(o, "Deployment", "onlineps-mcp-bridge").spec.template.spec;
const dropEnv = (pod, name) => {
  pod.containers[0].env = pod.containers[0].env.filter((e) => e.name !== name);
};
const setEnv = (pod, name, value) => {
  dropEnv(pod, name);
  pod.containers[0].env.push({ name, value });
};
const volume = (pod, name) => pod.volumes.find((v) => v.name === name);
const mount = (pod, name) => pod.containers[0].volumeMounts.find((m) => m.name === name);
const setData = (objs, name, k, text) => {
  find(objs, "Secret", name).data[k] = b64(text);
};

// [what is broken, how, a phrase the failure must contain]
const curveCases = [
  ["the bridge has no server key", (o) => dropEnv(bridge(o), "ONLINEPS_CURVE_SERVER_KEY"), "ONLINEPS_CURVE_SERVER_KEY is not set"],
  ["the PS without CURVE", (o) => ["ONLINEPS_CURVE_CERT", "ONLINEPS_CURVE_ALLOW"].forEach((n) => dropEnv(ps(o), n)), "but not for StatefulSet onlineps/onlineps-ps"],
  ["an allow list without a certificate", (o) => dropEnv(worker(o), "ONLINEPS_CURVE_CERT"), "without ONLINEPS_CURVE_CERT"],
  ["the worker's mount is gone", (o) => {
    worker(o).containers[0].volumeMounts = worker(o).containers[0].volumeMounts.filter((m) => m.name !== "curve");
  }, "/etc/onlineps/curve/cert is not inside a mounted volume"],
  ["a writable mount", (o) => {
    mount(bridge(o), "curve").readOnly = false;
  }, "is not readOnly"],
  ["0440 files without fsGroup", (o) => {
    delete worker(o).securityContext.fsGroup;
  }, "has no fsGroup"],
  ["the cert path is not an item", (o) => setEnv(ps(o), "ONLINEPS_CURVE_CERT", "/etc/onlineps/curve/ps.cert"), "has no item with path ps.cert"],
  ["the Secret lacks a key", (o) => {
    delete find(o, "Secret", "onlineps-curve-worker").data.allow;
  }, "onlineps-curve-worker has no key allow"],
  ["a certificate from a ConfigMap", (o) => {
    volume(bridge(o), "curve").configMap = { name: "onlineps-config-x", items: volume(bridge(o), "curve").secret.items };
    delete volume(bridge(o), "curve").secret;
  }, "not a Secret"],
  ["the workers get the bridge's key as the shards'", (o) => setData(o, "onlineps-curve-worker", "server.pub", pubFile(keys.bridge.pub)), "is not the PS's public key"],
  ["the bridge gets the shards' key", (o) => setData(o, "onlineps-curve-bridge", "server.pub", pubFile(keys.ps.pub)), "is not the workers' public key"],
  ["the shards do not admit the workers", (o) => setData(o, "onlineps-curve-ps", "allow", pubFile(keys.bridge.pub)), "does not admit the worker's key"],
  ["a secret key in a public file", (o) => setData(o, "onlineps-curve-bridge", "server.pub", certFile(keys.worker)), "holds a secret key"],
  ["a certificate without its secret key", (o) => setData(o, "onlineps-curve-ps", "cert", pubFile(keys.ps.pub)), "holds no secret-key line"],
  ["CURVE names in the shared ConfigMap", (o) => {
    o.find((x) => x.kind === "ConfigMap").data.ONLINEPS_CURVE_SERVER_KEY = "/etc/onlineps/curve/server.pub";
  }, "in a shared ConfigMap"],
  ["a secret key in a ConfigMap", (o) => {
    o.find((x) => x.kind === "ConfigMap").data["ps.cert"] = certFile(keys.ps);
  }, "holds a CURVE secret key"],
  ["the tokens on a writable mount", (o) => {
    mount(bridge(o), "tokens").readOnly = false;
  }, "ONLINEPS_TOKENS_FILE: volumeMount tokens"],
  ["a CURVE Secret missing from the render", (o) => {
    o.splice(o.indexOf(find(o, "Secret", "onlineps-curve-ps")), 1);
  }, "Secret onlineps-curve-ps is neither in the render nor declared external"],
  // `kubectl exec onlineps-ps-0 -- onlineps_ps_cli checkpoint` (deploy/README.md) in a
  // CURVE cluster: the CLI gets the PS container's env.
  ["no server key for the CLI in the PS pods", (o) => dropEnv(ps(o), "ONLINEPS_CURVE_SERVER_KEY"),
    "gets ONLINEPS_CURVE_CERT and refuses to run without the shards' public key"],
  ["the PS pods get the workers' key as the shards'", (o) => setData(o, "onlineps-curve-ps", "server.pub", pubFile(keys.worker.pub)),
    "is not the shards' own public key"],
  ["the shards do not admit their own key (the CLI in a PS pod)", (o) => setData(o, "onlineps-curve-ps", "allow", pubFile(keys.worker.pub)),
    "onlineps_ps_cli in a PS pod connects with it"],
];

// The replicated render (components/replication + etcd + curve).
const config = (o) => o.find((x) => x.kind === "ConfigMap").data;
const psSet = (o) => find(o, "StatefulSet", "onlineps-ps");
const etcdSet = (o) => find(o, "StatefulSet", "onlineps-etcd");
const etcd = (o) => etcdSet(o).spec.template.spec;
const policy = (o) => find(o, "NetworkPolicy", "onlineps-etcd");
const setConfig = (o, k, v) => {
  config(o)[k] = v;
};
const setShardLists = (o, v) => ["ONLINEPS_PS", "ONLINEPS_SHARDS"].forEach((k) => setConfig(o, k, v));
const groups = (r, shards) =>
  Array.from({ length: shards }, (_, s) =>
    Array.from({ length: r }, (_, i) => `tcp://onlineps-ps-${s * r + i}.onlineps-ps:7000`).join("|")).join(",");
const setEtcdEnv = (o, name, value) => {
  etcd(o).containers[0].env.find((e) => e.name === name).value = value;
};
const dropEtcd = (o) => {
  for (const x of o.filter((x) => x.metadata?.labels?.["app.kubernetes.io/component"] === "etcd")) o.splice(o.indexOf(x), 1);
};
const dropCurve = (o) => {
  for (const pod of [ps(o), worker(o), bridge(o)]) {
    for (const n of ["ONLINEPS_CURVE_CERT", "ONLINEPS_CURVE_SERVER_KEY", "ONLINEPS_CURVE_ALLOW"]) dropEnv(pod, n);
  }
};

const replicatedCases = [
  ["NUM_SHARDS x R != replicas", (o) => {
    psSet(o).spec.replicas = 6;
  }, "ONLINEPS_NUM_SHARDS 2 x 2 replicas per shard != replicas 6"],
  ["the replicas of a shard out of order", (o) => setConfig(o, "ONLINEPS_PS", config(o).ONLINEPS_PS.replace(
    "onlineps-ps-0.onlineps-ps:7000|tcp://onlineps-ps-1", "onlineps-ps-1.onlineps-ps:7000|tcp://onlineps-ps-0")),
  "does not name every shard's replicas (`|` between them) in order"],
  ["the CLI's shard list without groups", (o) => setConfig(o, "ONLINEPS_SHARDS", config(o).ONLINEPS_SHARDS.replaceAll("|", ",")),
    "ONLINEPS_SHARDS tcp://onlineps-ps-0.onlineps-ps:7000,tcp://onlineps-ps-1"],
  ["replica groups without the R annotation", (o) => {
    delete psSet(o).spec.template.metadata.annotations["onlineps.io/replicas-per-shard"];
    psSet(o).spec.replicas = 2;
  }, "name replica groups (|) but the pods have no onlineps.io/replicas-per-shard annotation"],
  ["one replica per shard", (o) => {
    psSet(o).spec.template.metadata.annotations["onlineps.io/replicas-per-shard"] = "1";
  }, "is not a number >= 2"],
  ["R that does not divide the pods", (o) => {
    psSet(o).spec.template.metadata.annotations["onlineps.io/replicas-per-shard"] = "3";
  }, "replicas 4 is not a multiple of onlineps.io/replicas-per-shard 3"],
  ["no ONLINEPS_ETCD", (o) => delete config(o).ONLINEPS_ETCD, "ONLINEPS_ETCD is not set"],
  ["ONLINEPS_ETCD names no Service of the render", (o) => setConfig(o, "ONLINEPS_ETCD", "http://etcd.example:2379"),
    "ONLINEPS_ETCD host etcd.example is not a Service in the render"],
  ["ONLINEPS_ETCD on the peer port", (o) => setConfig(o, "ONLINEPS_ETCD", "http://onlineps-etcd-client:2380"),
    "Service onlineps-etcd-client has no port 2380"],
  ["ONLINEPS_ETCD over https", (o) => setConfig(o, "ONLINEPS_ETCD", "https://onlineps-etcd-client:2379"), "is not http://HOST:PORT"],
  ["ONLINEPS_ETCD names a Service that is not etcd", (o) => setConfig(o, "ONLINEPS_ETCD", "http://onlineps-mcp-bridge:8080"),
    "Service onlineps-mcp-bridge does not select an etcd workload"],
  ["the etcd left out, not declared external", dropEtcd, "ONLINEPS_ETCD host onlineps-etcd-client is not a Service in the render"],
  ["replicated without CURVE", dropCurve, "replicated shards need CURVE"],
  ["a per-pod value in the shared ConfigMap", (o) => setConfig(o, "ONLINEPS_REPLICA_INDEX", "0"),
    "ONLINEPS_REPLICA_INDEX is set for every pod alike"],
  ["the pod index not from the label", (o) => setEnv(ps(o), "POD_INDEX", "0"), "POD_INDEX does not come from the downward API label"],
  ["R not from the annotation", (o) => setEnv(ps(o), "PS_REPLICAS_PER_SHARD", "2"), "PS_REPLICAS_PER_SHARD does not come from the pod annotation"],
  ["a PS PodDisruptionBudget of two", (o) => {
    find(o, "PodDisruptionBudget", "onlineps-ps").spec.maxUnavailable = 2;
  }, "lets more than one PS pod go at a time"],
  ["min-insync above R", (o) => setConfig(o, "ONLINEPS_MIN_INSYNC_REPLICAS", "3"), "ONLINEPS_MIN_INSYNC_REPLICAS 3 is not between 1 and the 2 replicas"],
  ["a lease under twice the heartbeat", (o) => setConfig(o, "ONLINEPS_REPLICA_HEARTBEAT_MS", "1500"),
    "ONLINEPS_REPLICA_LEASE_MS 2000 must be >= 1000 and exceed twice ONLINEPS_REPLICA_HEARTBEAT_MS 1500"],
  ["the shards' allow list lacks their own key", (o) => setData(o, "onlineps-curve-ps", "allow", pubFile(keys.worker.pub)),
    "does not admit the shards' own key"],
  ["an even number of etcd members", (o) => {
    etcdSet(o).spec.replicas = 2;
  }, "2 members: use an odd number"],
  ["etcd members started in order", (o) => {
    etcdSet(o).spec.podManagementPolicy = "OrderedReady";
  }, "podManagementPolicy is not Parallel: with OrderedReady"],
  ["etcd members that do not resolve before Ready", (o) => {
    find(o, "Service", "onlineps-etcd").spec.publishNotReadyAddresses = false;
  }, "etcd members must resolve each other before any is Ready"],
  ["a member missing from the initial cluster", (o) => setEtcdEnv(o, "ETCD_INITIAL_CLUSTER",
    "onlineps-etcd-0=http://onlineps-etcd-0.onlineps-etcd:2380,onlineps-etcd-1=http://onlineps-etcd-1.onlineps-etcd:2380"),
  "ETCD_INITIAL_CLUSTER \"onlineps-etcd-0=http://onlineps-etcd-0.onlineps-etcd:2380,onlineps-etcd-1=http://onlineps-etcd-1.onlineps-etcd:2380\" does not name the 3 members"],
  ["a peer URL that is not the member's name", (o) => setEtcdEnv(o, "ETCD_INITIAL_ADVERTISE_PEER_URLS", "http://onlineps-etcd:2380"),
    "ETCD_INITIAL_ADVERTISE_PEER_URLS \"http://onlineps-etcd:2380\" is not http://$(POD_NAME).onlineps-etcd:2380"],
  ["the same ETCD_NAME on every member", (o) => setEtcdEnv(o, "ETCD_NAME", "etcd"), "ETCD_NAME \"etcd\" is not $(VAR)"],
  ["etcd listening on loopback", (o) => setEtcdEnv(o, "ETCD_LISTEN_CLIENT_URLS", "http://127.0.0.1:2379"),
    "ETCD_LISTEN_CLIENT_URLS \"http://127.0.0.1:2379\" does not include http://0.0.0.0:2379"],
  ["etcd data off the volume", (o) => setEtcdEnv(o, "ETCD_DATA_DIR", "/tmp/etcd"), "ETCD_DATA_DIR \"/tmp/etcd\" is not on a volumeClaimTemplate"],
  ["an etcd PDB that breaks the quorum", (o) => {
    find(o, "PodDisruptionBudget", "onlineps-etcd").spec.maxUnavailable = 2;
  }, "does not keep a quorum of 2 of the 3 etcd members"],
  ["no NetworkPolicy for etcd", (o) => o.splice(o.indexOf(policy(o)), 1), "no NetworkPolicy selects the etcd pods"],
  ["a NetworkPolicy rule open to all", (o) => policy(o).spec.ingress.push({ ports: [{ port: "client" }] }),
    "an ingress rule without `from` admits every pod and address"],
  ["etcd open to another namespace", (o) => policy(o).spec.ingress[0].from.push({ namespaceSelector: {} }),
    "only the PS pods and the etcd members may reach etcd"],
  ["the PS pods on the peer port", (o) => policy(o).spec.ingress[0].ports.push({ port: "peer", protocol: "TCP" }),
    "the PS pods may reach ports 2379,2380, not only the client port 2379"],
  ["the members cannot reach each other", (o) => policy(o).spec.ingress.splice(1, 1),
    "no NetworkPolicy lets the members reach each other's peer port 2380"],
  ["a writable root filesystem for etcd", (o) => {
    etcd(o).containers[0].securityContext.readOnlyRootFilesystem = false;
  }, "readOnlyRootFilesystem is not true"],
  ["etcd:latest", (o) => {
    etcd(o).containers[0].image = "gcr.io/etcd-development/etcd:latest";
  }, "is not pinned to a tag"],
];

// Update strategies the API server refuses, on the CURVE render (any render would do).
const strategyCases = [
  ["a Recreate Deployment that keeps the base's rollingUpdate", (o) => {
    find(o, "Deployment", "onlineps-mcp-bridge").spec.strategy = { type: "Recreate", rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } };
  }, "Deployment onlineps/onlineps-mcp-bridge: strategy.type is Recreate but strategy.rollingUpdate is set"],
  ["an OnDelete StatefulSet with rollingUpdate", (o) => {
    psSet(o).spec.updateStrategy = { type: "OnDelete", rollingUpdate: { partition: 0 } };
  }, "updateStrategy.type is OnDelete but updateStrategy.rollingUpdate is set"],
];
const curveAccepted = [
  ["a Recreate bridge without rollingUpdate (components/bridge-state)", (o) => {
    find(o, "Deployment", "onlineps-mcp-bridge").spec.strategy = { type: "Recreate" };
  }],
];

// Variants of the replicated render that must pass.
const replicatedAccepted = [
  ["an etcd outside the render, declared external", (o) => {
    dropEtcd(o);
    setConfig(o, "ONLINEPS_ETCD", "http://etcd-0.etcd.infra.svc:2379,http://etcd-1.etcd.infra.svc:2379");
    psSet(o).metadata.annotations = { "onlineps.io/etcd": "external" };
  }],
  ["the etcd members named instead of the client Service", (o) => setConfig(o, "ONLINEPS_ETCD",
    [0, 1, 2].map((i) => `http://onlineps-etcd-${i}.onlineps-etcd.onlineps.svc:2379`).join(","))],
  ["3 shards x 3 replicas, min-insync 2", (o) => {
    psSet(o).spec.replicas = 9;
    psSet(o).spec.template.metadata.annotations["onlineps.io/replicas-per-shard"] = "3";
    setConfig(o, "ONLINEPS_NUM_SHARDS", "3");
    setShardLists(o, groups(3, 3));
    setConfig(o, "ONLINEPS_MIN_INSYNC_REPLICAS", "2");
  }],
  ["5 etcd members", (o) => {
    etcdSet(o).spec.replicas = 5;
    setEtcdEnv(o, "ETCD_INITIAL_CLUSTER",
      [0, 1, 2, 3, 4].map((i) => `onlineps-etcd-${i}=http://onlineps-etcd-${i}.onlineps-etcd:2380`).join(","));
  }],
];

const external = new Set(["onlineps-mcp-tokens"]);
const bad = [];
function expectRefused(base, cases) {
  for (const [what, breakIt, phrase] of cases) {
    const objs = structuredClone(base);
    breakIt(objs);
    const found = checkManifests(objs, { external });
    if (found.length === 0) bad.push(`${what}: checks.mjs accepts it`);
    else if (!found.some((p) => p.includes(phrase))) bad.push(`${what}: no problem says "${phrase}":\n  ${found.join("\n  ")}`);
  }
}
function expectAccepted(base, variants) {
  for (const [what, change] of variants) {
    const objs = structuredClone(base);
    change(objs);
    const found = checkManifests(objs, { external });
    if (found.length > 0) bad.push(`${what}: refused:\n  ${found.join("\n  ")}`);
  }
}
expectAccepted(curveBase, [["the intact CURVE render with matching Secrets", () => {}], ...curveAccepted]);
expectAccepted(replicatedBase, [["the intact replicated render with matching Secrets", () => {}], ...replicatedAccepted]);
expectRefused(curveBase, curveCases);
expectRefused(curveBase, strategyCases);
expectRefused(replicatedBase, replicatedCases);

// checks.mjs as a command: exit 0 on the intact render, 1 on a broken one.
const work = mkdtempSync(join(tmpdir(), "onlineps-checks-test."));
const run = (objs, n) =>
  new Promise((resolve) => {
    const f = join(work, `r${n}.yaml`);
    writeFileSync(f, objs.map((o) => stringify(o)).join("---\n"));
    execFile(process.execPath, [join(here, "checks.mjs"), "--external-secret", "onlineps-mcp-tokens", f], (err, stdout, stderr) =>
      resolve({ status: err ? (typeof err.code === "number" ? err.code : -1) : 0, stdout, stderr }),
    );
  });
try {
  const broken = structuredClone(replicatedBase);
  dropCurve(broken);
  const [ok, refused] = await Promise.all([run(replicatedBase, 0), run(broken, 1)]);
  if (ok.status !== 0) bad.push(`checks.mjs exits ${ok.status} on the intact replicated render:\n${ok.stderr}`);
  if (refused.status !== 1 || !refused.stderr.includes("replicated shards need CURVE")) {
    bad.push(`checks.mjs exits ${refused.status} on a replicated render without CURVE, expected 1 naming it:\n${refused.stderr}`);
  }
} finally {
  rmSync(work, { recursive: true, force: true });
}
if (bad.length > 0) {
  for (const b of bad) console.error(`checks_test.mjs: ${b}`);
  process.exit(1);
}
console.log(`checks_test.mjs: the intact CURVE and replicated renders and ${curveAccepted.length + replicatedAccepted.length} variants pass; ` +
  `${curveCases.length} broken CURVE, ${replicatedCases.length} broken replicated and ${strategyCases.length} bad update strategies are refused`);
