#!/usr/bin/env node
// Validates every object of rendered Kubernetes YAML (multi-document) against the
// Kubernetes OpenAPI schemas shipped in kubernetes-models (offline; no API server).
//
//   kubectl kustomize deploy/k8s/overlays/dev | node deploy/validate/validate.mjs
//   node deploy/validate/validate.mjs rendered.yaml [more.yaml ...]
//   node deploy/validate/validate.mjs --allow monitoring.coreos.com/v1/ServiceMonitor rendered.yaml
//
// apiVersion/kind select the model (apps/v1 + StatefulSet ->
// kubernetes-models/apps/v1/StatefulSet). A kind kubernetes-models does not know is an
// error unless allowed with --allow GROUP/VERSION/KIND (or VERSION/KIND for the core
// group); an allowed object is only checked for apiVersion, kind and metadata.name.
// Also refused: YAML errors, documents that are not objects, a missing metadata.name,
// and the same object (apiVersion, kind, namespace, name) twice.
//
// Limits: the schemas catch wrong types, bad enums and missing required fields
// (replicas: "two", port: "abc"), but not unknown fields (a misspelt key passes); the
// structural checks in checks.mjs and yamllint cover part of that.
//
// Exit status: 0 all valid, 1 a problem (each one printed, naming the object), 2 usage.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const USAGE = "usage: validate.mjs [--allow GROUP/VERSION/KIND]... [FILE...]   (no FILE: stdin)";

// Kinds outside kubernetes-models that this repository's manifests may contain. Empty
// on purpose: the onlineps manifests use only built-in kinds. Add CRD kinds here (or
// pass --allow) when an overlay starts using one, e.g. a prometheus-operator
// ServiceMonitor ("monitoring.coreos.com/v1/ServiceMonitor").
const ALLOWED_UNKNOWN = new Set([]);

function parseArgs(argv) {
  const files = [];
  const allowed = new Set(ALLOWED_UNKNOWN);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--allow") {
      if (i + 1 >= argv.length) throw new Error("--allow needs GROUP/VERSION/KIND");
      allowed.add(argv[++i]);
    } else if (a.startsWith("--allow=")) {
      allowed.add(a.slice("--allow=".length));
    } else if (a === "-h" || a === "--help") {
      console.log(USAGE);
      process.exit(0);
    } else if (a === "-") {
      files.push("-");
    } else if (a.startsWith("-")) {
      throw new Error(`unknown option ${a}`);
    } else {
      files.push(a);
    }
  }
  if (files.length === 0) files.push("-");
  return { files, allowed };
}

// apiVersion "apps/v1" or "v1"; group a DNS name, version v1, v1beta1, v2alpha1 ...
const API_VERSION_RE = /^(?:([a-z0-9]([a-z0-9.-]*[a-z0-9])?)\/)?(v[0-9]+(?:(?:alpha|beta)[0-9]+)?)$/;
const KIND_RE = /^[A-Z][A-Za-z0-9]*$/;

const modelCache = new Map();

// The model class for apiVersion/kind, or null when kubernetes-models has none.
async function loadModel(apiVersion, kind) {
  const key = `${apiVersion}/${kind}`;
  if (modelCache.has(key)) return modelCache.get(key);
  let model = null;
  try {
    const mod = await import(`kubernetes-models/${apiVersion}/${kind}`);
    const cls = mod[kind];
    // Guard against a case-insensitive match or a non-model export.
    if (typeof cls === "function" && cls.apiVersion === apiVersion && cls.kind === kind) {
      model = cls;
    }
  } catch (err) {
    const missing = ["ERR_PACKAGE_PATH_NOT_EXPORTED", "ERR_MODULE_NOT_FOUND"];
    if (!missing.includes(err.code)) throw err;
  }
  modelCache.set(key, model);
  return model;
}

// kustomize's secretGenerator (and kubectl) wrap long base64 values at 76 columns in a
// block scalar; the API server's Go base64 decoder skips \r and \n, but the schema's
// "byte" format does not. Validate what the server decodes.
function normalizeBase64Fields(obj) {
  const fields =
    obj.apiVersion === "v1" && obj.kind === "Secret" ? ["data"] :
    obj.apiVersion === "v1" && obj.kind === "ConfigMap" ? ["binaryData"] : [];
  for (const f of fields) {
    const m = obj[f];
    if (!m || typeof m !== "object") continue;
    for (const [k, v] of Object.entries(m)) {
      if (typeof v === "string") m[k] = v.replace(/[\r\n]/g, "");
    }
  }
  return obj;
}

function describe(obj, index, source) {
  const kind = obj && typeof obj.kind === "string" ? obj.kind : "<no kind>";
  const name = obj && obj.metadata && typeof obj.metadata.name === "string" ? obj.metadata.name : "<no name>";
  const ns = obj && obj.metadata && obj.metadata.namespace ? `${obj.metadata.namespace}/` : "";
  return `${source} document ${index + 1} ${kind} ${ns}${name}`;
}

function formatValidationError(err) {
  const details = Array.isArray(err.errors) ? err.errors : [];
  if (details.length === 0) return [err.message || String(err)];
  return details.map((e) => {
    const where = e.instancePath && e.instancePath !== "" ? e.instancePath : "/";
    let msg = `${where}: ${e.message}`;
    if (e.params && e.params.allowedValues) msg += ` (allowed: ${e.params.allowedValues.join(", ")})`;
    return msg;
  });
}

async function validateText(text, source, allowed, seen) {
  const problems = [];
  let objects = 0;
  const docs = parseAllDocuments(text, { prettyErrors: true });
  const list = Array.isArray(docs) ? docs : [docs];
  for (let i = 0; i < list.length; i++) {
    const doc = list[i];
    if (doc.errors && doc.errors.length > 0) {
      for (const e of doc.errors) problems.push(`${source} document ${i + 1}: YAML error: ${e.message}`);
      continue;
    }
    const obj = doc.toJS({ maxAliasCount: 100 });
    if (obj === null || obj === undefined) continue; // empty document (a trailing ---)
    const what = describe(obj, i, source);
    if (typeof obj !== "object" || Array.isArray(obj)) {
      problems.push(`${what}: not a Kubernetes object (a YAML ${Array.isArray(obj) ? "list" : typeof obj})`);
      continue;
    }
    objects++;
    const { apiVersion, kind } = obj;
    if (typeof apiVersion !== "string" || !API_VERSION_RE.test(apiVersion)) {
      problems.push(`${what}: apiVersion ${JSON.stringify(apiVersion)} is not GROUP/VERSION or VERSION`);
      continue;
    }
    if (typeof kind !== "string" || !KIND_RE.test(kind)) {
      problems.push(`${what}: kind ${JSON.stringify(kind)} is not a Kubernetes kind name`);
      continue;
    }
    const meta = obj.metadata;
    if (!meta || typeof meta !== "object" || typeof meta.name !== "string" || meta.name === "") {
      problems.push(`${what}: metadata.name is missing`);
    } else {
      const id = `${apiVersion}|${kind}|${meta.namespace || ""}|${meta.name}`;
      if (seen.has(id)) problems.push(`${what}: defined twice (first: ${seen.get(id)})`);
      else seen.set(id, what);
    }
    const Model = await loadModel(apiVersion, kind);
    if (Model === null) {
      if (!allowed.has(`${apiVersion}/${kind}`)) {
        problems.push(
          `${what}: unknown kind ${apiVersion}/${kind} (not in kubernetes-models; ` +
            `add it to ALLOWED_UNKNOWN in validate.mjs or pass --allow ${apiVersion}/${kind})`,
        );
      }
      continue;
    }
    try {
      new Model(normalizeBase64Fields(obj)).validate();
    } catch (err) {
      for (const line of formatValidationError(err)) problems.push(`${what}: ${line}`);
    }
  }
  return { problems, objects };
}

async function main() {
  let args;
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (err) {
    console.error(`validate.mjs: ${err.message}\n${USAGE}`);
    process.exit(2);
  }
  const seen = new Map();
  const problems = [];
  let objects = 0;
  for (const file of args.files) {
    const source = file === "-" ? "<stdin>" : file;
    let text;
    try {
      text = readFileSync(file === "-" ? 0 : file, "utf8");
    } catch (err) {
      console.error(`validate.mjs: cannot read ${source}: ${err.message}`);
      process.exit(2);
    }
    const r = await validateText(text, source, args.allowed, seen);
    problems.push(...r.problems);
    objects += r.objects;
  }
  if (objects === 0 && problems.length === 0) problems.push("no Kubernetes object in the input");
  if (problems.length > 0) {
    for (const p of problems) console.error(`validate.mjs: ${p}`);
    console.error(`validate.mjs: ${problems.length} problem(s) in ${objects} object(s)`);
    process.exit(1);
  }
  console.log(`validate.mjs: ${objects} object(s) valid`);
}

await main();
