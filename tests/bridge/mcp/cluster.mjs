// Spawns a small onlineps cluster (one PS shard, N workers, optionally the MCP bridge over HTTP)
// for the MCP client tests. Every child listens on an ephemeral port, so test files can run in
// parallel. Children are killed when the cluster is stopped and, as a safety net, when this
// process exits for any reason (test failure, uncaught exception, SIGINT/SIGTERM).
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

export const BIN_DIR = path.resolve(process.env.ONLINEPS_BIN_DIR || path.join(here, "../../../build/bin"));
export const LABELS = ["negative", "positive"];
const START_TIMEOUT_MS = Number(process.env.ONLINEPS_START_TIMEOUT_MS || 45000);
const VERBOSE = !!process.env.ONLINEPS_MCP_TEST_VERBOSE;
const LOG_TAIL_LINES = 60;

export function bin(name) {
  const p = path.join(BIN_DIR, name);
  if (!existsSync(p)) {
    throw new Error(`${p} does not exist (build the project or set ONLINEPS_BIN_DIR)`);
  }
  return p;
}

// ---- process registry and exit-time cleanup ---------------------------------------------------
const live = new Set(); // ChildProcess objects
const livePids = new Set(); // processes spawned by others (e.g. the SDK's StdioClientTransport)

function killAllNow() {
  for (const child of live) {
    try {
      child.kill("SIGKILL");
    } catch {
      // already gone
    }
  }
  live.clear();
  for (const pid of livePids) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
  livePids.clear();
}

// Kill `pid` too when this process exits; returns a function that forgets it again.
export function trackPid(pid) {
  installHooks();
  if (pid) livePids.add(pid);
  return () => livePids.delete(pid);
}

export function isAlive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

// Children get SIGKILL from the kernel if this process dies (setpriv --pdeathsig), so even a
// SIGKILLed test process leaves nothing behind.
const SETPRIV = ["/usr/bin/setpriv", "/bin/setpriv"].find((p) => existsSync(p));

let hooksInstalled = false;
function installHooks() {
  if (hooksInstalled) return;
  hooksInstalled = true;
  // 'exit' also runs after an uncaught exception or a failed test, so that is the main hook.
  process.on("exit", killAllNow);
  for (const [sig, num] of [["SIGINT", 2], ["SIGTERM", 15], ["SIGHUP", 1]]) {
    process.once(sig, () => {
      killAllNow();
      process.exit(128 + num);
    });
  }
  // `node --test` runs each file in a child process; if the runner is killed (e.g. a CTest
  // timeout), this process is re-parented: clean up and leave.
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) {
      killAllNow();
      process.exit(1);
    }
  }, 500).unref();
}

// ---- one child process ------------------------------------------------------------------------
export class Proc {
  constructor(name, file, args) {
    installHooks();
    this.name = name;
    this.file = file;
    this.args = args;
    this.log = []; // last lines of stdout+stderr, for error messages
    this.exited = null; // {code, signal} once gone
    const [cmd, argv] = SETPRIV
      ? [SETPRIV, ["--pdeathsig", "SIGKILL", "--", file, ...args]]
      : [file, args];
    this.child = spawn(cmd, argv, { stdio: ["ignore", "pipe", "pipe"] });
    live.add(this.child);
    this.exitPromise = new Promise((resolve) => {
      this.child.once("exit", (code, signal) => {
        this.exited = { code, signal };
        live.delete(this.child);
        resolve(this.exited);
      });
    });
    this.child.once("error", (err) => this.remember(`spawn error: ${err.message}`));
    this.lines = createInterface({ input: this.child.stdout });
    this.lines.on("line", (l) => this.remember(l));
    createInterface({ input: this.child.stderr }).on("line", (l) => this.remember(l));
  }

  remember(line) {
    if (VERBOSE) process.stderr.write(`[${this.name}] ${line}\n`);
    this.log.push(line);
    if (this.log.length > LOG_TAIL_LINES) this.log.shift();
  }

  tail() {
    return this.log.map((l) => `  [${this.name}] ${l}`).join("\n");
  }

  // Resolves with the rest of the first stdout line that starts with `prefix`.
  waitForLine(prefix, timeoutMs = START_TIMEOUT_MS) {
    return new Promise((resolve, reject) => {
      let done = false;
      const finish = (err, value) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        this.lines.off("line", onLine);
        if (err) reject(err);
        else resolve(value);
      };
      const onLine = (l) => {
        if (l.startsWith(prefix)) finish(null, l.slice(prefix.length).trim());
      };
      const timer = setTimeout(
        () =>
          finish(
            new Error(
              `${this.name} printed no '${prefix}' line in ${timeoutMs} ms\n` +
                `  command: ${this.file} ${this.args.join(" ")}\n${this.tail()}`,
            ),
          ),
        timeoutMs,
      );
      this.lines.on("line", onLine);
      this.exitPromise.then(({ code, signal }) =>
        finish(
          new Error(
            `${this.name} exited (code ${code}, signal ${signal}) before printing '${prefix}'\n` +
              `  command: ${this.file} ${this.args.join(" ")}\n${this.tail()}`,
          ),
        ),
      );
    });
  }

  async stop(graceMs = 3000) {
    if (this.exited) return this.exited;
    this.child.kill("SIGTERM");
    const timer = setTimeout(() => this.child.kill("SIGKILL"), graceMs);
    try {
      return await this.exitPromise;
    } finally {
      clearTimeout(timer);
    }
  }
}

// ---- the cluster ------------------------------------------------------------------------------
/**
 * Starts a PS shard, `workers` workers and (unless bridge === false) the HTTP bridge.
 * Returns { ps, workers: [endpoint], url, procs, bridgeArgs(extra), stop(), logs() }.
 */
export async function startCluster({
  workers = 1,
  labels = LABELS,
  lr = 1.0,
  workerArgs = [],
  bridge = true,
  bridgeArgs = [],
} = {}) {
  const procs = [];
  const cluster = {
    procs,
    ps: null,
    workers: [],
    url: null,
    logs: () => procs.map((p) => p.tail()).join("\n"),
    async stop() {
      // Bridge first, then workers, then the PS.
      for (const p of [...procs].reverse()) await p.stop();
    },
    // Arguments for a bridge (e.g. a stdio one spawned by the SDK) pointed at these workers.
    bridgeArgs(extra = []) {
      return ["--workers", cluster.workers.join(","), "--admin-port", "-1", ...extra];
    },
  };
  try {
    const ps = new Proc("ps", bin("onlineps_ps"), [
      "--shard-index", "0", "--num-shards", "1",
      "--listen", "tcp://127.0.0.1:0", "--admin-port", "-1",
    ]);
    procs.push(ps);
    cluster.ps = await ps.waitForLine("LISTENING ");

    const ws = [];
    for (let i = 0; i < workers; i++) {
      const w = new Proc(`worker${i}`, bin("onlineps_worker"), [
        "--ps", cluster.ps, "--listen", "tcp://127.0.0.1:0",
        "--model", "text", "--labels", labels.join(","), "--lr", String(lr),
        "--admin-port", "-1", ...workerArgs,
      ]);
      procs.push(w);
      ws.push(w);
    }
    cluster.workers = await Promise.all(ws.map((w) => w.waitForLine("LISTENING ")));

    if (bridge) {
      const b = new Proc("bridge", bin("onlineps_mcp_bridge"), [
        ...cluster.bridgeArgs(["--port", "0", ...bridgeArgs]),
      ]);
      procs.push(b);
      cluster.url = await b.waitForLine("LISTENING ");
      cluster.bridge = b;
    }
    return cluster;
  } catch (err) {
    await cluster.stop();
    throw err;
  }
}

// ---- small helpers shared by the tests --------------------------------------------------------
export const POSITIVE_TRAIN = [
  "great movie", "wonderful acting", "i loved it", "excellent and fun",
  "brilliant story", "happy ending", "superb and delightful", "amazing film",
];
export const NEGATIVE_TRAIN = [
  "terrible movie", "awful acting", "i hated it", "boring and dull",
  "horrible story", "sad waste", "dreadful and painful", "worst film",
];
// Phrases not in the training set that share words with it.
export const POSITIVE_PROBE = "a wonderful and brilliant film";
export const NEGATIVE_PROBE = "a boring and awful film";

export function sentimentExamples() {
  const ex = [];
  for (let i = 0; i < POSITIVE_TRAIN.length; i++) {
    ex.push({ text: POSITIVE_TRAIN[i], label: "positive" });
    ex.push({ text: NEGATIVE_TRAIN[i], label: "negative" });
  }
  return ex;
}

// The JSON text block of a tool result parsed, checked against structuredContent.
export function textJson(result) {
  const block = (result.content || []).find((c) => c.type === "text");
  if (!block) throw new Error(`no text content in ${JSON.stringify(result)}`);
  return JSON.parse(block.text);
}
