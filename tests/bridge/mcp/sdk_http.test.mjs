// The official MCP TypeScript SDK (v1 line, @modelcontextprotocol/sdk) as a client of
// onlineps_mcp_bridge over Streamable HTTP. Tests in this file run in order and share one
// cluster (1 PS shard, 2 workers, 1 bridge) and its model.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { LATEST_PROTOCOL_VERSION } from "@modelcontextprotocol/sdk/types.js";

import {
  bin, LABELS, NEGATIVE_PROBE, NEGATIVE_TRAIN, POSITIVE_PROBE, Proc, sentimentExamples, startCluster,
  textJson,
} from "./cluster.mjs";

const TOOLS = ["infer", "learn", "set_context", "append_context", "clear_context", "get_context",
  "model_info"];
const LEARN_CHUNK = 32;
const LEARN_ROUNDS = 30; // ~5 ms each; at --lr 1.0 this separates the probes clearly
const T = { timeout: 30000 };

let cluster;
const clients = [];
const clientErrors = [];

async function connect(name) {
  const client = new Client({ name, version: "0.0.1" });
  client.onerror = (err) => clientErrors.push(`${name}: ${err?.message ?? err}`);
  const transport = new StreamableHTTPClientTransport(new URL(cluster.url));
  await client.connect(transport);
  clients.push(client);
  return { client, transport };
}

async function call(client, name, args = {}, options = {}) {
  return client.callTool({ name, arguments: args }, undefined, { timeout: 20000, ...options });
}

async function ok(client, name, args = {}, options = {}) {
  const r = await call(client, name, args, options);
  assert.notEqual(r.isError, true, `${name}(${JSON.stringify(args)}) failed: ${JSON.stringify(r.content)}`);
  assert.ok(r.structuredContent && typeof r.structuredContent === "object",
    `${name} returned no structuredContent`);
  // The same JSON is also a text block.
  assert.deepEqual(textJson(r), r.structuredContent);
  return r.structuredContent;
}

function assertScores(scores, what) {
  assert.deepEqual(Object.keys(scores).sort(), [...LABELS].sort(), `${what}: score keys`);
  let sum = 0;
  for (const l of LABELS) {
    assert.ok(Number.isFinite(scores[l]) && scores[l] >= 0 && scores[l] <= 1,
      `${what}: score ${l}=${scores[l]}`);
    sum += scores[l];
  }
  assert.ok(Math.abs(sum - 1) < 1e-4, `${what}: scores sum to ${sum}`);
}

const argmax = (scores) => LABELS.reduce((a, b) => (scores[b] > scores[a] ? b : a));

async function scoresOf(client, texts, extra = {}) {
  const r = await ok(client, "infer", { examples: texts.map((text) => ({ text })), ...extra });
  assert.equal(r.predictions.length, texts.length);
  return r.predictions.map((p, i) => {
    assert.equal(p.index, LABELS.indexOf(p.label), `prediction ${i}: index matches label`);
    assertScores(p.scores, `prediction ${i}`);
    return p.scores;
  });
}

let A; // { client, transport }: the main session
let B; // a second MCP session on the same bridge

before(async () => {
  cluster = await startCluster({
    workers: 2,
    // Fresh parameter reads so sessions on either worker see the same model.
    workerArgs: ["--dense-max-age-ms", "0", "--sparse-max-age-ms", "0"],
    bridgeArgs: ["--learn-chunk", String(LEARN_CHUNK)],
  });
  A = await connect("sdk-http-a");
  B = await connect("sdk-http-b");
});

after(async () => {
  for (const c of clients) await c.close().catch(() => {});
  if (cluster) await cluster.stop();
});

test("initialize: session id, protocol version, server info", T, async () => {
  const { client, transport } = A;
  assert.match(transport.sessionId ?? "", /^[\x21-\x7e]{16,}$/, "Mcp-Session-Id is visible ASCII");
  assert.notEqual(B.transport.sessionId, transport.sessionId, "two connections, two sessions");
  assert.equal(transport.protocolVersion, LATEST_PROTOCOL_VERSION,
    "bridge accepts the SDK's latest revision");
  const info = client.getServerVersion();
  assert.ok(info?.name && info?.version, `serverInfo ${JSON.stringify(info)}`);
  assert.ok(client.getServerCapabilities()?.tools, "tools capability advertised");
  await client.ping();
});

test("tools/list: 7 tools with input and output schemas", T, async () => {
  const { tools } = await A.client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), [...TOOLS].sort());
  for (const t of tools) {
    assert.equal(t.inputSchema?.type, "object", `${t.name} inputSchema`);
    assert.equal(t.outputSchema?.type, "object", `${t.name} outputSchema`);
    assert.ok(t.description, `${t.name} description`);
  }
  const infer = tools.find((t) => t.name === "infer");
  assert.equal(infer.inputSchema.properties?.session?.type, "string");
  assert.equal(infer.inputSchema.properties.session["x-mcp-header"], "Session");
  for (const t of tools.filter((t) => t.name !== "model_info")) {
    assert.equal(t.inputSchema.properties?.session?.["x-mcp-header"], "Session",
      `${t.name} session is an x-mcp-header`);
  }
  // The second session sees the same list (also primes its output-schema cache).
  const again = await B.client.listTools();
  assert.deepEqual(again.tools, tools);
});

test("infer: one text and a batch", T, async () => {
  const r = await ok(A.client, "infer", { text: "an ordinary film" });
  assert.ok(LABELS.includes(r.label), `label ${r.label}`);
  assertScores(r.scores, "infer");
  assert.equal(r.label, argmax(r.scores), "label is the top score");
  assert.ok(Number.isInteger(r.model_version) && r.model_version >= 0);
  const batch = await scoresOf(A.client, ["an ordinary film", POSITIVE_PROBE, NEGATIVE_PROBE]);
  assert.equal(batch.length, 3);
  for (const l of LABELS) assert.ok(Math.abs(batch[0][l] - r.scores[l]) < 1e-5, "batch = single");
});

test("learn: a small sentiment task moves held-out phrases toward their labels", T, async () => {
  const probes = [POSITIVE_PROBE, NEGATIVE_PROBE];
  const [pos0, neg0] = await scoresOf(A.client, probes);
  const info0 = await ok(A.client, "model_info");
  assert.deepEqual(info0.labels, LABELS);
  assert.equal(info0.workers.length, 2);

  const examples = sentimentExamples();
  let version = info0.model_version;
  const losses = [];
  for (let round = 0; round < LEARN_ROUNDS; round++) {
    const r = await ok(A.client, "learn", { examples });
    assert.equal(r.outcome, "applied", `round ${round}: ${JSON.stringify(r)}`);
    assert.equal(r.examples, examples.length);
    assert.ok(Number.isInteger(r.model_version) && r.model_version > version,
      `round ${round}: model_version ${r.model_version} after ${version}`);
    assert.ok(Number.isFinite(r.loss) && r.loss >= 0, `loss ${r.loss}`);
    version = r.model_version;
    losses.push(r.loss);
  }
  assert.ok(losses.at(-1) < losses[0], `training loss falls: ${losses.join(", ")}`);

  const [pos1, neg1] = await scoresOf(A.client, probes);
  assert.ok(pos1.positive > pos0.positive,
    `positive probe: P(positive) ${pos0.positive} -> ${pos1.positive}`);
  assert.ok(neg1.negative > neg0.negative,
    `negative probe: P(negative) ${neg0.negative} -> ${neg1.negative}`);
  assert.equal(argmax(pos1), "positive", `positive probe ${JSON.stringify(pos1)}`);
  assert.equal(argmax(neg1), "negative", `negative probe ${JSON.stringify(neg1)}`);

  // Session B, possibly on the other worker, reads the same shared model.
  const [posB] = await scoresOf(B.client, [POSITIVE_PROBE]);
  assert.ok(Math.abs(posB.positive - pos1.positive) < 1e-4,
    `B sees the learned model: ${posB.positive} vs ${pos1.positive}`);

  // The single-example form (one of each label, so the bias stays balanced).
  for (const [text, label] of [["wonderful", "positive"], ["awful", "negative"]]) {
    const one = await ok(A.client, "learn", { text, label });
    assert.equal(one.outcome, "applied");
    assert.equal(one.examples, 1);
    assert.ok(one.model_version > version, `single learn: ${one.model_version} after ${version}`);
    version = one.model_version;
  }
  const info1 = await ok(B.client, "model_info");
  assert.ok(info1.model_version >= version, `model_info version ${info1.model_version} >= ${version}`);
});

test("context: set/get/append/clear, scoped to one MCP session", T, async () => {
  const probe = ["the film"];
  const [a0] = await scoresOf(A.client, probe);
  const [b0] = await scoresOf(B.client, probe);
  for (const l of LABELS) assert.ok(Math.abs(a0[l] - b0[l]) < 1e-5, "same model, same scores");

  const empty = await ok(A.client, "get_context");
  assert.equal(empty.found, false);
  assert.deepEqual(empty.items, []);

  const items = NEGATIVE_TRAIN.slice(0, 3);
  const set = await ok(A.client, "set_context", { items });
  assert.equal(set.found, true);
  assert.deepEqual(set.items, items);
  const got = await ok(A.client, "get_context");
  assert.equal(got.found, true);
  assert.deepEqual(got.items, items);
  assert.equal((await ok(B.client, "get_context")).found, false, "B has no context");

  const [a1] = await scoresOf(A.client, probe);
  const [b1] = await scoresOf(B.client, probe);
  assert.ok(a1.negative > a0.negative,
    `negative context raises A's P(negative): ${a0.negative} -> ${a1.negative}`);
  for (const l of LABELS) assert.ok(Math.abs(b1[l] - b0[l]) < 1e-5, `B unchanged: ${b0[l]} -> ${b1[l]}`);

  const app = await ok(A.client, "append_context", { text: "dreadful" });
  assert.deepEqual(app.items, [...items, "dreadful"]);

  const cleared = await ok(A.client, "clear_context");
  assert.equal(cleared.cleared, true);
  assert.equal((await ok(A.client, "get_context")).found, false);
  const [a2] = await scoresOf(A.client, probe);
  for (const l of LABELS) assert.ok(Math.abs(a2[l] - a0[l]) < 1e-5, `A back to ${a0[l]}: ${a2[l]}`);

  // An explicit session handle is shared across MCP sessions.
  const handle = `shared-${process.pid}`;
  await ok(B.client, "set_context", { session: handle, text: "hello there" });
  const seen = await ok(A.client, "get_context", { session: handle });
  assert.equal(seen.found, true);
  assert.deepEqual(seen.items, ["hello there"]);
  assert.equal((await ok(B.client, "get_context")).found, false, "B's own context untouched");
  assert.equal((await ok(A.client, "clear_context", { session: handle })).cleared, true);
});

test("learn: 200 examples report increasing progress", T, async () => {
  const n = 200;
  const examples = Array.from({ length: n }, (_, i) =>
    i % 2 ? { text: `great film number ${i}`, label: "positive" }
      : { text: `awful film number ${i}`, label: "negative" });
  const progress = [];
  const r = await ok(A.client, "learn", { examples }, { onprogress: (p) => progress.push(p) });
  assert.equal(r.outcome, "applied");
  assert.equal(r.examples, n);
  const chunks = Math.ceil(n / LEARN_CHUNK);
  if (r.chunks !== undefined) assert.equal(r.chunks, chunks);
  assert.ok(progress.length >= 2, `progress notifications: ${JSON.stringify(progress)}`);
  assert.ok(progress.length <= chunks, `at most one per chunk: ${progress.length}`);
  for (let i = 1; i < progress.length; i++) {
    assert.ok(progress[i].progress > progress[i - 1].progress,
      `progress increases: ${JSON.stringify(progress)}`);
  }
  for (const p of progress) {
    if (p.total !== undefined) assert.equal(p.total, n);
    assert.ok(p.progress > 0 && p.progress <= n);
  }
  assert.equal(progress.at(-1).progress, n, "last notification reports all examples");
});

// The SDK cancels a call it aborts (or that times out) with notifications/cancelled and
// forgets its id. The bridge answered the cancelled call with a -32800 error, which the
// SDK reported through onerror ("Received a response for an unknown message ID"); the
// spec says a cancelled request gets no response.
test("an aborted call gets no response; the session goes on", T, async () => {
  // A bridge of its own whose learn takes one worker call per example: still running
  // when the cancellation arrives.
  const slow = new Proc("bridge-slow", bin("onlineps_mcp_bridge"),
    cluster.bridgeArgs(["--port", "0", "--learn-chunk", "1", "--max-examples", "3000"]));
  cluster.procs.push(slow);
  const url = await slow.waitForLine("LISTENING ");
  const errors = [];
  const client = new Client({ name: "sdk-http-abort", version: "0.0.1" });
  client.onerror = (err) => errors.push(err?.message ?? String(err));
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  clients.push(client);
  const examples = Array.from({ length: 3000 }, (_, i) => ({ text: `slow ${i}`, label: "positive" }));
  const ac = new AbortController();
  setTimeout(() => ac.abort("enough"), 300);  // a few hundred of its 3000 chunks in
  await assert.rejects(
    client.callTool({ name: "learn", arguments: { examples } }, undefined,
      { signal: ac.signal, timeout: 20000 }));
  // Long enough for the learn to stop at its next chunk and its stream to end.
  await new Promise((resolve) => setTimeout(resolve, 500));
  const r = await client.callTool({ name: "infer", arguments: { text: "after" } });
  assert.notEqual(r.isError, true, JSON.stringify(r));
  assert.deepEqual(errors, []);
});

test("invalid arguments give isError results naming the argument", T, async () => {
  const cases = [
    [{ name: "infer", args: { txt: "hello" } }, /txt/],
    [{ name: "infer", args: { text: 5 } }, /text/],
    [{ name: "infer", args: {} }, /text|features|examples/],
    [{ name: "learn", args: { examples: [{ text: "meh", label: "neutral" }] } }, /neutral|label/],
    [{ name: "set_context", args: { session: "bad session!", text: "x" } }, /session/],
  ];
  for (const [{ name, args }, re] of cases) {
    const r = await call(A.client, name, args);
    assert.equal(r.isError, true, `${name}(${JSON.stringify(args)}) -> ${JSON.stringify(r)}`);
    const text = r.content.filter((c) => c.type === "text").map((c) => c.text).join(" ");
    assert.match(text, re, `${name}(${JSON.stringify(args)}) message`);
  }
  // An unknown tool is a protocol error.
  await assert.rejects(call(A.client, "no_such_tool"), (err) => {
    assert.equal(err.code, -32602, String(err));
    return true;
  });
  // The session still works.
  await ok(A.client, "infer", { text: "still alive" });
});

test("raw Streamable HTTP status codes on a live session", T, async () => {
  const sid = B.transport.sessionId;
  const headers = {
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
    "mcp-session-id": sid,
    "mcp-protocol-version": B.transport.protocolVersion,
  };
  const post = async (body, extra = {}, drop = []) => {
    const h = { ...headers, ...extra };
    for (const k of drop) delete h[k];
    const res = await fetch(cluster.url, { method: "POST", headers: h, body: JSON.stringify(body) });
    return { status: res.status, body: await res.text(), type: res.headers.get("content-type") };
  };
  const list = { jsonrpc: "2.0", id: 41, method: "tools/list" };

  // A notification is accepted with 202 and no body.
  const n = await post({ jsonrpc: "2.0", method: "notifications/initialized" });
  assert.equal(n.status, 202, JSON.stringify(n));
  assert.equal(n.body, "");
  // A request without the session id: 400.
  const noSid = await post(list, {}, ["mcp-session-id"]);
  assert.equal(noSid.status, 400, JSON.stringify(noSid));
  // An unsupported MCP-Protocol-Version: 400.
  const badVer = await post(list, { "mcp-protocol-version": "1999-01-01" });
  assert.equal(badVer.status, 400, JSON.stringify(badVer));
  // A foreign Origin: 403.
  const evil = await post(list, { origin: "http://evil.example.com" });
  assert.equal(evil.status, 403, JSON.stringify(evil));
  // ping answers {}.
  const ping = await post({ jsonrpc: "2.0", id: 42, method: "ping" });
  assert.equal(ping.status, 200);
  assert.deepEqual(JSON.parse(ping.body).result, {});
  // GET: an SSE stream or 405.
  const ac = new AbortController();
  const get = await fetch(cluster.url, {
    method: "GET", signal: ac.signal,
    headers: { accept: "text/event-stream", "mcp-session-id": sid,
      "mcp-protocol-version": headers["mcp-protocol-version"] },
  });
  const getType = get.headers.get("content-type") ?? "";
  ac.abort();
  assert.ok(get.status === 405 || (get.status === 200 && getType.includes("text/event-stream")),
    `GET: ${get.status} ${getType}`);
  // DELETE of an unknown session: 404.
  const del = await fetch(cluster.url, {
    method: "DELETE", headers: { ...headers, "mcp-session-id": "no-such-session-0123456789abcdef" },
  });
  assert.equal(del.status, 404);
  // The session is still fine.
  assert.equal((await post(list)).status, 200);
});

test("DELETE ends the session; its id then gets 404", T, async () => {
  const sid = A.transport.sessionId;
  const version = A.transport.protocolVersion;
  assert.ok(sid);
  await A.transport.terminateSession();
  assert.equal(A.transport.sessionId, undefined, "SDK accepted the DELETE");
  const res = await fetch(cluster.url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-session-id": sid,
      "mcp-protocol-version": version,
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: 99, method: "tools/list" }),
  });
  const body = await res.text();
  assert.equal(res.status, 404, `POST with a terminated session id: ${res.status} ${body}`);
  // The other session is unaffected.
  const r = await ok(B.client, "infer", { text: "after the delete" });
  assert.ok(LABELS.includes(r.label));
});

test("no transport or protocol errors were reported to the clients", async () => {
  assert.deepEqual(clientErrors, []);
});
