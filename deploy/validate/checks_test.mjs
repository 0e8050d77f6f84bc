#!/usr/bin/env node
// Proves that checks.mjs refuses broken CURVE / Secret wiring (tests/deploy_lint.sh):
// takes the render of deploy/k8s/overlays/curve, adds Secrets made here the way
// make-curve-secrets.sh makes them (fresh random keys, the binaries' key-file layout),
// checks that this passes, then breaks one thing at a time and checks that checks.mjs
// exits 1 naming the problem.
//
//   kubectl kustomize deploy/k8s/overlays/curve > r.yaml && node deploy/validate/checks_test.mjs r.yaml
//
// Exit status: 0 every case behaves, 1 a case does not (printed), 2 usage.
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments, stringify } from "yaml";

const here = dirname(fileURLToPath(import.meta.url));
const render = process.argv[2];
if (!render) {
  console.error("usage: checks_test.mjs CURVE_RENDER.yaml");
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
const base = [
  ...parseAllDocuments(readFileSync(render, "utf8")).map((d) => d.toJS()).filter(Boolean),
  secret("onlineps-curve-ps", { cert: certFile(keys.ps), allow: pubFile(keys.worker.pub) }),
  secret("onlineps-curve-worker", { cert: certFile(keys.worker), "server.pub": pubFile(keys.ps.pub), allow: pubFile(keys.bridge.pub) }),
  secret("onlineps-curve-bridge", { cert: certFile(keys.bridge), "server.pub": pubFile(keys.worker.pub) }),
];

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
const cases = [
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
];

// The cases run in parallel: each is a node process (about a second to start here).
const work = mkdtempSync(join(tmpdir(), "onlineps-checks-test."));
const run = (objs, n) =>
  new Promise((resolve) => {
    const f = join(work, `r${n}.yaml`);
    writeFileSync(f, objs.map((o) => stringify(o)).join("---\n"));
    execFile(process.execPath, [join(here, "checks.mjs"), "--external-secret", "onlineps-mcp-tokens", f], (err, stdout, stderr) =>
      resolve({ status: err ? (typeof err.code === "number" ? err.code : -1) : 0, stdout, stderr }),
    );
  });
const bad = [];
try {
  const runs = [run(base, 0)];
  cases.forEach(([, breakIt], i) => {
    const objs = structuredClone(base);
    breakIt(objs);
    runs.push(run(objs, i + 1));
  });
  const [ok, ...results] = await Promise.all(runs);
  if (ok.status !== 0) bad.push(`the intact render with matching Secrets fails:\n${ok.stderr}`);
  cases.forEach(([what, , phrase], i) => {
    const r = results[i];
    if (r.status !== 1) bad.push(`${what}: checks.mjs exits ${r.status}, expected 1\n${r.stdout}${r.stderr}`);
    else if (!r.stderr.includes(phrase)) bad.push(`${what}: the failure does not say "${phrase}":\n${r.stderr}`);
  });
} finally {
  rmSync(work, { recursive: true, force: true });
}
if (bad.length > 0) {
  for (const b of bad) console.error(`checks_test.mjs: ${b}`);
  process.exit(1);
}
console.log(`checks_test.mjs: the intact CURVE render passes; ${cases.length} broken ones are refused`);
