#!/usr/bin/env node
// The ONLINEPS_* environment and command line each onlineps container of a render gets,
// checked against the env names the binaries really read, and written out so that
// tests/system/deploy_lint.sh can run the container's exact command line with it, the binary
// replaced by `<binary> --print-config` (which parses flags, env and file exactly as at
// start, then exits without binding anything). A container that starts through a shell
// script (the PS: shard index guard, replica layout) thus runs that very script.
//
//   node podenv.mjs RENDER.yaml HELP_DIR OUT_DIR
//
// HELP_DIR holds `<binary>.help`, the --help text of each binary (it lists
// "(Env:ONLINEPS_...)" for every flag). Refused: an ONLINEPS_* name in a container's
// `env` that its binary does not read, and one in a ConfigMap used by envFrom that no
// binary reads (a misspelt name would otherwise be ignored silently). Workloads that
// are not onlineps (app.kubernetes.io/name != onlineps, e.g. etcd) are skipped.
//
// onlineps_ps_cli runs in the PS pods through `kubectl exec` (deploy/README.md), with the
// container's env (not what the start script exports): ONLINEPS_* names it reads are
// accepted in the PS container too, and the PS's first pod gets one more case, the CLI
// with that env (`onlineps_ps_cli checkpoint`), which must see the shards and, with CURVE
// (ONLINEPS_CURVE_CERT set), the server key (the CLI refuses CURVE without one).
//
// One case per pod: a Deployment's first pod, and every pod of a StatefulSet, with the
// downward API filled in as the kubelet would (pod name, pod-index label, annotations)
// and $(VAR) references expanded as the kubelet expands them. For each case N:
//   N.env     KEY=VALUE lines          N.argv    the command line, NUL-separated
//   N.expect  lines --print-config must print (PS pods: shard-index, and for replicated
//             shards replica-index and replicas = the endpoints of the pod's shard)
//   N.refuse  only for refusal cases: a phrase the start script must print on stderr
//             while refusing to start (pod-index label missing or not the pod's own;
//             a pod past NUM_SHARDS x R)
// and OUT_DIR/containers, lines "N <binary> <what>".
// Exit status: 0 ok, 1 a problem (printed), 2 usage.
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";

const [render, helpDir, outDir] = process.argv.slice(2);
if (!render || !helpDir || !outDir) {
  console.error("usage: podenv.mjs RENDER.yaml HELP_DIR OUT_DIR");
  process.exit(2);
}

const POD_INDEX = "apps.kubernetes.io/pod-index";
// binary of a container -> the CLI run in its pods with `kubectl exec` (in the same image).
const EXEC_CLI = { onlineps_ps: "onlineps_ps_cli" };
const REPLICAS_PER_SHARD = "onlineps.io/replicas-per-shard";

const reads = new Map(); // binary -> Set of env names
for (const f of readdirSync(helpDir).filter((f) => f.endsWith(".help"))) {
  const names = new Set([...readFileSync(join(helpDir, f), "utf8").matchAll(/Env:(ONLINEPS_[A-Z0-9_]+)/g)].map((m) => m[1]));
  reads.set(f.slice(0, -".help".length), names);
}
const anyReads = new Set([...reads.values()].flatMap((s) => [...s]));

const objects = parseAllDocuments(readFileSync(render, "utf8")).map((d) => d.toJS()).filter((o) => o && typeof o === "object");
const configMaps = new Map(objects.filter((o) => o.kind === "ConfigMap").map((o) => [o.metadata.name, o]));
const problems = [];
const lines = [];
const checkedMaps = new Set();
mkdirSync(outDir, { recursive: true });

// The kubelet's $(VAR) expansion (command, args and env values): $$ is a literal $,
// $(NAME) a variable defined before, anything else stays as written.
function expand(s, vars) {
  let out = "";
  for (let i = 0; i < s.length; i++) {
    if (s[i] !== "$" || i + 1 >= s.length) out += s[i];
    else if (s[i + 1] === "$") out += "$", i++;
    else if (s[i + 1] === "(" && s.indexOf(")", i + 2) >= 0) {
      const close = s.indexOf(")", i + 2);
      const name = s.slice(i + 2, close);
      out += Object.hasOwn(vars, name) ? vars[name] : `$(${name})`;
      i = close;
    } else out += s[i];
  }
  return out;
}

function fieldValue(path, pod) {
  const m = /^metadata\.(labels|annotations)\['(.+)'\]$/.exec(path);
  if (m) return pod[m[1]][m[2]] ?? "";
  return { "metadata.name": pod.name, "metadata.namespace": pod.namespace, "spec.nodeName": "node-a", "status.podIP": "10.0.0.10" }[path] ?? "";
}

// The environment the kubelet gives container c of `pod`: envFrom, then env in order.
function containerEnv(c, pod) {
  const env = {};
  for (const src of c.envFrom || []) {
    const cm = src.configMapRef && configMaps.get(src.configMapRef.name);
    if (cm) Object.assign(env, cm.data || {}); // checks.mjs reports missing ConfigMaps
  }
  for (const e of c.env || []) {
    if (e.value !== undefined) env[e.name] = expand(String(e.value), env);
    else if (e.valueFrom?.fieldRef) env[e.name] = fieldValue(e.valueFrom.fieldRef.fieldPath, pod);
    else env[e.name] = ""; // secretKeyRef, resourceFieldRef and the like: unknown here
  }
  return env;
}

function checkNames(c, binary, what) {
  const cli = EXEC_CLI[binary];
  const own = new Set([...reads.get(binary), ...(reads.get(cli) || [])]);
  for (const src of c.envFrom || []) {
    const cm = src.configMapRef && configMaps.get(src.configMapRef.name);
    if (!cm || checkedMaps.has(cm.metadata.name)) continue;
    checkedMaps.add(cm.metadata.name);
    for (const k of Object.keys(cm.data || {})) {
      if (k.startsWith("ONLINEPS_") && !anyReads.has(k)) problems.push(`ConfigMap ${cm.metadata.name}: ${k} is read by no onlineps binary (misspelt?)`);
    }
  }
  for (const e of c.env || []) {
    if (e.name.startsWith("ONLINEPS_") && !own.has(e.name)) {
      problems.push(`${what}: env ${e.name} is not read by ${binary}${cli ? ` nor by ${cli} (run there with kubectl exec)` : ""} (no such flag)`);
    }
  }
}

// The pods to try for workload w: [{pod, expect, refuse}].
function cases(w, c, shellScript) {
  const sts = w.kind === "StatefulSet";
  const labels = w.spec.template.metadata?.labels || {};
  const annotations = w.spec.template.metadata?.annotations || {};
  const pod = (p, index = String(p)) => ({
    name: sts ? `${w.metadata.name}-${p}` : `${w.metadata.name}-5d9c7b6f4-x2x7q`,
    namespace: w.metadata.namespace || "default",
    labels: sts ? { ...labels, [POD_INDEX]: index, "statefulset.kubernetes.io/pod-name": `${w.metadata.name}-${p}` } : { ...labels },
    annotations: { ...annotations },
  });
  if (!sts) return [{ pod: pod(0), expect: [] }];
  const replicas = w.spec.replicas ?? 1;
  const r = Number(annotations[REPLICAS_PER_SHARD] ?? 1);
  const ps = labels["app.kubernetes.io/component"] === "ps";
  const port = /:([0-9]+)$/.exec(containerEnv(c, pod(0)).ONLINEPS_LISTEN || "")?.[1];
  const endpoint = (i) => `tcp://${w.metadata.name}-${i}.${w.spec.serviceName}:${port}`;
  const out = [];
  for (let p = 0; p < replicas; p++) {
    const s = Math.floor(p / r);
    const expect = !ps ? [] : r > 1
      ? [`shard-index = ${s}`, `replica-index = ${p % r}`, `replicas = [${Array.from({ length: r }, (_, i) => endpoint(s * r + i)).join(",")}]`]
      : [`shard-index = ${p}`];
    out.push({ pod: pod(p), expect });
  }
  if (shellScript) {
    const noLabel = pod(0);
    delete noLabel.labels[POD_INDEX];
    out.push({ pod: noLabel, refuse: POD_INDEX });
    if (replicas > 1) out.push({ pod: pod(0, "1"), refuse: "does not match pod" });
    if (ps && r > 1) out.push({ pod: pod(replicas), refuse: "more pods than NUM_SHARDS x R" });
  }
  return out;
}

// The CLI of EXEC_CLI in the first pod of workload w: one case, or a problem.
function execCase(w, c, binary, what) {
  const cli = EXEC_CLI[binary];
  if (!cli) return null;
  if (!reads.has(cli)) {
    problems.push(`${what}: ${cli} (run in its pods with kubectl exec) has no --help in ${helpDir}`);
    return null;
  }
  const [k] = cases(w, c, false);
  const env = containerEnv(c, k.pod);
  const expect = [];
  const exec = `\`kubectl exec ${k.pod.name} -- ${cli} checkpoint\``;
  if (!env.ONLINEPS_SHARDS) problems.push(`${what}: ONLINEPS_SHARDS is not set: ${exec} has no shards to call`);
  if (env.ONLINEPS_CURVE_CERT) {
    expect.push(`curve-cert = ${env.ONLINEPS_CURVE_CERT}`);
    if (!env.ONLINEPS_CURVE_SERVER_KEY) {
      problems.push(`${what}: ONLINEPS_CURVE_CERT without ONLINEPS_CURVE_SERVER_KEY: ${exec} refuses CURVE without the shards' public key`);
    } else expect.push(`curve-server-key = ${env.ONLINEPS_CURVE_SERVER_KEY}`);
  }
  return { pod: k.pod, env, argv: [`/usr/local/bin/${cli}`, "checkpoint"], expect, binary: cli, exec: true };
}

let n = 0;
let skipped = 0;
for (const w of objects.filter((o) => ["Deployment", "StatefulSet", "DaemonSet"].includes(o.kind))) {
  if (w.spec.template.metadata?.labels?.["app.kubernetes.io/name"] !== "onlineps") {
    skipped++;
    continue;
  }
  for (const c of w.spec.template.spec.containers || []) {
    const what = `${w.kind} ${w.metadata.name} container ${c.name}`;
    const argv = [...(c.command || []), ...(c.args || [])].map(String);
    const m = /(?:^|[\s/])(onlineps_[a-z_]+)(?=\s|$)/.exec(argv.join(" "));
    if (!m) {
      problems.push(`${what}: no onlineps binary in command/args (${argv.join(" ") || "the image's CMD"})`);
      continue;
    }
    const binary = m[1];
    if (!reads.has(binary)) {
      problems.push(`${what}: runs ${binary}, which has no --help in ${helpDir}`);
      continue;
    }
    checkNames(c, binary, what);
    const shellScript = /(^|\/)(ba|da)?sh$/.test(argv[0] || "") && argv[1] === "-c";
    const exec = execCase(w, c, binary, what);
    for (const k of [...cases(w, c, shellScript), ...(exec ? [exec] : [])]) {
      const env = k.env ?? containerEnv(c, k.pod);
      for (const [key, v] of Object.entries(env)) {
        if (/[\n\r\0]/.test(String(v))) problems.push(`${what}: env ${key} contains a newline`);
      }
      n++;
      writeFileSync(join(outDir, `${n}.env`), Object.entries(env).map(([key, v]) => `${key}=${v}`).join("\n") + "\n");
      writeFileSync(join(outDir, `${n}.argv`), (k.argv ?? argv).map((a) => expand(a, env) + "\0").join(""));
      writeFileSync(join(outDir, `${n}.expect`), (k.expect || []).map((l) => l + "\n").join(""));
      if (k.refuse) writeFileSync(join(outDir, `${n}.refuse`), k.refuse);
      const label = k.pod.labels[POD_INDEX];
      const podWhat = label === undefined && w.kind === "StatefulSet" ? `${k.pod.name} without the ${POD_INDEX} label` : k.pod.name;
      const via = k.exec ? ` (kubectl exec ${k.binary})` : "";
      lines.push(`${n} ${k.binary ?? binary} ${w.kind}/${w.metadata.name}/${c.name} pod ${podWhat}${label !== undefined && !k.pod.name.endsWith(`-${label}`) ? ` labelled ${label}` : ""}${via}`);
    }
  }
}
writeFileSync(join(outDir, "containers"), lines.join("\n") + (lines.length ? "\n" : ""));
if (problems.length > 0) {
  for (const p of problems) console.error(`podenv.mjs: ${p}`);
  process.exit(1);
}
console.log(`podenv.mjs: ${n} pod case(s), every ONLINEPS_* name is read by its binary${skipped ? `; ${skipped} other workload(s) skipped` : ""}`);
