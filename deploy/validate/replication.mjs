// Rules for replicated PS shards (deploy/k8s/components/replication; docs/reliability.md
// "Shard replication"), for checks.mjs; not a command of its own.
//
// The layout: the PS StatefulSet's pod annotation onlineps.io/replicas-per-shard is R;
// pod p is replica p % R of shard p / R (checks.mjs checks NUM_SHARDS x R = replicas and
// that ONLINEPS_PS / ONLINEPS_SHARDS name every pod in order, `|` within a shard). Here:
// the start script gets the pod index and R from the downward API and computes the
// per-pod values (nothing sets ONLINEPS_SHARD_INDEX / _REPLICA_INDEX / _REPLICAS
// statically); ONLINEPS_ETCD is set and names an etcd Service of the render, unless the
// StatefulSet is annotated onlineps.io/etcd: external; CURVE is on (replication messages
// are accepted only from holders of the shards' key); the PS PodDisruptionBudget lets
// one pod go at a time; --min-insync-replicas fits R and the lease exceeds twice the
// heartbeat (the binary checks these only when it starts, not with --print-config).
// A shard list with `|` but no R annotation is refused too.

export const REPLICAS_PER_SHARD = "onlineps.io/replicas-per-shard";
export const ETCD_EXTERNAL = "onlineps.io/etcd";
const POD_INDEX_PATH = "metadata.labels['apps.kubernetes.io/pod-index']";
const PER_POD = ["ONLINEPS_SHARD_INDEX", "ONLINEPS_REPLICA_INDEX", "ONLINEPS_REPLICAS"];

// {r}: replicas per shard of the PS StatefulSet (1: not replicated).
export function psLayout(ps, { fail, id }) {
  const text = ps.spec.template.metadata?.annotations?.[REPLICAS_PER_SHARD];
  if (text === undefined) return { r: 1 };
  const r = Number(text);
  if (!/^[0-9]+$/.test(String(text)) || r < 2) {
    fail(id(ps), `pod annotation ${REPLICAS_PER_SHARD} ${JSON.stringify(text)} is not a number >= 2`);
    return { r: 1 };
  }
  const replicas = ps.spec.replicas ?? 1;
  if (replicas % r !== 0) fail(id(ps), `replicas ${replicas} is not a multiple of ${REPLICAS_PER_SHARD} ${r}`);
  return { r };
}

const fieldPath = (v) => (v !== null && typeof v === "object" ? v.from?.fieldRef?.fieldPath : undefined);

// http://HOST:PORT or HOST:PORT -> {host, port}, else null.
function etcdEndpoint(text) {
  const m = /^(?:http:\/\/)?([a-z0-9.-]+):([0-9]+)\/?$/.exec(text.trim());
  return m ? { host: m[1], port: Number(m[2]) } : null;
}

// The Service of the render an etcd host name means (svc, svc.ns, svc.ns.svc[.cluster.local],
// or member.svc... of a headless one), or null.
function serviceOf(host, ns, services) {
  const labels = host.split(".");
  const local = (rest) => rest.length === 0 || (rest[0] === ns && (rest.length === 1 || rest.slice(1).join(".") === "svc" || rest.slice(1).join(".") === "svc.cluster.local"));
  const find = (name) => services.find((s) => s.metadata.name === name && s.metadata.namespace === ns);
  if (local(labels.slice(1)) && find(labels[0])) return find(labels[0]);
  const svc = labels.length > 1 && local(labels.slice(2)) ? find(labels[1]) : null;
  return svc && svc.spec?.clusterIP === "None" ? svc : null;
}

function checkEtcdReference(ctx, what, env) {
  const { ps, services, workloads, subset } = ctx;
  if (!env.ONLINEPS_ETCD) {
    ctx.fail(what, "ONLINEPS_ETCD is not set: replicated shards keep membership and elections in etcd (components/etcd, or your own)");
    return;
  }
  const external = ps.metadata.annotations?.[ETCD_EXTERNAL] === "external";
  for (const text of String(env.ONLINEPS_ETCD).split(",")) {
    const e = etcdEndpoint(text);
    if (!e) {
      ctx.fail(what, `ONLINEPS_ETCD endpoint ${JSON.stringify(text)} is not http://HOST:PORT (https is not supported)`);
      continue;
    }
    if (external) continue;
    const svc = serviceOf(e.host, ps.metadata.namespace, services);
    if (!svc) {
      ctx.fail(what, `ONLINEPS_ETCD host ${e.host} is not a Service in the render (for an etcd outside it, annotate the StatefulSet ${ETCD_EXTERNAL}: external)`);
      continue;
    }
    if (!(svc.spec.ports || []).some((p) => p.port === e.port)) ctx.fail(what, `ONLINEPS_ETCD: Service ${svc.metadata.name} has no port ${e.port}`);
    const members = workloads.filter((w) => w.spec.template.metadata?.labels?.["app.kubernetes.io/component"] === "etcd");
    if (!members.some((w) => subset(svc.spec.selector, w.spec.template.metadata.labels))) {
      ctx.fail(what, `ONLINEPS_ETCD: Service ${svc.metadata.name} does not select an etcd workload (app.kubernetes.io/component: etcd)`);
    }
  }
}

function checkFlags(ctx, what, env, r) {
  const num = (name, dflt) => (env[name] === undefined || env[name] === "" ? dflt : Number(env[name]));
  const minInsync = num("ONLINEPS_MIN_INSYNC_REPLICAS", 1);
  if (!(minInsync >= 1 && minInsync <= r)) ctx.fail(what, `ONLINEPS_MIN_INSYNC_REPLICAS ${minInsync} is not between 1 and the ${r} replicas of a shard`);
  const lease = num("ONLINEPS_REPLICA_LEASE_MS", 2000);
  const heartbeat = num("ONLINEPS_REPLICA_HEARTBEAT_MS", 100);
  if (!(lease >= 1000 && lease > 2 * heartbeat)) {
    ctx.fail(what, `ONLINEPS_REPLICA_LEASE_MS ${lease} must be >= 1000 and exceed twice ONLINEPS_REPLICA_HEARTBEAT_MS ${heartbeat}`);
  }
}

function checkPdb(ctx, r) {
  const { ps, pdbs, subset } = ctx;
  const replicas = ps.spec.replicas ?? 1;
  for (const p of pdbs.filter((p) => subset(p.spec?.selector?.matchLabels, ps.spec.template.metadata.labels))) {
    const max = p.spec.maxUnavailable;
    const ok = max !== undefined ? max === 1 : p.spec.minAvailable === replicas - 1;
    if (!ok) {
      ctx.fail(ctx.id(p), `lets more than one PS pod go at a time (maxUnavailable ${max ?? "-"}, minAvailable ${p.spec.minAvailable ?? "-"}): a drain could stop every replica of a shard (R = ${r})`);
    }
  }
}

// ctx: {fail, id, subset, ps, layout, envs, services, workloads, pdbs, configMaps}
export function checkReplication(ctx) {
  const { ps, layout } = ctx;
  if (!ps || !layout) return;
  const what = ctx.id(ps);
  const { container: c, env } = ctx.envs.get(ps) || {};
  if (!c) return;
  const r = layout.r;
  if (r === 1) {
    const grouped = [env.ONLINEPS_SHARDS, ...ctx.workers.map((w) => ctx.envs.get(w)?.env.ONLINEPS_PS)].some((v) => String(v ?? "").includes("|"));
    if (grouped) ctx.fail(what, `the shard lists name replica groups (|) but the pods have no ${REPLICAS_PER_SHARD} annotation (components/replication)`);
    return;
  }
  if (fieldPath(env.POD_INDEX) !== POD_INDEX_PATH) ctx.fail(what, `POD_INDEX does not come from the downward API label apps.kubernetes.io/pod-index (the start script needs it)`);
  if (fieldPath(env.PS_REPLICAS_PER_SHARD) !== `metadata.annotations['${REPLICAS_PER_SHARD}']`) {
    ctx.fail(what, `PS_REPLICAS_PER_SHARD does not come from the pod annotation ${REPLICAS_PER_SHARD} (the start script needs it)`);
  }
  for (const name of PER_POD) {
    if (env[name] !== undefined) ctx.fail(what, `${name} is set for every pod alike; the start script computes it per pod from the pod index`);
  }
  checkEtcdReference(ctx, what, env);
  if (!env.ONLINEPS_CURVE_CERT) {
    ctx.fail(what, "replicated shards need CURVE (components/curve): without it any peer that reaches the shard port can send replication messages");
  }
  checkFlags(ctx, what, env, r);
  checkPdb(ctx, r);
}
