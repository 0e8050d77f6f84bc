#!/usr/bin/env node
// Checks that deploy/prometheus/prometheus.yml gives every PS pod of every render the
// labels the alerts of rules.yml group by: it builds the Kubernetes pod-discovery
// labels each PS pod would have (its template's labels and annotations, the pod-index
// label, the http-metrics port) and runs the relabel_configs of the job that discovers
// pods over them, as Prometheus does (replace, keep, drop; anchored RE2-style regexes,
// `;` separator). Each pod must be kept with job onlineps-ps, pod = its name, shard =
// pod index / R and, when replicated, replicas_per_shard = R (R: the pod annotation
// onlineps.io/replicas-per-shard, else 1). A layout change that misses the per-shard
// rules of prometheus.yml fails here instead of silencing the replication alerts.
//
//   node promshards.mjs PROMETHEUS_YML RENDER.yaml...
//
// Exit status: 0 ok, 1 a problem (printed), 2 usage.
import { readFileSync } from "node:fs";
import { parseAllDocuments, parse } from "yaml";

const [promFile, ...renders] = process.argv.slice(2);
if (!promFile || renders.length === 0) {
  console.error("usage: promshards.mjs PROMETHEUS_YML RENDER.yaml...");
  process.exit(2);
}
const R_ANNOTATION = "onlineps.io/replicas-per-shard";
const problems = [];

const job = (parse(readFileSync(promFile, "utf8")).scrape_configs || []).find((j) =>
  (j.kubernetes_sd_configs || []).some((sd) => sd.role === "pod"));
if (!job) {
  console.error(`promshards.mjs: ${promFile} has no job with kubernetes_sd_configs role pod`);
  process.exit(1);
}

const sanitize = (name) => name.replace(/[^a-zA-Z0-9_]/g, "_");

// Go's regexp.Expand for a replacement: $1, ${1}, $name, ${name}, $$.
function expandReplacement(template, m) {
  return template.replace(/\$(\$|\{(\w+)\}|(\w+))/g, (_, all, braced, bare) => {
    if (all === "$") return "$";
    const name = braced ?? bare;
    const v = /^[0-9]+$/.test(name) ? m[Number(name)] : m.groups?.[name];
    return v ?? "";
  });
}

// One target's labels after relabel_configs, or null when it is dropped.
function relabel(labels, configs) {
  const lb = { ...labels };
  for (const c of configs || []) {
    const action = c.action ?? "replace";
    const value = (c.source_labels || []).map((l) => lb[l] ?? "").join(c.separator ?? ";");
    const re = new RegExp(`^(?:${c.regex ?? "(.*)"})$`);
    const m = re.exec(value);
    if (action === "keep" && !m) return null;
    if (action === "drop" && m) return null;
    if (action === "replace" && m) {
      const res = expandReplacement(String(c.replacement ?? "$1"), m);
      if (res === "") delete lb[c.target_label];
      else lb[c.target_label] = res;
    } else if (!["keep", "drop", "replace"].includes(action)) {
      throw new Error(`relabel action ${action} is not simulated here`);
    }
  }
  return lb;
}

// The discovery labels of pod p of StatefulSet s, for its container port `port`.
function podLabels(s, p, c, port) {
  const t = s.spec.template.metadata || {};
  const name = `${s.metadata.name}-${p}`;
  const podLabelsOf = { ...(t.labels || {}), "apps.kubernetes.io/pod-index": String(p), "statefulset.kubernetes.io/pod-name": name };
  const lb = {
    __address__: `10.0.0.${10 + p}:${port.containerPort}`,
    __meta_kubernetes_namespace: s.metadata.namespace || "default",
    __meta_kubernetes_pod_name: name,
    __meta_kubernetes_pod_phase: "Running",
    __meta_kubernetes_pod_node_name: "node-a",
    __meta_kubernetes_pod_controller_kind: "StatefulSet",
    __meta_kubernetes_pod_controller_name: s.metadata.name,
    __meta_kubernetes_pod_container_name: c.name,
    __meta_kubernetes_pod_container_port_name: port.name ?? "",
    __meta_kubernetes_pod_container_port_number: String(port.containerPort),
  };
  for (const [k, v] of Object.entries(podLabelsOf)) {
    lb[`__meta_kubernetes_pod_label_${sanitize(k)}`] = String(v);
    lb[`__meta_kubernetes_pod_labelpresent_${sanitize(k)}`] = "true";
  }
  for (const [k, v] of Object.entries(t.annotations || {})) {
    lb[`__meta_kubernetes_pod_annotation_${sanitize(k)}`] = String(v);
    lb[`__meta_kubernetes_pod_annotationpresent_${sanitize(k)}`] = "true";
  }
  return lb;
}

let pods = 0;
for (const f of renders) {
  const objects = parseAllDocuments(readFileSync(f, "utf8")).map((d) => d.toJS()).filter(Boolean);
  for (const s of objects.filter((o) => o.kind === "StatefulSet" && o.spec?.template?.metadata?.labels?.["app.kubernetes.io/component"] === "ps")) {
    const r = Number(s.spec.template.metadata.annotations?.[R_ANNOTATION] ?? 1);
    const c = s.spec.template.spec.containers[0];
    const port = (c.ports || []).find((p) => p.name === "http-metrics");
    if (!port) continue; // checks.mjs reports it
    for (let p = 0; p < (s.spec.replicas ?? 1); p++) {
      pods++;
      const what = `${f}: pod ${s.metadata.name}-${p}`;
      const got = relabel(podLabels(s, p, c, port), job.relabel_configs);
      const want = { job: "onlineps-ps", pod: `${s.metadata.name}-${p}`, shard: String(Math.floor(p / r)) };
      if (r > 1) want.replicas_per_shard = String(r);
      if (!got) {
        problems.push(`${what}: dropped by job ${job.job_name}'s relabel_configs`);
        continue;
      }
      for (const [k, v] of Object.entries(want)) {
        if (got[k] !== v) problems.push(`${what}: label ${k} is ${JSON.stringify(got[k])}, expected "${v}" (job ${job.job_name}${k === "shard" ? ": add a shard rule for this layout" : ""})`);
      }
    }
  }
}
if (problems.length > 0) {
  for (const p of problems) console.error(`promshards.mjs: ${p}`);
  process.exit(1);
}
console.log(`promshards.mjs: ${pods} PS pod(s) in ${renders.length} render(s) get job, pod and shard labels`);
