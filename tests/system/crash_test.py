#!/usr/bin/env python3
"""kill -9 a worker, then the bridge, under MCP learn traffic (docs/reliability.md,
"Worker and bridge crashes"). One PS shard, 2 `text` workers, the bridge; 4 client
threads, each its own MCP session with a context, learning one example per call.

Checks:
  - no acknowledged learn is lost: the model version a final learn reports counts every
    learn applied, and it is at least the number of learns acknowledged (a learn is
    pushed once, never retried by the bridge, so it is also at most acknowledged +
    failed);
  - after the worker's kill -9 every session keeps learning on the other worker;
  - after the bridge's kill -9 and restart (same port; no context store) the loss is
    explicit: an old session id gets HTTP 404, the client initializes a new session,
    and its old context is gone (get_context: found false);
  - with --state-dir (the bridge restarts on the same --state-dir) nothing is lost:
    no session gets a 404, and each client's first call after the outage finds its own
    context (get_context).
"""
import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.error

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: opslib
import opslib  # noqa: E402

BIN = os.environ.get("ONLINEPS_BIN_DIR", os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "build", "bin"))
CLIENTS = 4


class Client(threading.Thread):
    def __init__(self, n, url, stop, kept_state):
        super().__init__(daemon=True)
        self.n, self.url, self.stop, self.kept_state = n, url, stop, kept_state
        self.acked = 0
        self.failed = 0          # learns that got an error (may or may not be applied)
        self.not_found = 0       # HTTP 404 on an old session id
        self.reinitialized = 0
        self.context_lost = 0    # a new session found no context: the old one is gone
        self.context_kept = 0    # after an outage, the same session found its own context
        self.check_context = False
        self.acked_at = []       # times of acknowledged learns
        self.problems = []
        self.session = None

    def connect(self):
        while not self.stop.is_set():
            try:
                self.session = opslib.McpSession(self.url, timeout=10)
                return True
            except (OSError, urllib.error.URLError, opslib.McpError):
                time.sleep(0.1)  # the bridge is down: retry until it is back
        return False

    def run(self):
        if not self.connect():
            return
        self.session.call("set_context", {"items": [f"client {self.n}"]})
        i = 0
        while not self.stop.is_set():
            i += 1
            label = "positive" if i % 2 else "negative"
            text = f"{'great lovely' if i % 2 else 'dull awful'} film {self.n} {i}"
            try:
                self.session.call("learn", {"text": text, "label": label})
                self.acked += 1
                self.acked_at.append(time.time())
                if self.check_context:
                    self.check_context = False
                    got = self.session.call("get_context", {})
                    if got.get("found") and got.get("items") == [f"client {self.n}"]:
                        self.context_kept += 1
                    elif self.kept_state:
                        self.problems.append(f"client {self.n}: after an outage the session's "
                                             f"context is not its own: {got}")
            except urllib.error.HTTPError as e:
                if e.code == 404 and self.kept_state:
                    self.not_found += 1
                    self.problems.append(f"client {self.n}: session lost (404) despite --state-dir")
                    return
                if e.code == 404:
                    self.not_found += 1
                    if not self.connect():
                        return
                    self.reinitialized += 1
                    got = self.session.call("get_context", {})
                    if got.get("found"):
                        self.problems.append(f"client {self.n}: a new session found a context: {got}")
                    else:
                        self.context_lost += 1
                    self.session.call("set_context", {"items": [f"client {self.n}"]})
                else:
                    self.failed += 1
                    self.check_context = True
                    time.sleep(0.05)
            except (OSError, urllib.error.URLError, opslib.McpError, json.JSONDecodeError):
                self.failed += 1  # the worker or the bridge died under this call
                self.check_context = True
                time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state-dir", action="store_true",
                    help="run the bridge with --state-dir: sessions and contexts must survive")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="onlineps-crash.") as work:
        procs = []
        try:
            shard = opslib.Proc("ps", [f"{BIN}/onlineps_ps", "--listen", "tcp://127.0.0.1:0",
                                       "--admin-port", "-1", "--log-level", "warn"], work)
            procs.append(shard)
            ps = opslib.endpoint(shard, "shard")
            workers, eps = [], []
            for i in range(2):
                w = opslib.Proc(f"w{i}", [f"{BIN}/onlineps_worker", "--ps", ps, "--listen", "tcp://127.0.0.1:0",
                                          "--admin-port", "-1", "--log-level", "warn", "--model", "text",
                                          "--labels", "negative,positive"], work)
                procs.append(w)
                workers.append(w)
                eps.append(opslib.endpoint(w, f"worker {i}"))
            port = opslib.free_port()

            state = ["--state-dir", os.path.join(work, "state")] if args.state_dir else []

            def start_bridge(name, worker_eps):
                b = opslib.Proc(name, [f"{BIN}/onlineps_mcp_bridge", "--workers", ",".join(worker_eps),
                                       "--port", str(port), "--admin-port", "-1", "--log-level", "warn",
                                       "--learn-timeout-ms", "3000", "--infer-timeout-ms", "3000"] + state,
                                work)
                procs.append(b)
                opslib.endpoint(b, name)
                return b

            bridge = start_bridge("bridge", eps)
            url = f"http://127.0.0.1:{port}/mcp"
            # The version before the traffic (worker start-up may seed the tables).
            v0 = int(opslib.McpSession(url).call("learn", {"text": "a film", "label": "positive"})["model_version"])
            stop = threading.Event()
            clients = [Client(n, url, stop, args.state_dir) for n in range(CLIENTS)]
            for c in clients:
                c.start()
            time.sleep(3)
            before_worker_kill = sum(c.acked for c in clients)
            t_worker = time.time()
            workers[0].stop(signal.SIGKILL)
            print(f"crash_test: kill -9 worker 0 after {before_worker_kill} acknowledged learns", flush=True)
            time.sleep(6)
            t_bridge = time.time()
            before_bridge_kill = sum(c.acked for c in clients)
            bridge.stop(signal.SIGKILL)
            print(f"crash_test: kill -9 the bridge after {before_bridge_kill} acknowledged learns", flush=True)
            time.sleep(0.5)
            start_bridge("bridge2", eps[1:])
            t_restart = time.time()
            time.sleep(5)
            stop.set()
            for c in clients:
                c.join(30)

            final = opslib.McpSession(url)
            out = final.call("learn", {"text": "a lovely film", "label": "positive"})
            applied = int(out["model_version"]) - v0 - 1  # learns applied between the two
            acked = sum(c.acked for c in clients)
            failed = sum(c.failed for c in clients)
            problems = [p for c in clients for p in c.problems]
            for c in clients:
                after_worker = sum(1 for t in c.acked_at if t_worker + 3.5 < t < t_bridge)
                after_bridge = sum(1 for t in c.acked_at if t > t_restart)
                if after_worker == 0:
                    problems.append(f"client {c.n}: no learn acknowledged after the worker's kill -9")
                if after_bridge == 0:
                    problems.append(f"client {c.n}: no learn acknowledged after the bridge restart")
                if args.state_dir:
                    if c.context_kept == 0:
                        problems.append(f"client {c.n}: never checked its context after an outage")
                elif c.not_found == 0 or c.reinitialized == 0 or c.context_lost == 0:
                    problems.append(f"client {c.n}: the session loss was not explicit (404 {c.not_found}, "
                                    f"re-initialized {c.reinitialized}, context gone {c.context_lost})")
            if applied < acked:
                problems.append(f"{acked - applied} acknowledged learns lost ({acked} acked, {applied} applied)")
            if applied > acked + failed:
                problems.append(f"{applied - acked - failed} learns applied that were never sent")
            print(f"crash_test: {acked} learns acknowledged, {failed} failed during the outages, "
                  f"{applied} applied (model version); 404 then re-initialize: "
                  f"{sum(c.reinitialized for c in clients)} sessions; context kept across an outage: "
                  f"{sum(c.context_kept for c in clients)} checks", flush=True)
            if problems:
                for p in problems:
                    print(f"crash_test: FAIL: {p}")
                for p in procs:
                    print(f"--- {p.name} stderr (tail)\n{p.stderr()[-1500:]}")
                return 1
            print("crash_test: ok")
            return 0
        finally:
            for p in procs:
                if p.alive():
                    p.stop(signal.SIGTERM, timeout=20)


if __name__ == "__main__":
    sys.exit(main())
