#!/usr/bin/env node
// Prints the containerPorts of the onlineps containers of rendered manifests, one per
// line, sorted (tests/system/deploy_lint.sh: every one must be EXPOSEd by the images).
// Containers of other workloads (app.kubernetes.io/name != onlineps, e.g. etcd) run
// other images and are left out.
//
//   node ports.mjs RENDER.yaml...
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const ports = new Set();
for (const f of process.argv.slice(2)) {
  for (const doc of parseAllDocuments(readFileSync(f, "utf8"))) {
    const o = doc.toJS();
    const t = o?.spec?.template;
    if (!["Deployment", "StatefulSet", "DaemonSet"].includes(o?.kind)) continue;
    if (t?.metadata?.labels?.["app.kubernetes.io/name"] !== "onlineps") continue;
    for (const c of t.spec?.containers || []) for (const p of c.ports || []) ports.add(p.containerPort);
  }
}
console.log([...ports].sort((a, b) => a - b).join("\n"));
