#!/usr/bin/env python3
"""Timed replay of a recorded trace against a running MCP bridge (real processes).

Cluster A (a shard, a text worker, the bridge with --record) serves three concurrent MCP
sessions: each sets its context, learns, infers, reads its context back and makes one
call the bridge refuses. Then cluster B (a new shard, two workers, a bridge with bearer
auth and --record) is sent that trace by `onlineps_replay --bridge`:
  - --dry-run counts the calls and sessions and predicts the paced duration;
  - every call is sent once; each recorded session becomes one new MCP session whose
    calls reach the bridge in recorded order (checked in bridge B's own recording), and
    its get_context finds the context its set_context stored;
  - the refused calls are refused again and nothing else fails; learns report staleness;
  - --speed paces the run (not faster than the recorded span / speed), --max-gap-ms caps
    gaps, --limit keeps the first N calls, --duration-s stops sending early;
  - without the token, a wrong URL, or nothing listening: a clear error, exit non-zero;
    the bridge keeps serving.
"""
import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: opslib
import opslib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("ONLINEPS_BIN_DIR", os.path.join(ROOT, "build", "bin"))
TOKEN = "replay-test-token-0123456789"
SESSIONS = 3


def fail(msg):
    print(f"replay_bridge_test: FAIL: {msg}")
    sys.exit(1)


endpoint = opslib.endpoint


def cluster(work, name, workers, trace, tokens=None):
    procs = []
    shard = opslib.Proc(f"{name}-ps", [f"{BIN}/onlineps_ps", "--listen", "tcp://127.0.0.1:0",
                                       "--admin-port", "-1"], work)
    procs.append(shard)
    ps = endpoint(shard, f"{name}'s shard")
    eps = []
    for i in range(workers):
        w = opslib.Proc(f"{name}-w{i}", [f"{BIN}/onlineps_worker", "--ps", ps, "--listen",
                                         "tcp://127.0.0.1:0", "--admin-port", "-1", "--model",
                                         "text", "--lr", "0.5"], work)
        procs.append(w)
        eps.append(endpoint(w, f"{name}'s worker {i}"))
    argv = [f"{BIN}/onlineps_mcp_bridge", "--workers", ",".join(eps), "--port", "0",
            "--admin-port", "-1", "--record", trace]
    if tokens:
        argv += ["--tokens-file", tokens]
    bridge = opslib.Proc(f"{name}-bridge", argv, work)
    procs.append(bridge)
    return procs, endpoint(bridge, f"{name}'s bridge")


def stop(procs):
    for p in reversed(procs):
        if p.alive():
            p.stop(signal.SIGTERM)


def traffic(url):
    """Three sessions at once; the gaps make the recording span about 1.5 s."""
    errors = []

    def client(n):
        try:
            s = opslib.McpSession(url)
            s.call("set_context", {"text": f"context of session {n}"})
            for i in range(6):
                s.call("learn", {"examples": [{"text": f"great film {i}", "label": "positive"},
                                              {"text": f"dull film {n}", "label": "negative"}]})
                time.sleep(0.1)
                s.call("infer", {"text": "a great film"})
            got = s.call("get_context", {})
            if not got.get("found") or f"context of session {n}" not in json.dumps(got):
                errors.append(f"session {n} lost its context while recording")
            try:
                s.call("learn", {"examples": [{"text": "x", "label": "no-such-label"}]})
                errors.append("a learn with an unknown label was accepted")
            except opslib.McpError:
                pass
            time.sleep(0.3)
            s.call("infer", {"text": "dull"})
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        fail(f"recording traffic failed: {errors}")


def read_trace(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()][1:]


def replay(trace, url, out, *extra, token=None, expect_ok=True):
    env = dict(os.environ)
    env.pop("ONLINEPS_BRIDGE_TOKEN", None)
    if token:
        env["ONLINEPS_BRIDGE_TOKEN"] = token
    start = time.time()
    r = subprocess.run([f"{BIN}/onlineps_replay", "--trace", trace, "--bridge", url, "--out",
                        out, "--quiet", *extra], capture_output=True, text=True, timeout=120,
                       env=env)
    took = time.time() - start
    if expect_ok and r.returncode != 0:
        fail(f"replay {extra} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    if not expect_ok:
        return r, took
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    with open(os.path.join(out, "calls.csv")) as f:
        rows = list(csv.DictReader(f))
    return manifest, rows, r.stdout, took


def main():
    work = tempfile.mkdtemp(prefix="onlineps-replay-bridge.")
    print(f"replay_bridge_test: logs and traces in {work}")
    trace_a, trace_b = os.path.join(work, "a.jsonl"), os.path.join(work, "b.jsonl")
    procs, url_a = cluster(work, "a", 1, trace_a)
    try:
        traffic(url_a)
    finally:
        stop(procs)
    calls = [r for r in read_trace(trace_a) if r["kind"] == "call"]
    by_session = {}
    for c in calls:
        by_session.setdefault(c["session"], []).append(c)
    refused = sum(1 for c in calls if c["is_error"])
    if len(by_session) != SESSIONS or refused != SESSIONS:
        fail(f"recording: {len(by_session)} sessions, {refused} refused calls")
    arrival = [(c["t_us"] - c["latency_us"]) / 1e6 for c in calls]
    span = max(arrival) - min(arrival)
    print(f"replay_bridge_test: recorded {len(calls)} calls in {len(by_session)} sessions "
          f"over {span:.2f} s")

    tokens = os.path.join(work, "tokens")
    with open(tokens, "w") as f:
        f.write(f"# identity token\nreplayer {TOKEN}\n")
    procs, url = cluster(work, "b", 2, trace_b, tokens)
    try:
        dry = subprocess.run([f"{BIN}/onlineps_replay", "--trace", trace_a, "--bridge", url,
                              "--dry-run", "--speed", "2"], capture_output=True, text=True,
                             timeout=60)
        want = f"{len(calls)} tool calls in {SESSIONS} sessions"
        if dry.returncode != 0 or want not in dry.stdout or "would take" not in dry.stdout:
            fail(f"--dry-run (wanted '{want}'):\n{dry.stdout}\n{dry.stderr}")

        # The full replay at twice the recorded speed.
        m, rows, out, took = replay(trace_a, url, os.path.join(work, "full"), "--speed", "2",
                                    token=TOKEN)
        res = m["result"]
        if len(rows) != len(calls) or res["all"]["calls"] != len(calls):
            fail(f"{len(rows)} rows / {res['all']['calls']} calls for {len(calls)} recorded")
        if res["all"]["new_errors"] != 0 or res["all"]["tool_errors"] != refused:
            fail(f"errors: {res['all']} (the recording refused {refused})\n{out}")
        if took < span / 2 * 0.9:
            fail(f"--speed 2 replayed a {span:.2f} s recording in {took:.2f} s: not paced")
        learns = sum(1 for c in calls if c["tool"] == "learn" and not c["is_error"])
        if res["staleness"]["count"] != learns:
            fail(f"staleness of {res['staleness']['count']} learns reported, {learns} sent")
        # One new MCP session per recorded session, its calls in recorded order.
        mcp = {}
        for r in rows:
            mcp.setdefault(r["session"], set()).add(r["mcp_session"])
        if sorted(mcp) != sorted(by_session) or any(len(v) != 1 for v in mcp.values()):
            fail(f"recorded sessions -> MCP sessions: {mcp}")
        if len({next(iter(v)) for v in mcp.values()}) != SESSIONS:
            fail(f"two recorded sessions shared an MCP session: {mcp}")
        replayed = [r for r in read_trace(trace_b) if r["kind"] == "call"]
        got = {}
        for r in replayed:
            got.setdefault(r["session"], []).append(r)
        if len(got) != SESSIONS or any(not k.startswith("replayer/m:") for k in got):
            fail(f"bridge B saw sessions {sorted(got)}")
        for key, seq in got.items():
            # A trace names an MCP session by a hash of its key (the id is a secret).
            sid = key.split("/m:", 1)[1]
            src = [s for s, v in mcp.items()
                   if hashlib.sha256(f"replayer/m:{next(iter(v))}".encode()).hexdigest()[:32]
                   == sid]
            if len(src) != 1:
                fail(f"bridge B session {sid} matches no replayed session")
            want_tools = [c["tool"] for c in by_session[src[0]]]
            if [r["tool"] for r in seq] != want_tools:
                fail(f"session {src[0]}: bridge B got {[r['tool'] for r in seq]}, "
                     f"recorded {want_tools}")
            ctx = [r for r in seq if r["tool"] == "get_context"]
            if [r["summary"] for r in ctx] != ["found"]:
                fail(f"session {src[0]}: get_context on bridge B: {ctx}")
        print(f"replay_bridge_test: {len(calls)} calls replayed in {took:.2f} s "
              f"(recorded span {span:.2f} s, --speed 2); sessions and order kept")

        # Gaps capped at 1 ms: far faster than the span.
        m, rows, _, took = replay(trace_a, url, os.path.join(work, "gap"), "--max-gap-ms", "1",
                                  "--limit", "10", token=TOKEN)
        if len(rows) != 10 or m["result"]["paced_s"] > 0.05:
            fail(f"--limit 10 --max-gap-ms 1: {len(rows)} rows, paced {m['result']['paced_s']}")
        # --duration-s stops sending: a 10x slowed replay cut at 1 s sends only some calls.
        m, rows, _, took = replay(trace_a, url, os.path.join(work, "dur"), "--speed", "0.1",
                                  "--duration-s", "1", token=TOKEN)
        res = m["result"]
        if not (0 < res["sent"] < len(calls)) or res["not_sent"] != len(calls) - res["sent"]:
            fail(f"--duration-s 1: sent {res['sent']}, not sent {res['not_sent']}")
        if took > 15:
            fail(f"--duration-s 1 took {took:.1f} s")

        # Refusals, each named, and the bridge keeps serving.
        r, _ = replay(trace_a, url, os.path.join(work, "x"), expect_ok=False)
        if r.returncode == 0 or "401" not in r.stderr:
            fail(f"without the token: exit {r.returncode}:\n{r.stderr}")
        r, _ = replay(trace_a, "https://127.0.0.1:1/mcp", os.path.join(work, "x"),
                      expect_ok=False)
        if r.returncode == 0 or "https is not supported" not in r.stderr:
            fail(f"https URL: exit {r.returncode}:\n{r.stderr}")
        r, took = replay(trace_a, "http://127.0.0.1:1/mcp", os.path.join(work, "x"),
                         token=TOKEN, expect_ok=False)
        if r.returncode == 0 or "127.0.0.1:1" not in r.stderr or took > 20:
            fail(f"nothing listening: exit {r.returncode} after {took:.1f} s:\n{r.stderr}")
        m, rows, _, _ = replay(trace_a, url, os.path.join(work, "after"), "--limit", "3",
                               "--max-gap-ms", "1", token=TOKEN)
        if len(rows) != 3 or m["result"]["all"]["ok"] != 3:
            fail(f"after the refusals the bridge served {m['result']['all']}")
    finally:
        stop(procs)
    print("replay_bridge_test: PASS (paced replay over MCP, sessions and order kept, "
          "refusals named)")


if __name__ == "__main__":
    main()
