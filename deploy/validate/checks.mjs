#!/usr/bin/env node
// onlineps-specific structural checks of rendered manifests (kubectl kustomize output),
// the rules a schema cannot express. Run after validate.mjs (schemas):
//
//   kubectl kustomize deploy/k8s/overlays/dev > r.yaml && node deploy/validate/checks.mjs r.yaml
//   node deploy/validate/checks.mjs --external-secret onlineps-mcp-tokens r.yaml
//
// --external-secret NAME: a Secret that is created out of band (not in the render).
// The rules for files from Secrets (bearer tokens, CURVE keys) are in curve.mjs, those
// for replicated shards in replication.mjs and for an etcd in the render in etcd.mjs.
// The onlineps container rules (admin port, probes, scrape annotations) apply to
// workloads labelled app.kubernetes.io/name=onlineps; others (etcd) get the general
// ones (probes, resources, read-only root, non-root, PDB, labels).
// Exit status: 0 all checks pass, 1 a problem (each printed, naming the object), 2 usage.
// Also a module: checkManifests(objects, {external}) returns the problems (checks_test.mjs).
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { parseAllDocuments } from "yaml";
import { checkSecretFiles } from "./curve.mjs";
import { checkEtcd } from "./etcd.mjs";
import { checkReplication, psLayout } from "./replication.mjs";

const USAGE = "usage: checks.mjs [--external-secret NAME]... FILE...";
const problems = [];
const fail = (what, msg) => problems.push(`${what}: ${msg}`);

function parseArgs(argv) {
  const files = [];
  const external = new Set();
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--external-secret" && i + 1 < argv.length) external.add(argv[++i]);
    else if (argv[i].startsWith("-")) throw new Error(`unknown option ${argv[i]}`);
    else files.push(argv[i]);
  }
  if (files.length === 0) throw new Error("no input file");
  return { files, external };
}

const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const id = (o) => `${o.kind} ${o.metadata?.namespace ? o.metadata.namespace + "/" : ""}${o.metadata?.name}`;
const subset = (sel, labels) =>
  isObj(sel) && Object.keys(sel).length > 0 && Object.entries(sel).every(([k, v]) => labels?.[k] === v);
const WORKLOAD_KINDS = new Set(["Deployment", "StatefulSet", "DaemonSet"]);
const REQUIRED_LABELS = ["app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"];

export function load(files) {
  const objects = [];
  for (const f of files) {
    for (const doc of parseAllDocuments(readFileSync(f, "utf8"))) {
      if (doc.errors.length > 0) throw new Error(`${f}: ${doc.errors[0].message}`);
      const o = doc.toJS();
      if (isObj(o)) objects.push(o);
    }
  }
  return objects;
}

// The env a container sees: envFrom ConfigMaps, then env (which wins). valueFrom
// entries map to {from: ...}.
function effectiveEnv(container, configMaps, what) {
  const env = {};
  for (const src of container.envFrom || []) {
    if (src.configMapRef) {
      const cm = configMaps.get(src.configMapRef.name);
      if (!cm) {
        if (!src.configMapRef.optional) fail(what, `envFrom ConfigMap ${src.configMapRef.name} is not in the render`);
        continue;
      }
      Object.assign(env, cm.data || {});
    }
  }
  for (const e of container.env || []) {
    env[e.name] = e.valueFrom ? { from: e.valueFrom } : e.value ?? "";
  }
  return env;
}

function portOf(container, name) {
  return (container.ports || []).find((p) => p.name === name)?.containerPort;
}

function endpointPort(endpoint) {
  const m = /^tcp:\/\/[^:]+:([0-9]+)$/.exec(endpoint || "");
  return m ? Number(m[1]) : undefined;
}

function preStopSleepSeconds(container) {
  const cmd = container.lifecycle?.preStop?.exec?.command;
  if (Array.isArray(cmd) && /(^|\/)sleep$/.test(cmd[0] || "")) return Number(cmd[1]);
  const s = container.lifecycle?.preStop?.sleep?.seconds;
  return typeof s === "number" ? s : undefined;
}

function checkContainer(w, pod, c, env) {
  const what = `${id(w)} container ${c.name}`;
  const admin = portOf(c, "http-metrics");
  if (admin === undefined) fail(what, "no container port named http-metrics (the admin port)");
  for (const [probe, path] of [["livenessProbe", "/livez"], ["readinessProbe", "/readyz"], ["startupProbe", null]]) {
    const p = c[probe];
    if (!p) {
      fail(what, `no ${probe}`);
      continue;
    }
    if (!p.httpGet) {
      fail(what, `${probe} is not an httpGet probe on the admin port`);
      continue;
    }
    if (path !== null && p.httpGet.path !== path) fail(what, `${probe} path is ${p.httpGet.path}, expected ${path}`);
    if (p.httpGet.port !== "http-metrics" && p.httpGet.port !== admin) {
      fail(what, `${probe} port ${p.httpGet.port} is not the http-metrics port`);
    }
  }
  for (const kind of ["requests", "limits"]) {
    for (const r of ["cpu", "memory"]) {
      if (c.resources?.[kind]?.[r] === undefined) fail(what, `no resources.${kind}.${r}`);
    }
  }
  const sleep = preStopSleepSeconds(c);
  if (sleep === undefined) fail(what, "no preStop sleep (time for endpoints/DNS to drop the pod before SIGTERM)");
  const grace = pod.terminationGracePeriodSeconds;
  if (typeof grace !== "number") fail(what, "terminationGracePeriodSeconds is not set");
  else if (sleep !== undefined && grace < sleep + 20) {
    fail(what, `terminationGracePeriodSeconds ${grace} leaves under 20 s after the ${sleep} s preStop for draining`);
  }
  if (env.ONLINEPS_ADMIN_HOST !== "0.0.0.0") {
    fail(what, `ONLINEPS_ADMIN_HOST is ${JSON.stringify(env.ONLINEPS_ADMIN_HOST)}: probes need 0.0.0.0 (default 127.0.0.1)`);
  }
  if (admin !== undefined && String(env.ONLINEPS_ADMIN_PORT) !== String(admin)) {
    fail(what, `ONLINEPS_ADMIN_PORT ${env.ONLINEPS_ADMIN_PORT} != http-metrics containerPort ${admin}`);
  }
  const ann = w.spec.template.metadata?.annotations || {};
  if (ann["prometheus.io/scrape"] !== "true") fail(what, 'pod annotation prometheus.io/scrape is not "true"');
  if (admin !== undefined && ann["prometheus.io/port"] !== String(admin)) {
    fail(what, `pod annotation prometheus.io/port ${ann["prometheus.io/port"]} != http-metrics port ${admin}`);
  }
  if (!c.image || !/:[A-Za-z0-9_.-]+$/.test(c.image)) fail(what, `image ${c.image} has no tag`);
}

// Containers of workloads that are not onlineps (etcd): probes, resources, hardening.
function checkOtherContainer(w, c) {
  const what = `${id(w)} container ${c.name}`;
  for (const probe of ["livenessProbe", "readinessProbe"]) if (!c[probe]) fail(what, `no ${probe}`);
  for (const kind of ["requests", "limits"]) {
    for (const r of ["cpu", "memory"]) {
      if (c.resources?.[kind]?.[r] === undefined) fail(what, `no resources.${kind}.${r}`);
    }
  }
  if (c.securityContext?.readOnlyRootFilesystem !== true) fail(what, "securityContext.readOnlyRootFilesystem is not true");
  if (c.securityContext?.allowPrivilegeEscalation !== false) fail(what, "securityContext.allowPrivilegeEscalation is not false");
  if (!c.image || !/:[A-Za-z0-9_.-]+$/.test(c.image) || /:latest$/.test(c.image)) fail(what, `image ${c.image} is not pinned to a tag`);
}

// The API server refuses rollingUpdate settings beside a strategy that does not roll
// (apps validation): a Deployment's `strategy: {type: Recreate, rollingUpdate: ...}`
// ("may not be specified when strategy `type` is 'Recreate'"), a StatefulSet's
// `updateStrategy: {type: OnDelete, rollingUpdate: ...}`. A strategic-merge patch that
// sets Recreate over the base's RollingUpdate keeps the base's rollingUpdate unless it
// deletes it (`rollingUpdate: null`), and the schemas accept the result.
function checkStrategy(w, what) {
  // (A DaemonSet's OnDelete with rollingUpdate is accepted, so not checked.)
  const field = { Deployment: "strategy", StatefulSet: "updateStrategy" }[w.kind];
  const type = field && w.spec[field]?.type;
  if (!field || type === undefined || type === "RollingUpdate") return;
  const ru = w.spec[field].rollingUpdate;
  if (ru !== undefined && ru !== null) {
    fail(what, `${field}.type is ${type} but ${field}.rollingUpdate is set (${JSON.stringify(ru)}): ` +
      `the API server refuses it; delete it in the patch that sets ${type} (rollingUpdate: null)`);
  }
}

// Every problem of the rendered objects, as "<object>: <what is wrong>" lines.
// external: names of Secrets created out of band. Not reentrant (one `problems` list).
export function checkManifests(objects, { external = new Set() } = {}) {
  problems.length = 0;
  const args = { external };
  const byKind = (k) => objects.filter((o) => o.kind === k);
  const configMaps = new Map(byKind("ConfigMap").map((o) => [o.metadata.name, o]));
  const secrets = new Set(byKind("Secret").map((o) => o.metadata.name));
  const services = byKind("Service");
  const pdbs = byKind("PodDisruptionBudget");
  const workloads = objects.filter((o) => WORKLOAD_KINDS.has(o.kind));
  if (workloads.length === 0) fail("render", "no Deployment or StatefulSet");

  const component = (c) => workloads.filter((w) => w.spec?.template?.metadata?.labels?.["app.kubernetes.io/component"] === c);
  const envs = new Map(); // workload -> env of its first container

  for (const w of workloads) {
    const what = id(w);
    const tmplLabels = w.spec?.template?.metadata?.labels || {};
    for (const l of REQUIRED_LABELS) {
      if (!w.metadata.labels?.[l]) fail(what, `label ${l} missing`);
      if (!tmplLabels[l]) fail(what, `pod template label ${l} missing`);
    }
    if (!subset(w.spec?.selector?.matchLabels, tmplLabels)) fail(what, "selector.matchLabels do not match the pod template labels");
    const pod = w.spec.template.spec;
    if (pod.enableServiceLinks !== false) {
      fail(what, "enableServiceLinks is not false: Service env vars (ONLINEPS_*_PORT=tcp://...) would reach the ONLINEPS_ flag namespace");
    }
    if (!pod.securityContext?.runAsNonRoot) fail(what, "pod securityContext.runAsNonRoot is not true");
    for (const v of pod.volumes || []) {
      if (v.secret && !secrets.has(v.secret.secretName) && !args.external.has(v.secret.secretName) && !v.secret.optional) {
        fail(what, `volume ${v.name}: Secret ${v.secret.secretName} is neither in the render nor declared external`);
      }
      // An overlay that generates the Secret (NAME-<hash>) but whose reference kustomize
      // did not rewrite (e.g. the generator in another namespace) points at nothing.
      const generated = v.secret && [...secrets].find((n) => n.startsWith(`${v.secret.secretName}-`) && /-[a-z0-9]{10}$/.test(n));
      if (generated && !secrets.has(v.secret.secretName)) {
        fail(what, `volume ${v.name}: Secret ${v.secret.secretName} is not in the render, which generates ${generated} instead`);
      }
      if (v.configMap && !configMaps.has(v.configMap.name) && !v.configMap.optional) {
        fail(what, `volume ${v.name}: ConfigMap ${v.configMap.name} is not in the render`);
      }
    }
    const containers = pod.containers || [];
    for (const c of containers) {
      const env = effectiveEnv(c, configMaps, `${what} container ${c.name}`);
      if (!envs.has(w)) envs.set(w, { container: c, env });
      if (tmplLabels["app.kubernetes.io/name"] === "onlineps") checkContainer(w, pod, c, env);
      else checkOtherContainer(w, c);
    }
    if (!pdbs.some((p) => p.metadata.namespace === w.metadata.namespace && subset(p.spec?.selector?.matchLabels, tmplLabels))) {
      fail(what, "no PodDisruptionBudget selects its pods");
    }
    const replicas = w.spec.replicas ?? 1;
    if (!Number.isInteger(replicas) || replicas < 1) fail(what, `replicas ${JSON.stringify(w.spec.replicas)} is not a positive integer`);
    checkStrategy(w, what);
  }

  // Every Service selects some workload's pods and its named targetPorts exist there.
  for (const s of services) {
    const what = id(s);
    const targets = workloads.filter(
      (w) => w.metadata.namespace === s.metadata.namespace && subset(s.spec?.selector, w.spec.template.metadata?.labels),
    );
    if (targets.length === 0) {
      fail(what, "selector matches no workload's pods");
      continue;
    }
    for (const p of s.spec.ports || []) {
      if (typeof p.targetPort !== "string") continue;
      const ok = targets.some((w) => (w.spec.template.spec.containers || []).some((c) => portOf(c, p.targetPort) !== undefined));
      if (!ok) fail(what, `targetPort ${p.targetPort} is not a container port of the selected pods`);
    }
  }
  const headless = (name, ns) =>
    services.find((s) => s.metadata.name === name && s.metadata.namespace === ns && s.spec?.clusterIP === "None");

  // PS shards: StatefulSet + headless Service + shard index + checkpoint volume.
  const psSets = component("ps");
  if (psSets.length !== 1 || psSets[0].kind !== "StatefulSet") {
    fail("render", `expected one StatefulSet with component ps, found ${psSets.map(id).join(", ") || "none"}`);
  }
  const ps = psSets.find((w) => w.kind === "StatefulSet");
  let expectedShards = null;
  let layout = null;
  if (ps) {
    const what = id(ps);
    const ns = ps.metadata.namespace;
    const svc = headless(ps.spec.serviceName, ns);
    if (!svc) fail(what, `serviceName ${ps.spec.serviceName} does not name a headless Service (clusterIP: None) in ${ns}`);
    else {
      if (svc.spec.publishNotReadyAddresses !== true) fail(id(svc), "publishNotReadyAddresses is not true (shards must resolve before Ready)");
      if (!subset(svc.spec.selector, ps.spec.template.metadata.labels)) fail(id(svc), "selector does not match the StatefulSet's pods");
    }
    if (ps.spec.podManagementPolicy !== "Parallel") fail(what, "podManagementPolicy is not Parallel");
    const { container: c, env } = envs.get(ps) || {};
    if (c) {
      const replicas = ps.spec.replicas ?? 1;
      // Unreplicated: pod i is shard i. Replicated (replication.mjs): pod p is replica
      // p % R of shard p / R, R = the pod annotation onlineps.io/replicas-per-shard.
      layout = psLayout(ps, { fail, id });
      const r = layout.r;
      if (r === 1 && String(env.ONLINEPS_NUM_SHARDS) !== String(replicas)) {
        fail(what, `ONLINEPS_NUM_SHARDS ${env.ONLINEPS_NUM_SHARDS} != replicas ${replicas}`);
      }
      if (r > 1 && Number(env.ONLINEPS_NUM_SHARDS) * r !== replicas) {
        fail(what, `ONLINEPS_NUM_SHARDS ${env.ONLINEPS_NUM_SHARDS} x ${r} replicas per shard != replicas ${replicas}`);
      }
      const idx = env.ONLINEPS_SHARD_INDEX;
      if (r === 1 && (!isObj(idx) || idx.from?.fieldRef?.fieldPath !== "metadata.labels['apps.kubernetes.io/pod-index']")) {
        fail(what, "ONLINEPS_SHARD_INDEX does not come from the downward API label apps.kubernetes.io/pod-index");
      }
      const listenPort = endpointPort(env.ONLINEPS_LISTEN);
      if (!/^tcp:\/\/(0\.0\.0\.0|\*):[0-9]+$/.test(env.ONLINEPS_LISTEN || "")) {
        fail(what, `ONLINEPS_LISTEN ${env.ONLINEPS_LISTEN} does not bind all addresses (tcp://0.0.0.0:PORT)`);
      }
      if (listenPort !== portOf(c, "zmq")) fail(what, `ONLINEPS_LISTEN port ${listenPort} != containerPort zmq ${portOf(c, "zmq")}`);
      const endpoint = (i) => `tcp://${ps.metadata.name}-${i}.${ps.spec.serviceName}:${listenPort}`;
      // Shards separated by `,`, the replicas of a shard by `|`, all in order.
      expectedShards = Array.from({ length: Math.ceil(replicas / r) }, (_, s) =>
        Array.from({ length: r }, (_, i) => endpoint(s * r + i)).join("|"),
      );
      const dir = env.ONLINEPS_CHECKPOINT_DIR;
      const claims = new Set((ps.spec.volumeClaimTemplates || []).map((t) => t.metadata?.name));
      const mount = (c.volumeMounts || []).find((m) => m.mountPath === dir);
      if (!dir) fail(what, "ONLINEPS_CHECKPOINT_DIR is not set");
      else if (!mount || !claims.has(mount.name)) fail(what, `checkpoint dir ${dir} is not on a volumeClaimTemplate`);
      if (env.ONLINEPS_SHARDS !== undefined && env.ONLINEPS_SHARDS !== expectedShards.join(",")) {
        fail(what, `ONLINEPS_SHARDS ${env.ONLINEPS_SHARDS} != ${expectedShards.join(",")}`);
      }
    }
  }

  // Workers: --ps names every shard in order; Deployment + headless Service; GPU settings.
  const workers = component("worker");
  if (workers.length === 0) fail("render", "no workload with component worker");
  for (const w of workers) {
    const what = id(w);
    const { container: c, env } = envs.get(w) || {};
    if (!c) continue;
    if (expectedShards && env.ONLINEPS_PS !== expectedShards.join(",")) {
      const how = layout?.r > 1 ? "every shard's replicas (`|` between them) in order" : "every shard in order";
      fail(what, `ONLINEPS_PS ${env.ONLINEPS_PS} does not name ${how}: expected ${expectedShards.join(",")}`);
    }
    const rpc = portOf(c, "tcp-rpc");
    if (endpointPort(env.ONLINEPS_LISTEN) !== rpc || !/^tcp:\/\/(0\.0\.0\.0|\*):/.test(env.ONLINEPS_LISTEN || "")) {
      fail(what, `ONLINEPS_LISTEN ${env.ONLINEPS_LISTEN} is not tcp://0.0.0.0:<containerPort tcp-rpc ${rpc}>`);
    }
    const device = String(env.ONLINEPS_DEVICE ?? "cpu");
    const gpus = Number(c.resources?.limits?.["nvidia.com/gpu"] ?? 0);
    if (device.startsWith("cuda") && gpus < 1) fail(what, `ONLINEPS_DEVICE ${device} but no nvidia.com/gpu limit`);
    if (!device.startsWith("cuda") && gpus > 0) fail(what, `nvidia.com/gpu limit ${gpus} but ONLINEPS_DEVICE ${device}`);
    if (device.startsWith("cuda") && !/cuda/.test(c.image || "")) fail(what, `ONLINEPS_DEVICE ${device} with image ${c.image} (not a CUDA image)`);
  }

  // Bridge: finds workers through a headless Service, binds 0.0.0.0, accepts its
  // Service's DNS names, reads tokens from a mounted Secret.
  const bridges = component("mcp-bridge");
  if (bridges.length === 0) fail("render", "no workload with component mcp-bridge");
  for (const b of bridges) {
    const what = id(b);
    const ns = b.metadata.namespace;
    const { container: c, env } = envs.get(b) || {};
    if (!c) continue;
    const dns = /^([a-z0-9.-]+):([0-9]+)$/.exec(env.ONLINEPS_WORKERS_DNS || "");
    if (!dns) fail(what, `ONLINEPS_WORKERS_DNS ${env.ONLINEPS_WORKERS_DNS} is not HOST:PORT`);
    else {
      const svc = headless(dns[1].split(".")[0], ns);
      if (!svc) fail(what, `ONLINEPS_WORKERS_DNS host ${dns[1]} is not a headless Service in ${ns}`);
      else {
        if (!(svc.spec.ports || []).some((p) => p.port === Number(dns[2]))) fail(what, `Service ${dns[1]} has no port ${dns[2]}`);
        if (!workers.some((w) => subset(svc.spec.selector, w.spec.template.metadata.labels))) {
          fail(what, `Service ${dns[1]} does not select the worker pods`);
        }
      }
    }
    if (env.ONLINEPS_HOST !== "0.0.0.0") fail(what, `ONLINEPS_HOST ${env.ONLINEPS_HOST} (in-cluster the bridge must bind 0.0.0.0)`);
    const mcpPort = portOf(c, "http-mcp");
    if (String(env.ONLINEPS_PORT) !== String(mcpPort)) fail(what, `ONLINEPS_PORT ${env.ONLINEPS_PORT} != containerPort http-mcp ${mcpPort}`);
    const allowed = String(env.ONLINEPS_ALLOWED_HOSTS || "").split(",");
    const front = services.filter(
      (s) => s.metadata.namespace === ns && s.spec?.clusterIP !== "None" && subset(s.spec?.selector, b.spec.template.metadata.labels),
    );
    if (front.length === 0) fail(what, "no ClusterIP Service selects the bridge");
    for (const s of front) {
      for (const h of [s.metadata.name, `${s.metadata.name}.${ns}.svc`, `${s.metadata.name}.${ns}.svc.cluster.local`]) {
        if (!allowed.includes(h)) fail(what, `ONLINEPS_ALLOWED_HOSTS lacks ${h} (Service ${s.metadata.name} in namespace ${ns})`);
      }
    }
    // Where the file comes from: curve.mjs (with the CURVE key files).
    if (!env.ONLINEPS_TOKENS_FILE) fail(what, "ONLINEPS_TOKENS_FILE is not set (bearer tokens from a Secret)");
  }

  // Files from Secrets: the bridge's tokens and the CURVE keys (curve.mjs).
  const secretObjects = new Map(byKind("Secret").map((o) => [o.metadata.name, o]));
  const replicated = layout?.r > 1;
  checkSecretFiles({ fail, id, env: (w) => envs.get(w)?.env, secrets: secretObjects, configMaps, ps, workers, bridges, replicated });

  // Replicated shards (replication.mjs) and an etcd in the render (etcd.mjs).
  const ctx = { fail, id, subset, objects, byKind, workloads, services, pdbs, configMaps, envs, ps, layout, workers };
  checkReplication(ctx);
  checkEtcd(ctx);

  return [...problems];
}

function main() {
  let args;
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (err) {
    console.error(`checks.mjs: ${err.message}\n${USAGE}`);
    process.exit(2);
  }
  const objects = load(args.files);
  const found = checkManifests(objects, { external: args.external });
  if (found.length > 0) {
    for (const p of found) console.error(`checks.mjs: ${p}`);
    console.error(`checks.mjs: ${found.length} problem(s)`);
    process.exit(1);
  }
  const workloads = objects.filter((o) => WORKLOAD_KINDS.has(o.kind));
  console.log(`checks.mjs: ${objects.length} object(s), ${workloads.length} workload(s): structure ok`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) main();
