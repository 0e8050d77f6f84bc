#!/usr/bin/env node
// The ONLINEPS_* environment each onlineps container of a render gets, checked against
// the env names the binaries really read, and written out so that tests/deploy_lint.sh
// can feed it to `<binary> --print-config` (which parses flags, env and file exactly as
// at start, then exits without binding anything).
//
//   node podenv.mjs RENDER.yaml HELP_DIR OUT_DIR
//
// HELP_DIR holds `<binary>.help`, the --help text of each binary (it lists
// "(Env:ONLINEPS_...)" for every flag). Refused: an ONLINEPS_* name in a container's
// `env` that its binary does not read, and one in a ConfigMap used by envFrom that no
// binary reads (a misspelt name would otherwise be ignored silently).
// Writes OUT_DIR/<n>.env (KEY=VALUE lines; downward-API values filled in as the
// kubelet would for the first pod) and OUT_DIR/containers (lines "<n> <binary> <what>").
// Exit status: 0 ok, 1 a problem (printed), 2 usage.
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";

const [render, helpDir, outDir] = process.argv.slice(2);
if (!render || !helpDir || !outDir) {
  console.error("usage: podenv.mjs RENDER.yaml HELP_DIR OUT_DIR");
  process.exit(2);
}

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

let n = 0;
for (const w of objects.filter((o) => ["Deployment", "StatefulSet", "DaemonSet"].includes(o.kind))) {
  const podName = w.kind === "StatefulSet" ? `${w.metadata.name}-0` : `${w.metadata.name}-5d9c7b6f4-x2x7q`;
  const podLabels = { ...(w.spec.template.metadata?.labels || {}) };
  if (w.kind === "StatefulSet") {
    podLabels["apps.kubernetes.io/pod-index"] = "0";
    podLabels["statefulset.kubernetes.io/pod-name"] = podName;
  }
  for (const c of w.spec.template.spec.containers || []) {
    const what = `${w.kind} ${w.metadata.name} container ${c.name}`;
    const cmdline = [...(c.command || []), ...(c.args || [])].join(" ");
    const m = /(?:^|[\s/])(onlineps_[a-z_]+)(?=\s|$)/.exec(cmdline);
    if (!m) {
      problems.push(`${what}: no onlineps binary in command/args (${cmdline || "the image's CMD"})`);
      continue;
    }
    const binary = m[1];
    const own = reads.get(binary);
    if (!own) {
      problems.push(`${what}: runs ${binary}, which has no --help in ${helpDir}`);
      continue;
    }
    const env = {};
    for (const src of c.envFrom || []) {
      const cm = src.configMapRef && configMaps.get(src.configMapRef.name);
      if (!cm) continue; // checks.mjs reports missing ConfigMaps
      if (!checkedMaps.has(cm.metadata.name)) {
        checkedMaps.add(cm.metadata.name);
        for (const k of Object.keys(cm.data || {})) {
          if (k.startsWith("ONLINEPS_") && !anyReads.has(k)) {
            problems.push(`ConfigMap ${cm.metadata.name}: ${k} is read by no onlineps binary (misspelt?)`);
          }
        }
      }
      Object.assign(env, cm.data || {});
    }
    for (const e of c.env || []) {
      if (e.name.startsWith("ONLINEPS_") && !own.has(e.name)) {
        problems.push(`${what}: env ${e.name} is not read by ${binary} (no such flag)`);
      }
      if (e.value !== undefined) env[e.name] = String(e.value);
      else if (e.valueFrom?.fieldRef) {
        const path = e.valueFrom.fieldRef.fieldPath;
        const label = /^metadata\.labels\['(.+)'\]$/.exec(path);
        if (path === "metadata.name") env[e.name] = podName;
        else if (path === "metadata.namespace") env[e.name] = w.metadata.namespace || "default";
        else if (label) env[e.name] = podLabels[label[1]] ?? "";
        else env[e.name] = "";
      } else env[e.name] = ""; // secretKeyRef and the like: unknown here
    }
    const bad = Object.entries(env).filter(([, v]) => /[\n\r\0]/.test(String(v)));
    for (const [k] of bad) problems.push(`${what}: env ${k} contains a newline`);
    n++;
    writeFileSync(
      join(outDir, `${n}.env`),
      Object.entries(env).map(([k, v]) => `${k}=${v}`).join("\n") + "\n",
    );
    lines.push(`${n} ${binary} ${w.kind}/${w.metadata.name}/${c.name}`);
  }
}
writeFileSync(join(outDir, "containers"), lines.join("\n") + (lines.length ? "\n" : ""));
if (problems.length > 0) {
  for (const p of problems) console.error(`podenv.mjs: ${p}`);
  process.exit(1);
}
console.log(`podenv.mjs: ${n} container(s), every ONLINEPS_* name is read by its binary`);
