// Rules for an etcd in the render (deploy/k8s/components/etcd), for checks.mjs; not a
// command of its own. For each workload labelled app.kubernetes.io/component: etcd:
// a StatefulSet with an odd number of members, Parallel pods (with OrderedReady the
// second member waits for the first to be Ready, which it never is alone), a headless
// serviceName that publishes not-ready addresses (members meet before any is Ready);
// ETCD_NAME is the pod name; ETCD_INITIAL_CLUSTER names every member by its stable DNS
// name on the peer port, in order, and the advertised URLs use the same names; the
// listen URLs bind all addresses on the ports named client and peer; the data dir is on
// a volumeClaimTemplate; a PodDisruptionBudget keeps the quorum; and a NetworkPolicy
// lets only the PS pods reach the client port and only members the peer port.

const ENV_VAR = /^\$\(([A-Za-z_][A-Za-z0-9_]*)\)$/;

function envOf(c) {
  const env = {};
  for (const e of c.env || []) env[e.name] = e.valueFrom ? { from: e.valueFrom } : String(e.value ?? "");
  return env;
}

const portNumber = (c, name) => (c.ports || []).find((p) => p.name === name)?.containerPort;

// The DNS names of member `pod` behind headless Service `svc` in namespace `ns`.
const memberHosts = (pod, svc, ns) => [`${pod}.${svc}`, `${pod}.${svc}.${ns}`, `${pod}.${svc}.${ns}.svc`, `${pod}.${svc}.${ns}.svc.cluster.local`];

function checkUrls(ctx, what, w, c, env) {
  const name = w.metadata.name;
  const svc = w.spec.serviceName;
  const ns = w.metadata.namespace;
  const client = portNumber(c, "client");
  const peer = portNumber(c, "peer");
  if (client === undefined || peer === undefined) ctx.fail(what, "no container ports named client and peer");
  const nameVar = ENV_VAR.exec(String(env.ETCD_NAME ?? ""))?.[1];
  if (!nameVar || env[nameVar]?.from?.fieldRef?.fieldPath !== "metadata.name") {
    ctx.fail(what, `ETCD_NAME ${JSON.stringify(env.ETCD_NAME)} is not $(VAR) of a variable from metadata.name (the pod name)`);
  }
  const replicas = w.spec.replicas ?? 1;
  const cluster = String(env.ETCD_INITIAL_CLUSTER ?? "").split(",");
  const suffix = (i) => memberHosts(`${name}-${i}`, svc, ns).map((h) => h.slice(`${name}-${i}`.length));
  const forms = suffix(0).filter((s) => cluster.length === replicas &&
    cluster.every((m, i) => m === `${name}-${i}=http://${name}-${i}${s}:${peer}`));
  if (forms.length === 0) {
    ctx.fail(what, `ETCD_INITIAL_CLUSTER ${JSON.stringify(env.ETCD_INITIAL_CLUSTER)} does not name the ${replicas} members in order: ` +
      Array.from({ length: replicas }, (_, i) => `${name}-${i}=http://${name}-${i}.${svc}:${peer}`).join(","));
  }
  const s = forms[0] ?? `.${svc}`;
  for (const [key, port] of [["ETCD_INITIAL_ADVERTISE_PEER_URLS", peer], ["ETCD_ADVERTISE_CLIENT_URLS", client]]) {
    if (nameVar && env[key] !== `http://$(${nameVar})${s}:${port}`) {
      ctx.fail(what, `${key} ${JSON.stringify(env[key])} is not http://$(${nameVar})${s}:${port} (the member's own stable name)`);
    }
  }
  for (const [key, port] of [["ETCD_LISTEN_PEER_URLS", peer], ["ETCD_LISTEN_CLIENT_URLS", client]]) {
    if (!String(env[key] ?? "").split(",").includes(`http://0.0.0.0:${port}`)) ctx.fail(what, `${key} ${JSON.stringify(env[key])} does not include http://0.0.0.0:${port}`);
  }
}

function checkMember(ctx, w) {
  const what = ctx.id(w);
  if (w.kind !== "StatefulSet") {
    ctx.fail(what, "etcd runs as a StatefulSet (a stable name and a volume per member)");
    return;
  }
  const replicas = w.spec.replicas ?? 1;
  if (replicas % 2 !== 1) ctx.fail(what, `${replicas} members: use an odd number (an even one tolerates no more failures than one fewer)`);
  if (w.spec.podManagementPolicy !== "Parallel") ctx.fail(what, "podManagementPolicy is not Parallel: with OrderedReady the second member waits for the first, which is never Ready alone");
  const svc = ctx.services.find((s) => s.metadata.name === w.spec.serviceName && s.metadata.namespace === w.metadata.namespace);
  if (!svc || svc.spec?.clusterIP !== "None") ctx.fail(what, `serviceName ${w.spec.serviceName} is not a headless Service`);
  else if (svc.spec.publishNotReadyAddresses !== true) ctx.fail(ctx.id(svc), "publishNotReadyAddresses is not true: etcd members must resolve each other before any is Ready");
  const c = (w.spec.template.spec.containers || [])[0];
  if (!c) return;
  const env = envOf(c);
  checkUrls(ctx, `${what} container ${c.name}`, w, c, env);
  if (!c.startupProbe && !c.livenessProbe?.initialDelaySeconds) ctx.fail(`${what} container ${c.name}`, "no startupProbe (a member waits for its peers at start)");
  const dir = String(env.ETCD_DATA_DIR ?? "");
  const claims = new Set((w.spec.volumeClaimTemplates || []).map((t) => t.metadata?.name));
  const mount = (c.volumeMounts || []).find((m) => dir === m.mountPath || dir.startsWith(m.mountPath.replace(/\/?$/, "/")));
  if (!dir || !mount || !claims.has(mount.name)) ctx.fail(`${what} container ${c.name}`, `ETCD_DATA_DIR ${JSON.stringify(dir)} is not on a volumeClaimTemplate`);
  for (const p of ctx.pdbs.filter((p) => ctx.subset(p.spec?.selector?.matchLabels, w.spec.template.metadata.labels))) {
    const quorum = Math.floor(replicas / 2) + 1;
    const max = p.spec.maxUnavailable;
    if (max !== undefined ? !(max >= 1 && replicas - max >= quorum) : !(p.spec.minAvailable >= quorum)) {
      ctx.fail(ctx.id(p), `does not keep a quorum of ${quorum} of the ${replicas} etcd members`);
    }
  }
  checkPolicy(ctx, w, c);
}

// Resolves a NetworkPolicy port (number or name) against container c.
const policyPort = (c, port) => (typeof port === "string" ? portNumber(c, port) : port);

function checkPolicy(ctx, w, c) {
  const labels = w.spec.template.metadata.labels;
  const ns = w.metadata.namespace;
  const policies = ctx.byKind("NetworkPolicy").filter((p) => p.metadata.namespace === ns && ctx.subset(p.spec?.podSelector?.matchLabels, labels));
  if (policies.length === 0) {
    ctx.fail(ctx.id(w), "no NetworkPolicy selects the etcd pods: every pod in the cluster could write the shards' elections");
    return;
  }
  const client = portNumber(c, "client");
  const peer = portNumber(c, "peer");
  const psLabels = ctx.ps?.spec.template.metadata.labels;
  const allowed = { client: false, peer: false };
  for (const pol of policies) {
    const what = ctx.id(pol);
    if (!(pol.spec.policyTypes || ["Ingress"]).includes("Ingress")) ctx.fail(what, "policyTypes lacks Ingress");
    for (const rule of pol.spec.ingress || []) {
      const from = rule.from || [];
      const ports = (rule.ports || []).map((p) => policyPort(c, p.port));
      if (from.length === 0) {
        ctx.fail(what, "an ingress rule without `from` admits every pod and address");
        continue;
      }
      for (const peerSel of from) {
        const sel = peerSel.podSelector?.matchLabels;
        const ps = psLabels && ctx.subset(sel, psLabels);
        const member = ctx.subset(sel, labels);
        if (peerSel.ipBlock || peerSel.namespaceSelector || !(ps || member)) {
          ctx.fail(what, `ingress from ${JSON.stringify(peerSel)}: only the PS pods and the etcd members may reach etcd`);
          continue;
        }
        if (ps && (ports.length === 0 || ports.some((p) => p !== client))) ctx.fail(what, `the PS pods may reach ports ${ports.join(",") || "all"}, not only the client port ${client}`);
        if (ps && ports.includes(client)) allowed.client = true;
        if (member && ports.includes(peer)) allowed.peer = true;
      }
    }
  }
  if (!allowed.client) ctx.fail(ctx.id(w), `no NetworkPolicy lets the PS pods reach the client port ${client}`);
  if (!allowed.peer) ctx.fail(ctx.id(w), `no NetworkPolicy lets the members reach each other's peer port ${peer}`);
}

// ctx: {fail, id, subset, byKind, workloads, services, pdbs, ps}
export function checkEtcd(ctx) {
  for (const w of ctx.workloads.filter((w) => w.spec?.template?.metadata?.labels?.["app.kubernetes.io/component"] === "etcd")) {
    checkMember(ctx, w);
  }
}
