// The v2 TypeScript SDK client (@modelcontextprotocol/client) pinned to protocol revision
// 2026-07-28 (stateless core: server/discover, per-request _meta, Mcp-Method/Mcp-Name/Mcp-Param-*
// headers) against onlineps_mcp_bridge over HTTP, plus 'auto' negotiation and stdio.
// Every HTTP exchange is recorded, so a failure message shows what was sent and answered.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

import {
  LABELS, NEGATIVE_PROBE, NEGATIVE_TRAIN, POSITIVE_PROBE, bin, isAlive, sentimentExamples,
  startCluster, textJson, trackPid,
} from "./cluster.mjs";

const MODERN = "2026-07-28";
const TOOLS = ["infer", "learn", "set_context", "append_context", "clear_context", "get_context",
  "model_info"];
const T = { timeout: 30000 };
const PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion";

let cluster;
const clients = [];
const exchanges = []; // { method, headers, body, status, responseHeaders, responseBody }

// fetch that records each exchange (bodies of JSON responses; SSE bodies are left unread).
async function recordingFetch(url, init = {}) {
  const res = await fetch(url, init);
  const entry = {
    method: init.method ?? "GET",
    headers: Object.fromEntries(new Headers(init.headers)),
    body: typeof init.body === "string" ? safeJson(init.body) : init.body,
    status: res.status,
    responseHeaders: Object.fromEntries(res.headers),
  };
  if (!(res.headers.get("content-type") ?? "").includes("text/event-stream")) {
    entry.responseBody = safeJson(await res.clone().text());
  }
  exchanges.push(entry);
  return res;
}

function safeJson(s) {
  try {
    return JSON.parse(s);
  } catch {
    return s;
  }
}

function trace(from = 0) {
  return exchanges.slice(from).map((e) =>
    `>> ${e.method} ${JSON.stringify(e.headers)} ${JSON.stringify(e.body)}\n` +
    `<< ${e.status} ${JSON.stringify(e.responseHeaders)} ${JSON.stringify(e.responseBody ?? "(stream)")}`,
  ).join("\n");
}

async function connect(name, mode = { pin: MODERN }) {
  const client = new Client({ name, version: "0.0.1" }, { versionNegotiation: { mode } });
  const transport = new StreamableHTTPClientTransport(new URL(cluster.url), { fetch: recordingFetch });
  const mark = exchanges.length;
  try {
    await client.connect(transport);
  } catch (err) {
    throw new Error(`${name}: connect (${JSON.stringify(mode)}) failed: ${err}\n${trace(mark)}`);
  }
  clients.push(client);
  return client;
}

async function ok(client, name, args = {}, options = {}) {
  const mark = exchanges.length;
  let r;
  try {
    r = await client.callTool({ name, arguments: args }, { timeout: 20000, ...options });
  } catch (err) {
    throw new Error(`${name}(${JSON.stringify(args)}) threw ${err}\n${trace(mark)}`);
  }
  assert.notEqual(r.isError, true, `${name} failed: ${JSON.stringify(r.content)}\n${trace(mark)}`);
  assert.ok(r.structuredContent && typeof r.structuredContent === "object", trace(mark));
  assert.deepEqual(textJson(r), r.structuredContent);
  return r.structuredContent;
}

const lastPost = (method) => exchanges.findLast((e) => e.method === "POST" && e.body?.method === method);

let M; // the pinned modern client

before(async () => {
  cluster = await startCluster({ workers: 1 });
  M = await connect("sdk-modern");
});

after(async () => {
  for (const c of clients) await c.close().catch(() => {});
  if (cluster) await cluster.stop();
});

test("pinned 2026-07-28 connect: server/discover, modern era", T, async () => {
  assert.equal(M.getProtocolEra(), "modern");
  assert.equal(M.getNegotiatedProtocolVersion(), MODERN);
  const d = exchanges.find((e) => e.body?.method === "server/discover");
  assert.ok(d, `no server/discover sent:\n${trace()}`);
  assert.equal(d.headers["mcp-protocol-version"], MODERN);
  assert.equal(d.headers["mcp-method"], "server/discover");
  assert.equal(d.status, 200, trace());
  assert.ok(!exchanges.some((e) => e.body?.method === "initialize"), "no initialize in modern era");
  const discover = M.getDiscoverResult();
  assert.ok(discover?.supportedVersions?.includes(MODERN), JSON.stringify(discover));
  assert.ok(discover.capabilities?.tools, "tools capability");
  assert.ok(Number.isInteger(discover.ttlMs) && discover.ttlMs >= 0, `ttlMs ${discover.ttlMs}`);
  assert.ok(["public", "private"].includes(discover.cacheScope), `cacheScope ${discover.cacheScope}`);
});

test("modern tools/list", T, async () => {
  const mark = exchanges.length;
  const { tools } = await M.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), [...TOOLS].sort(), trace(mark));
  for (const t of tools) {
    assert.equal(t.inputSchema?.type, "object", `${t.name} inputSchema`);
    assert.equal(t.outputSchema?.type, "object", `${t.name} outputSchema`);
  }
  assert.equal(tools.find((t) => t.name === "infer").inputSchema.properties.session["x-mcp-header"],
    "Session");
  const e = lastPost("tools/list");
  assert.equal(e.headers["mcp-method"], "tools/list");
  assert.equal(e.body.params?._meta?.[PROTOCOL_VERSION_KEY], MODERN, "per-request _meta");
  assert.equal(e.status, 200);
  assert.equal(e.responseBody?.result?.resultType, "complete", "results carry resultType");
});

test("modern infer with a session argument (Mcp-Param-Session)", T, async () => {
  const session = `modern-${process.pid}`;
  const r = await ok(M, "infer", { session, text: "an ordinary film" });
  assert.ok(LABELS.includes(r.label), `label ${r.label}`);
  const sum = LABELS.reduce((s, l) => s + r.scores[l], 0);
  assert.ok(Math.abs(sum - 1) < 1e-4, `scores sum to ${sum}`);
  const e = lastPost("tools/call");
  assert.equal(e.headers["mcp-method"], "tools/call");
  assert.equal(e.headers["mcp-name"], "infer");
  assert.equal(e.headers["mcp-param-session"], session, "x-mcp-header mirrored by the client");
  assert.equal(e.status, 200, trace(exchanges.length - 1));
  // Stateless: no session is minted or echoed.
  assert.ok(!exchanges.some((x) => "mcp-session-id" in x.responseHeaders),
    `Mcp-Session-Id in a modern response:\n${trace()}`);
});

test("modern learn and per-handle context, across connections", T, async () => {
  const s1 = `ctx-a-${process.pid}`;
  const s2 = `ctx-b-${process.pid}`;
  const [p0, n0] = (await ok(M, "infer", {
    session: s1, examples: [{ text: POSITIVE_PROBE }, { text: NEGATIVE_PROBE }],
  })).predictions.map((p) => p.scores);
  let version = -1;
  for (let i = 0; i < 30; i++) {
    const r = await ok(M, "learn", { session: s1, examples: sentimentExamples() });
    assert.equal(r.outcome, "applied");
    assert.ok(r.model_version > version);
    version = r.model_version;
  }
  const [p1, n1] = (await ok(M, "infer", {
    session: s1, examples: [{ text: POSITIVE_PROBE }, { text: NEGATIVE_PROBE }],
  })).predictions.map((p) => p.scores);
  assert.ok(p1.positive > p0.positive, `P(pos) ${p0.positive} -> ${p1.positive}`);
  assert.ok(n1.negative > n0.negative, `P(neg) ${n0.negative} -> ${n1.negative}`);

  const base = (await ok(M, "infer", { session: s1, text: "the film" })).scores;
  const items = NEGATIVE_TRAIN.slice(0, 3);
  assert.deepEqual((await ok(M, "set_context", { session: s1, items })).items, items);
  // A second, independent modern connection sees the context by handle.
  const M2 = await connect("sdk-modern-2");
  const got = await ok(M2, "get_context", { session: s1 });
  assert.equal(got.found, true);
  assert.deepEqual(got.items, items);
  assert.equal((await ok(M2, "get_context", { session: s2 })).found, false);
  const withCtx = (await ok(M2, "infer", { session: s1, text: "the film" })).scores;
  const other = (await ok(M2, "infer", { session: s2, text: "the film" })).scores;
  assert.ok(withCtx.negative > base.negative, `context: ${base.negative} -> ${withCtx.negative}`);
  for (const l of LABELS) assert.ok(Math.abs(other[l] - base[l]) < 1e-5, `${s2} unaffected`);
  assert.equal((await ok(M2, "clear_context", { session: s1 })).cleared, true);
  assert.equal((await ok(M, "get_context", { session: s1 })).found, false);
});

test("modern learn with progress", T, async () => {
  const n = 150;
  const examples = Array.from({ length: n }, (_, i) =>
    ({ text: `film ${i} was ${i % 2 ? "great" : "awful"}`, label: i % 2 ? "positive" : "negative" }));
  const progress = [];
  const r = await ok(M, "learn", { session: `prog-${process.pid}`, examples },
    { onprogress: (p) => progress.push(p) });
  assert.equal(r.examples, n);
  assert.ok(progress.length >= 2, `progress: ${JSON.stringify(progress)}`);
  for (let i = 1; i < progress.length; i++) assert.ok(progress[i].progress > progress[i - 1].progress);
  assert.equal(progress.at(-1).progress, n);
});

test("modern: a context tool without a session handle is an isError result", T, async () => {
  const r = await M.callTool({ name: "get_context", arguments: {} });
  assert.equal(r.isError, true, JSON.stringify(r));
  assert.match(r.content.map((c) => c.text).join(" "), /session/);
});

test("modern: Mcp-Param-Session that differs from arguments.session is rejected", T, async () => {
  const res = await fetch(cluster.url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": MODERN,
      "mcp-method": "tools/call",
      "mcp-name": "infer",
      "mcp-param-session": "not-the-same",
    },
    body: JSON.stringify({
      jsonrpc: "2.0", id: 7, method: "tools/call",
      params: {
        name: "infer", arguments: { session: "sess-1", text: "x" },
        _meta: { [PROTOCOL_VERSION_KEY]: MODERN, "io.modelcontextprotocol/clientCapabilities": {} },
      },
    }),
  });
  const body = await res.text();
  assert.equal(res.status, 400, body);
  assert.equal(JSON.parse(body).error?.code, -32020, body);
});

test("'auto' negotiation picks the modern era", T, async () => {
  const c = await connect("sdk-auto", "auto");
  assert.equal(c.getProtocolEra(), "modern");
  assert.equal(c.getNegotiatedProtocolVersion(), MODERN);
  const r = await ok(c, "infer", { session: `auto-${process.pid}`, text: "fine" });
  assert.ok(LABELS.includes(r.label));
});

test("v2 client in its default legacy mode", T, async () => {
  const c = await connect("sdk-v2-legacy", "legacy");
  assert.equal(c.getProtocolEra(), "legacy");
  const init = exchanges.findLast((e) => e.body?.method === "initialize");
  assert.ok(init, "legacy mode sends initialize");
  assert.equal(init.status, 200);
  assert.ok(init.responseHeaders["mcp-session-id"], "legacy initialize mints a session");
  const r = await ok(c, "infer", { text: "fine" });
  assert.ok(LABELS.includes(r.label));
});

test("pinned 2026-07-28 over stdio", T, async () => {
  const transport = new StdioClientTransport({
    command: bin("onlineps_mcp_bridge"),
    args: cluster.bridgeArgs(["--transport", "stdio"]),
    stderr: "pipe",
  });
  const log = [];
  transport.stderr?.on("data", (d) => log.push(d.toString()));
  const c = new Client({ name: "sdk-modern-stdio", version: "0.0.1" },
    { versionNegotiation: { mode: { pin: MODERN } } });
  try {
    await c.connect(transport, { timeout: 30000 });
  } catch (err) {
    throw new Error(`stdio modern connect failed: ${err}\nbridge stderr:\n${log.join("")}`);
  }
  const untrack = trackPid(transport.pid);
  try {
    assert.equal(c.getProtocolEra(), "modern");
    const { tools } = await c.listTools();
    assert.deepEqual(tools.map((t) => t.name).sort(), [...TOOLS].sort());
    const r = await c.callTool({ name: "infer", arguments: { session: "stdio-s", text: "fine" } });
    assert.notEqual(r.isError, true, JSON.stringify(r));
    assert.ok(LABELS.includes(r.structuredContent?.label), JSON.stringify(r));
  } finally {
    const pid = transport.pid;
    await c.close();
    for (let i = 0; i < 50 && pid && isAlive(pid); i++) await new Promise((r) => setTimeout(r, 100));
    untrack();
  }
});
