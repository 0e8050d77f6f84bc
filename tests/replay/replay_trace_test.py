#!/usr/bin/env python3
"""A trace recorded from the live bridge, replayed by onlineps_replay (real processes).

A shard, two text-model workers and the bridge run with --record; two MCP sessions
learn concurrently, so some pushes are stale. Then, with the cluster gone:
  - the trace replays in logical mode twice with identical final parameters;
  - the replay measures, step by step, the staleness the recording carries (for at
    least 90% of the learns: see below), and every learn chunk becomes one push;
  - a staleness override (fixed:3) measures 3 and gives other parameters;
  - --dry-run prints the expected histogram without running anything;
  - a damaged trace (a bad middle line) is refused naming the line.
"""
import csv
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

POSITIVE = ["a wonderful lovely film", "great acting and a moving story", "superb and joyful"]
NEGATIVE = ["a dull tedious waste", "boring plot and awful lines", "terrible and slow"]


def fail(msg):
    print(f"replay_trace_test: FAIL: {msg}")
    sys.exit(1)


endpoint = opslib.endpoint


def record(work, trace):
    procs = []
    try:
        shard = opslib.Proc("ps", [f"{BIN}/onlineps_ps", "--listen", "tcp://127.0.0.1:0",
                                   "--admin-port", "-1"], work)
        procs.append(shard)
        ps = endpoint(shard, "the shard")
        workers = []
        for i in range(2):
            w = opslib.Proc(f"w{i}", [f"{BIN}/onlineps_worker", "--ps", ps, "--listen",
                                      "tcp://127.0.0.1:0", "--admin-port", "-1", "--model",
                                      "text", "--lr", "0.5"], work)
            procs.append(w)
            workers.append(endpoint(w, f"worker {i}"))
        bridge = opslib.Proc("bridge", [f"{BIN}/onlineps_mcp_bridge", "--workers",
                                        ",".join(workers), "--port", "0", "--admin-port", "-1",
                                        "--record", trace], work)
        procs.append(bridge)
        url = endpoint(bridge, "the bridge")
        errors = []

        def client(n):
            try:
                s = opslib.McpSession(url)
                for i in range(25):
                    pos, neg = POSITIVE[i % 3], NEGATIVE[(i + n) % 3]
                    s.call("learn", {"examples": [{"text": pos, "label": "positive"},
                                                  {"text": neg, "label": "negative"}]})
                    s.call("infer", {"text": pos})
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        threads = [threading.Thread(target=client, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            fail(f"MCP calls failed: {errors}")
        for p in reversed(procs):
            if p.stop(signal.SIGTERM) != 0:
                fail(f"{p.name} did not exit 0:\n{p.stderr()}")
    finally:
        for p in procs:
            if p.alive():
                p.stop(signal.SIGKILL)


def replay(trace, out, *extra):
    r = subprocess.run([f"{BIN}/onlineps_replay", "--trace", trace, "--model", "text", "--out",
                        out, "--quiet", "--no-plots", *extra],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        fail(f"replay {extra} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f), r.stdout


def main():
    work = tempfile.mkdtemp(prefix="onlineps-replay-trace.")
    trace = os.path.join(work, "trace.jsonl")
    record(work, trace)
    with open(trace) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    learns = [r for r in lines[1:] if r.get("tool") == "learn" and not r.get("is_error")]
    if len(learns) != 75:
        fail(f"expected 75 recorded learns, found {len(learns)}")
    taus = [max(r.get("tau", 0), 0) for r in learns]
    print(f"replay_trace_test: recorded {len(learns)} learns, taus {sorted(set(taus))}")

    a, _ = replay(trace, os.path.join(work, "a"), "--events")
    b, _ = replay(trace, os.path.join(work, "b"))
    ra, rb = a["result"], b["result"]
    if ra["params_sha256"] != rb["params_sha256"] or not ra["params_sha256"]:
        fail(f"two logical replays differ: {ra['params_sha256']} vs {rb['params_sha256']}")
    if ra["pushes"] != len(learns):
        fail(f"{ra['pushes']} pushes replayed for {len(learns)} learns")
    # Step by step, the replay measures the staleness the live PS measured. Not every
    # step can match: the live worker may merge concurrent learns into one push, which
    # leaves a gap in the recorded versions; all but a few must.
    recorded = {r["seq"]: max(r.get("tau", 0), 0) for r in learns}
    replayed = {}
    with open(os.path.join(work, "a", "events.jsonl")) as f:
        for line in list(f)[1:]:
            e = json.loads(line)
            if e["kind"] == "push":
                replayed[e["ref"]["trace_seq"]] = e["tau"]
    same = sum(1 for seq, tau in recorded.items() if replayed.get(seq) == tau)
    if len(replayed) != len(recorded) or same < 0.9 * len(recorded):
        fail(f"replayed staleness matches the recording for {same} of {len(recorded)} learns "
             f"({len(replayed)} pushes logged)")
    print(f"replay_trace_test: replayed staleness equals the recorded one for {same} of "
          f"{len(recorded)} learns")

    c, _ = replay(trace, os.path.join(work, "c"), "--staleness", "fixed:3")
    rc = c["result"]
    if rc["params_sha256"] == ra["params_sha256"]:
        fail("a staleness override of 3 left the parameters unchanged")
    if rc["staleness"]["max"] != 3 or rc["staleness"]["p50"] != 3:
        fail(f"override fixed:3 measured {rc['staleness']}")

    # --limit keeps the first N learn records, however many pushes each makes (two
    # examples each: four pushes at --learn-chunk 1).
    lim, _ = replay(trace, os.path.join(work, "lim"), "--limit", "4", "--learn-chunk", "1")
    if lim["workload"]["learn_steps"] != 8:
        fail(f"--limit 4 --learn-chunk 1 kept {lim['workload']['learn_steps']} steps, not 8")

    # Loops go on in time: every loop is paced in timed mode, so the schedule's virtual
    # time never runs backwards between two evaluations.
    loop, _ = replay(trace, os.path.join(work, "loop"), "--loop", "3", "--eval-every", "5")
    with open(os.path.join(work, "loop", "curve.csv")) as f:
        rows = list(csv.DictReader(f))
    times = [float(r["virtual_ms"]) for r in rows]
    if len(times) < 3 or any(b < a for a, b in zip(times, times[1:])):
        fail(f"--loop 3: virtual_ms goes backwards: {times}")
    # ...and on: the third loop runs two spans of the trace after the first (a loop
    # replaying the first one's times would leave the clock where the first ended).
    span_ms = max(r.get("t_us", 0) for r in lines[1:]) / 1000.0
    if times[-1] < 2 * span_ms:
        fail(f"--loop 3: virtual_ms ends at {times[-1]:.0f}, not past two trace spans "
             f"({2 * span_ms:.0f} ms): {times}")

    # Against a running cluster, a second replay trains on: its pushes are not taken for
    # the first one's retries (each run has its own sender ids).
    shard = opslib.Proc("ps-live", [f"{BIN}/onlineps_ps", "--listen", "tcp://127.0.0.1:0",
                                    "--admin-port", "-1"], work)
    try:
        ep = endpoint(shard, "the live shard")
        first, _ = replay(trace, os.path.join(work, "live1"), "--ps", ep)
        second, _ = replay(trace, os.path.join(work, "live2"), "--ps", ep)
        if first["result"]["params_sha256"] == second["result"]["params_sha256"]:
            fail("a second --ps replay left the cluster's parameters unchanged "
                 "(its pushes were dropped as duplicates)")
    finally:
        shard.stop(signal.SIGKILL)

    # Ctrl-C ends an in-process run after the event in progress: it writes the figures so
    # far and its manifest, which says it was interrupted, and exits 130 (128 + SIGINT), so
    # that no script takes the part for a whole run.
    sig_out = os.path.join(work, "sig")
    p = subprocess.Popen([f"{BIN}/onlineps_replay", "--trace", trace, "--model", "text",
                          "--out", sig_out, "--quiet", "--no-plots", "--mode", "timed",
                          "--speed", "0.5", "--loop", "100", "--events"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Interrupted once its first push is logged (events.jsonl is flushed per line), not
    # after a fixed time: on a loaded machine (a parallel ctest) the run may not have
    # pushed yet after 2 s, and an interrupt then leaves nothing to report.
    events = os.path.join(sig_out, "events.jsonl")
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(events):
            with open(events) as f:
                if any('"kind":"push"' in line.replace(" ", "") for line in f):
                    break
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("an interrupted replay did not stop within 30 s")
    if p.returncode != 130 or not os.path.exists(os.path.join(sig_out, "manifest.json")):
        fail(f"interrupted replay: exit {p.returncode} (want 130), no manifest?\n{out}\n{err}")
    with open(os.path.join(sig_out, "manifest.json")) as f:
        manifest = json.load(f)
    pushes = manifest["result"]["pushes"]
    if not 0 < pushes < 100 * len(learns):
        fail(f"interrupted replay reports {pushes} pushes")
    marker = manifest.get("interrupted")
    if not marker or marker.get("signal") != "SIGINT" or "updates" not in marker.get("planned", {}):
        fail(f"the manifest of an interrupted replay does not say so: {marker!r}")
    if "interrupted by SIGINT" not in err:
        fail(f"an interrupted replay does not say so:\n{err}")

    dry = subprocess.run([f"{BIN}/onlineps_replay", "--trace", trace, "--model", "text",
                          "--dry-run", "--staleness", "fixed:2"],
                         capture_output=True, text=True, timeout=60)
    if dry.returncode != 0 or "tau   2" not in dry.stdout or "timed replay" not in dry.stdout:
        fail(f"--dry-run output:\n{dry.stdout}\n{dry.stderr}")

    damaged = os.path.join(work, "damaged.jsonl")
    with open(trace) as f, open(damaged, "w") as g:
        all_lines = f.readlines()
        all_lines[5] = "{not json\n"
        g.writelines(all_lines)
    r = subprocess.run([f"{BIN}/onlineps_replay", "--trace", damaged, "--model", "text",
                        "--out", os.path.join(work, "d"), "--quiet"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode == 0 or "damaged.jsonl:6" not in r.stderr:
        fail(f"damaged trace: exit {r.returncode}, stderr:\n{r.stderr}")
    print("replay_trace_test: PASS (identical replays, recorded staleness reproduced, "
          "override measured, damaged line named)")


if __name__ == "__main__":
    main()
