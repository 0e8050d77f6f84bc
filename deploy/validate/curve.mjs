// Rules for files that containers read from mounted Secrets (checks.mjs): the bridge's
// bearer tokens and the CurveZMQ key files of deploy/k8s/components/curve
// (docs/security.md). Exported for checks.mjs; not a command of its own.
//
// For every file a flag's env names (ONLINEPS_TOKENS_FILE, ONLINEPS_CURVE_CERT,
// ONLINEPS_CURVE_SERVER_KEY, ONLINEPS_CURVE_ALLOW): it lies in a volume mounted
// read-only; a certificate (and the tokens) only in a Secret; a Secret volume with
// `items` maps that very file name; files not readable by others need the pod's fsGroup
// (kubelet makes Secret files root-owned, group fsGroup). Across components: CURVE is on
// for the PS, the workers and the bridge or for none of them, and each CURVE client has
// the servers' key. So has every pod where onlineps_ps_cli runs through `kubectl exec`
// (deploy/README.md: the PS pods; the worker image has no onlineps_ps_cli): the exec'd
// CLI gets the container's env, ONLINEPS_CURVE_CERT included, and refuses to run without
// ONLINEPS_CURVE_SERVER_KEY; in a PS container that name is read by the CLI only
// (onlineps_ps has no --curve-server-key: its replicas call each other with its own
// public key). When the
// Secrets are in the render (make-curve-secrets.sh output added to it), their keys must
// fit together: the workers' server key is the PS's public key, the bridge's is the
// workers', the PS container's is the PS's own, each allow list admits its clients, no
// public-key file holds a secret key; the shards' allow list admits their own key when
// the shards are replicated (replicas connect to each other with it, and ZAP would refuse
// them otherwise) or when the CLI runs in the PS pods (it connects with the pod's
// certificate). No ConfigMap may hold a secret key or an ONLINEPS_CURVE_* name.

const CURVE_ENV = ["ONLINEPS_CURVE_CERT", "ONLINEPS_CURVE_SERVER_KEY", "ONLINEPS_CURVE_ALLOW"];
const KEY_LINE = /^\s*(public|secret)-key\s*=\s*"?([^"\s]{40})"?\s*(?:#.*)?$/;
const BARE_KEY = /^([0-9A-Za-z.\-:+=^!/*?&<>()[\]{}@%$#]{40})\s*$/;

// The keys in a key file's text: [{kind: "public"|"secret"|"", key}].
export function keyLines(text) {
  const out = [];
  for (const line of String(text).split(/\r?\n/)) {
    const named = KEY_LINE.exec(line);
    if (named) out.push({ kind: named[1], key: named[2] });
    else if (BARE_KEY.test(line)) out.push({ kind: "", key: line.trim() });
  }
  return out;
}

function secretText(secret, key) {
  if (secret.stringData && key in secret.stringData) return String(secret.stringData[key]);
  if (secret.data && key in secret.data) return Buffer.from(String(secret.data[key]), "base64").toString("utf8");
  return undefined;
}

const dirOf = (path) => path.replace(/\/?$/, "/");

// The volume file `path` of container `c` of workload `w` comes from, or a problem.
// Returns {volume, mount, source: "secret"|"configMap"|other kind, name, key} or
// {problem}.
export function mountedFile(w, c, path) {
  if (typeof path !== "string" || !path.startsWith("/")) return { problem: `${JSON.stringify(path)} is not an absolute path` };
  const mounts = (c.volumeMounts || []).filter((m) => path.startsWith(dirOf(m.mountPath)));
  mounts.sort((a, b) => b.mountPath.length - a.mountPath.length);
  const mount = mounts[0];
  if (!mount) return { problem: `${path} is not inside a mounted volume` };
  const volume = (w.spec.template.spec.volumes || []).find((v) => v.name === mount.name);
  if (!volume) return { problem: `volumeMount ${mount.name} has no volume` };
  let rel = path.slice(dirOf(mount.mountPath).length);
  if (mount.subPath) rel = `${mount.subPath}/${rel}`;
  const src = volume.secret ? "secret" : volume.configMap ? "configMap" : Object.keys(volume).find((k) => k !== "name");
  const ref = volume.secret ?? volume.configMap;
  if (!ref) return { volume, mount, source: src, name: undefined, key: undefined };
  const name = volume.secret ? ref.secretName : ref.name;
  if (Array.isArray(ref.items)) {
    const item = ref.items.find((i) => i.path === rel);
    if (!item) return { problem: `${path}: ${src} volume ${volume.name} has no item with path ${rel}` };
    return { volume, mount, source: src, name, key: item.key, mode: item.mode ?? ref.defaultMode };
  }
  if (rel.includes("/")) return { problem: `${path}: ${rel} is not a key of ${src} ${name}` };
  return { volume, mount, source: src, name, key: rel, mode: ref.defaultMode };
}

// Checks one file an env var names; returns {name, key} of the Secret/ConfigMap or null.
function checkFile(ctx, what, w, c, env, { secretOnly }) {
  const path = ctx.env(w)?.[env];
  const f = mountedFile(w, c, path);
  if (f.problem) {
    ctx.fail(what, `${env}: ${f.problem}`);
    return null;
  }
  if (f.mount.readOnly !== true) ctx.fail(what, `${env}: volumeMount ${f.mount.name} (${f.mount.mountPath}) is not readOnly`);
  if (secretOnly ? f.source !== "secret" : f.source !== "secret" && f.source !== "configMap") {
    ctx.fail(what, `${env}: ${path} is on a ${f.source} volume, not a ${secretOnly ? "Secret" : "Secret or ConfigMap"}`);
    return null;
  }
  const pod = w.spec.template.spec;
  const mode = f.mode ?? 0o644;
  const user = c.securityContext?.runAsUser ?? pod.securityContext?.runAsUser;
  if ((mode & 0o004) === 0 && pod.securityContext?.fsGroup === undefined && user !== 0) {
    ctx.fail(what, `${env}: ${path} has mode 0${mode.toString(8)} but the pod has no fsGroup: the file is root's and user ${user} cannot read it`);
  }
  const objects = f.source === "secret" ? ctx.secrets : ctx.configMaps;
  const obj = objects.get(f.name);
  if (obj) {
    const has = f.source === "secret" ? secretText(obj, f.key) !== undefined : obj.data?.[f.key] !== undefined;
    if (!has) ctx.fail(what, `${env}: ${f.source} ${f.name} has no key ${f.key}`);
  }
  return { source: f.source, name: f.name, key: f.key, obj };
}

function fileKeys(ref) {
  if (!ref?.obj) return null;
  const text = ref.source === "secret" ? secretText(ref.obj, ref.key) : ref.obj.data?.[ref.key];
  return text === undefined ? null : keyLines(text);
}

// ctx: {fail(what, msg), env(workload) -> effective env, secrets: Map, configMaps: Map,
//       ps, workers, bridges, id(object), replicated: the PS runs replica groups}
export function checkSecretFiles(ctx) {
  for (const cm of ctx.configMaps.values()) {
    for (const [k, v] of Object.entries(cm.data || {})) {
      if (CURVE_ENV.includes(k)) {
        ctx.fail(ctx.id(cm), `${k} in a shared ConfigMap: its meaning differs per binary (the bridge's server key is the workers', a worker's the shards'); set it per container`);
      }
      if (keyLines(v).some((l) => l.kind === "secret")) ctx.fail(ctx.id(cm), `key ${k} holds a CURVE secret key: secret keys belong in Secrets`);
    }
  }
  for (const b of ctx.bridges) {
    const c = b.spec.template.spec.containers[0];
    if (ctx.env(b)?.ONLINEPS_TOKENS_FILE) checkFile(ctx, `${ctx.id(b)} container ${c.name}`, b, c, "ONLINEPS_TOKENS_FILE", { secretOnly: true });
  }

  // cli: onlineps_ps_cli runs in these pods (kubectl exec, deploy/README.md) and reads
  // the container's ONLINEPS_CURVE_CERT and ONLINEPS_CURVE_SERVER_KEY.
  const parts = [
    ["PS", ctx.ps ? [ctx.ps] : [], { server: true, client: false, cli: true }],
    ["worker", ctx.workers, { server: true, client: true, cli: false }],
    ["bridge", ctx.bridges, { server: false, client: true, cli: false }],
  ];
  const on = [], off = []; // workloads with and without CURVE
  const files = new Map(); // role -> {cert, server, allow} of its first workload
  for (const [role, workloads, kind] of parts) {
    for (const w of workloads) {
      const c = w.spec.template.spec.containers[0];
      const what = `${ctx.id(w)} container ${c.name}`;
      const env = ctx.env(w) || {};
      const set = CURVE_ENV.filter((k) => env[k] !== undefined && env[k] !== "");
      (set.includes("ONLINEPS_CURVE_CERT") ? on : off).push(ctx.id(w));
      if (set.length === 0) continue;
      if (!set.includes("ONLINEPS_CURVE_CERT")) {
        ctx.fail(what, `${set.join(", ")} without ONLINEPS_CURVE_CERT (the binary refuses to start: CURVE needs its own key pair)`);
        continue;
      }
      if (kind.client && !set.includes("ONLINEPS_CURVE_SERVER_KEY")) {
        ctx.fail(what, `CURVE is on but ONLINEPS_CURVE_SERVER_KEY is not set: the ${role} cannot reach its servers`);
      } else if (kind.cli && !set.includes("ONLINEPS_CURVE_SERVER_KEY")) {
        ctx.fail(what, "CURVE is on but ONLINEPS_CURVE_SERVER_KEY is not set: `kubectl exec ... -- onlineps_ps_cli` in the pod " +
          "(deploy/README.md) gets ONLINEPS_CURVE_CERT and refuses to run without the shards' public key");
      }
      if (!kind.client && !kind.cli && env.ONLINEPS_CURVE_SERVER_KEY) ctx.fail(what, `ONLINEPS_CURVE_SERVER_KEY is set but the ${role} has no --curve-server-key (it connects to no ZeroMQ server)`);
      if (!kind.server && env.ONLINEPS_CURVE_ALLOW) ctx.fail(what, `ONLINEPS_CURVE_ALLOW is set but the ${role} has no --curve-allow (it serves no ZeroMQ clients)`);
      const got = {};
      got.cert = checkFile(ctx, what, w, c, "ONLINEPS_CURVE_CERT", { secretOnly: true });
      if (env.ONLINEPS_CURVE_SERVER_KEY) got.server = checkFile(ctx, what, w, c, "ONLINEPS_CURVE_SERVER_KEY", { secretOnly: false });
      if (env.ONLINEPS_CURVE_ALLOW) got.allow = checkFile(ctx, what, w, c, "ONLINEPS_CURVE_ALLOW", { secretOnly: false });
      if (!files.has(role)) files.set(role, { ...got, what });
    }
  }
  if (on.length > 0 && off.length > 0) {
    ctx.fail("CURVE", `on for ${on.join(", ")} but not for ${off.join(", ")}: a CURVE peer and a plain one get nothing through to each other`);
  }
  checkKeysFit(ctx, files);
}

// With the Secrets' data in the render: do the keys of the components fit together?
function checkKeysFit(ctx, files) {
  const pub = new Map(); // role -> public key of its certificate
  for (const [role, f] of files) {
    const cert = fileKeys(f.cert);
    if (cert) {
      const p = cert.find((l) => l.kind === "public")?.key;
      if (!cert.some((l) => l.kind === "secret")) ctx.fail(f.what, `ONLINEPS_CURVE_CERT (${f.cert.name}/${f.cert.key}) holds no secret-key line`);
      if (p) pub.set(role, p);
    }
    for (const which of ["server", "allow"]) {
      const keys = fileKeys(f[which]);
      if (keys?.some((l) => l.kind === "secret")) {
        ctx.fail(f.what, `${f[which].name}/${f[which].key} (a public-key file) holds a secret key`);
      }
    }
  }
  const expect = (client, server, how) => {
    const f = files.get(client);
    const keys = fileKeys(f?.server);
    if (!keys || !pub.has(server)) return;
    const k = keys.filter((l) => l.kind !== "secret").map((l) => l.key);
    if (k.length !== 1 || k[0] !== pub.get(server)) {
      ctx.fail(f.what, `ONLINEPS_CURVE_SERVER_KEY (${f.server.name}/${f.server.key}) is not the ${how} public key (${pub.get(server)})`);
    }
  };
  expect("worker", "PS", "PS's");
  expect("bridge", "worker", "workers'");
  expect("PS", "PS", "shards' own"); // for onlineps_ps_cli in the PS pods
  const admits = (server, client) => {
    const f = files.get(server);
    const keys = fileKeys(f?.allow);
    if (!keys || !pub.has(client)) return;
    if (!keys.some((l) => l.kind !== "secret" && l.key === pub.get(client))) {
      ctx.fail(f.what, `ONLINEPS_CURVE_ALLOW (${f.allow.name}/${f.allow.key}) does not admit the ${client}'s key ${pub.get(client)}`);
    }
  };
  admits("PS", "worker");
  admits("worker", "bridge");
  // Replicas of a shard are each other's CURVE clients, with the shards' certificate
  // (unless --curve-replica-keys names certificates of their own); so is onlineps_ps_cli
  // run in a PS pod (the pod's certificate, the server key of the PS container).
  const f = files.get("PS");
  const why = [];
  if (ctx.replicated && !ctx.env(ctx.ps)?.ONLINEPS_CURVE_REPLICA_KEYS) why.push("replicas connect to each other with it");
  if (f?.server) why.push("onlineps_ps_cli in a PS pod connects with it");
  const keys = fileKeys(f?.allow);
  if (why.length > 0 && keys && pub.has("PS") && !keys.some((l) => l.kind !== "secret" && l.key === pub.get("PS"))) {
    ctx.fail(f.what, `ONLINEPS_CURVE_ALLOW (${f.allow.name}/${f.allow.key}) does not admit the shards' own key ${pub.get("PS")}: ` +
      `${why.join(", and ")}, and would be refused (make-curve-secrets.sh adds it)`);
  }
}
