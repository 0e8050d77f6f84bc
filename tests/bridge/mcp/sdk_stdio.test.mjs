// The official MCP TypeScript SDK (v1 line) over stdio: StdioClientTransport spawns
// onlineps_mcp_bridge --transport stdio against a PS shard and one worker started here.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { after, before, test } from "node:test";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { LATEST_PROTOCOL_VERSION } from "@modelcontextprotocol/sdk/types.js";

import {
  LABELS, NEGATIVE_PROBE, NEGATIVE_TRAIN, POSITIVE_PROBE, bin, isAlive, sentimentExamples,
  startCluster, textJson, trackPid,
} from "./cluster.mjs";

const TOOLS = ["infer", "learn", "set_context", "append_context", "clear_context", "get_context",
  "model_info"];
const T = { timeout: 30000 };

let cluster;
let client;
let transport;
let bridgePid;
let untrack = () => {};
const stderrTail = [];
const clientErrors = [];
const sent = [];
const received = [];

function bridgeLog() {
  return stderrTail.join("");
}

async function ok(name, args = {}) {
  const r = await client.callTool({ name, arguments: args }, undefined, { timeout: 20000 });
  assert.notEqual(r.isError, true, `${name}(${JSON.stringify(args)}) failed: ${JSON.stringify(r.content)}`);
  assert.ok(r.structuredContent && typeof r.structuredContent === "object");
  assert.deepEqual(textJson(r), r.structuredContent);
  return r.structuredContent;
}

function assertScores(scores, what) {
  assert.deepEqual(Object.keys(scores).sort(), [...LABELS].sort(), `${what}: score keys`);
  const sum = LABELS.reduce((s, l) => s + scores[l], 0);
  assert.ok(Math.abs(sum - 1) < 1e-4, `${what}: scores sum to ${sum}`);
}

before(async () => {
  cluster = await startCluster({ workers: 1, bridge: false });
  transport = new StdioClientTransport({
    command: bin("onlineps_mcp_bridge"),
    args: cluster.bridgeArgs(["--transport", "stdio"]),
    stderr: "pipe",
  });
  // Logs go to stderr; keep the end for failure messages.
  transport.stderr.on("data", (d) => {
    stderrTail.push(d.toString());
    if (stderrTail.length > 50) stderrTail.shift();
  });
  // Record the JSON-RPC traffic (the v1 client does not expose the negotiated version on stdio).
  const start = transport.start.bind(transport);
  const send = transport.send.bind(transport);
  transport.start = async () => {
    const onmessage = transport.onmessage;
    transport.onmessage = (m, extra) => {
      received.push(m);
      onmessage?.(m, extra);
    };
    return start();
  };
  transport.send = async (m, opts) => {
    sent.push(m);
    return send(m, opts);
  };
  client = new Client({ name: "sdk-stdio", version: "0.0.1" });
  client.onerror = (err) => clientErrors.push(String(err?.message ?? err));
  try {
    await client.connect(transport, { timeout: 30000 });
  } catch (err) {
    throw new Error(`stdio connect failed: ${err}\nbridge stderr:\n${bridgeLog()}`);
  }
  bridgePid = transport.pid;
  untrack = trackPid(bridgePid);
});

after(async () => {
  await client?.close().catch(() => {});
  if (cluster) await cluster.stop();
});

test("initialize over stdio", T, async () => {
  assert.ok(bridgePid && isAlive(bridgePid), "bridge process runs");
  const init = sent.find((m) => m.method === "initialize");
  assert.equal(init?.params?.protocolVersion, LATEST_PROTOCOL_VERSION);
  const reply = received.find((m) => m.id === init.id);
  assert.equal(reply?.result?.protocolVersion, LATEST_PROTOCOL_VERSION,
    `initialize result ${JSON.stringify(reply)}`);
  assert.ok(sent.some((m) => m.method === "notifications/initialized"), "initialized sent");
  const info = client.getServerVersion();
  assert.ok(info?.name && info?.version, `serverInfo ${JSON.stringify(info)}`);
  assert.ok(client.getServerCapabilities()?.tools, "tools capability");
  await client.ping();
});

test("tools/list over stdio", T, async () => {
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), [...TOOLS].sort());
  for (const t of tools) {
    assert.equal(t.inputSchema?.type, "object", `${t.name} inputSchema`);
    assert.equal(t.outputSchema?.type, "object", `${t.name} outputSchema`);
  }
  assert.equal(tools.find((t) => t.name === "infer").inputSchema.properties.session["x-mcp-header"],
    "Session");
});

let baseline;

test("infer over stdio", T, async () => {
  const r = await ok("infer", { text: "an ordinary film" });
  assert.ok(LABELS.includes(r.label), `label ${r.label}`);
  assertScores(r.scores, "infer");
  assert.ok(Number.isInteger(r.model_version));
  const b = await ok("infer", { examples: [{ text: POSITIVE_PROBE }, { text: NEGATIVE_PROBE }] });
  assert.equal(b.predictions.length, 2);
  baseline = b.predictions.map((p) => p.scores);
});

test("learn over stdio", T, async () => {
  let version = (await ok("model_info")).model_version;
  const examples = sentimentExamples();
  for (let round = 0; round < 30; round++) {
    const r = await ok("learn", { examples });
    assert.equal(r.outcome, "applied");
    assert.equal(r.examples, examples.length);
    assert.ok(r.model_version > version, `model_version ${r.model_version} after ${version}`);
    version = r.model_version;
  }
  const b = await ok("infer", { examples: [{ text: POSITIVE_PROBE }, { text: NEGATIVE_PROBE }] });
  const [pos, neg] = b.predictions.map((p) => p.scores);
  assert.ok(pos.positive > baseline[0].positive, `P(pos) ${baseline[0].positive} -> ${pos.positive}`);
  assert.ok(neg.negative > baseline[1].negative, `P(neg) ${baseline[1].negative} -> ${neg.negative}`);
  assert.ok(b.model_version >= version);
});

test("set/get/clear context over stdio", T, async () => {
  const before = (await ok("infer", { text: "the film" })).scores;
  assert.equal((await ok("get_context")).found, false, "no context yet");
  const items = NEGATIVE_TRAIN.slice(0, 3);
  const set = await ok("set_context", { items });
  assert.deepEqual(set.items, items);
  const got = await ok("get_context");
  assert.equal(got.found, true);
  assert.deepEqual(got.items, items);
  const withCtx = (await ok("infer", { text: "the film" })).scores;
  assert.ok(withCtx.negative > before.negative,
    `negative context raises P(negative): ${before.negative} -> ${withCtx.negative}`);
  // An explicit session handle is a different context.
  const other = (await ok("infer", { session: `other-${process.pid}`, text: "the film" })).scores;
  for (const l of LABELS) assert.ok(Math.abs(other[l] - before[l]) < 1e-5, "other handle unaffected");
  assert.equal((await ok("clear_context")).cleared, true);
  assert.equal((await ok("get_context")).found, false);
});

test("bad arguments over stdio are isError results", T, async () => {
  const r = await client.callTool({ name: "infer", arguments: { txt: "x" } });
  assert.equal(r.isError, true);
  assert.match(r.content.map((c) => c.text).join(" "), /txt/);
});

test("closing stdin ends the bridge", T, async () => {
  assert.deepEqual(clientErrors, [], `client errors; bridge stderr:\n${bridgeLog()}`);
  const t0 = Date.now();
  await client.close();
  const ms = Date.now() - t0;
  client = undefined;
  // The SDK sends SIGTERM only after waiting 2 s for an exit on EOF.
  assert.ok(ms < 2000, `bridge took ${ms} ms to exit after stdin closed\n${bridgeLog()}`);
  for (let i = 0; i < 50 && isAlive(bridgePid); i++) await new Promise((r) => setTimeout(r, 100));
  assert.equal(isAlive(bridgePid), false, "bridge process gone");
  untrack();
});

test("SIGTERM with stdin still open ends the bridge with status 0", T, async () => {
  const child = spawn(bin("onlineps_mcp_bridge"), cluster.bridgeArgs(["--transport", "stdio"]), {
    stdio: ["pipe", "pipe", "pipe"],
  });
  const stopUntrack = trackPid(child.pid);
  let out = "";
  child.stdout.on("data", (d) => (out += d.toString()));
  child.stderr.resume();
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  child.stdin.write(JSON.stringify({ jsonrpc: "2.0", id: 0, method: "ping" }) + "\n");
  child.stdin.write(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize",
    params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "t", version: "0" } } }) + "\n");
  for (let i = 0; i < 100 && !out.includes("\n"); i++) await new Promise((r) => setTimeout(r, 50));
  for (let i = 0; i < 100 && !out.includes("protocolVersion"); i++) await new Promise((r) => setTimeout(r, 50));
  assert.match(out, /^\{"id":0,"jsonrpc":"2.0","result":\{\}\}$/m, "ping before initialize answered");
  assert.match(out, /"protocolVersion":"2025-11-25"/, "initialize answered before the signal");
  const t0 = Date.now();
  child.kill("SIGTERM");  // stdin stays open
  const { code, signal } = await Promise.race([
    exited, new Promise((r) => setTimeout(() => r({ code: "timeout" }), 5000))]);
  assert.equal(code, 0, `exit code (signal ${signal}) after ${Date.now() - t0} ms`);
  stopUntrack();
});
