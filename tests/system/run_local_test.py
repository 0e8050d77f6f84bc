#!/usr/bin/env python3
"""The README's run command serves MCP, and Ctrl-C stops the whole cluster with exit 0.

Starts scripts/run_local.sh (ports 17000+, so a developer's own cluster on the default
ports is not disturbed) in its own process group, waits until it says it is serving,
calls tools/call infer on its MCP endpoint, then sends SIGINT to the group as a
terminal's Ctrl-C does, and checks the exit status and that no cluster process is left.

With --replicas N (and its own --base-port), the cluster runs replicated shards on a
local etcd; the test then kill -9s the primary of shard 0 and checks that learn and
infer keep working through MCP.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = argparse.ArgumentParser()
ARGS.add_argument("--replicas", type=int, default=1)
ARGS.add_argument("--base-port", type=int, default=17000)
ARGS.add_argument("--mcp-port", type=int, default=17400)
OPTS = ARGS.parse_args()
MCP = f"http://127.0.0.1:{OPTS.mcp_port}/mcp"
PORT_PATTERN = f"tcp://127.0.0.1:{str(OPTS.base_port)[:2]}"


def post(body, session=None):
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if session:
        headers["Mcp-Session-Id"] = session
        headers["MCP-Protocol-Version"] = "2025-11-25"
    req = urllib.request.Request(MCP, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
        return r.headers.get("Mcp-Session-Id"), json.loads(text) if text else None


def cluster_processes():
    out = subprocess.run(["pgrep", "-f", PORT_PATTERN], capture_output=True, text=True)
    etcd = subprocess.run(["pgrep", "-f", f"127.0.0.1:{OPTS.base_port + 500}"],
                          capture_output=True, text=True)
    return [p for p in (out.stdout + etcd.stdout).split() if p]


def metric(port, series):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(series + " "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def kill_primary_of_shard0():
    """kill -9 the replica of shard 0 that reports itself primary; returns its admin port."""
    for r in range(OPTS.replicas):
        admin = OPTS.base_port + 100 + 20 * r
        if metric(admin, 'onlineps_ps_replica{field="primary"}') == 1:
            out = subprocess.run(["pgrep", "-f", "--", f"--admin-port {admin}( |$)"], capture_output=True,
                                 text=True)
            for pid in out.stdout.split():
                os.kill(int(pid), signal.SIGKILL)
            return admin
    return None


def main():
    if cluster_processes():
        print("run_local_test: processes on ports 17xxx already run; stop them first")
        return 1
    cmd = ["bash", os.path.join(ROOT, "scripts/run_local.sh"), "--steps", "20",
           "--base-port", str(OPTS.base_port), "--mcp-port", str(OPTS.mcp_port),
           "--replicas", str(OPTS.replicas)]
    log_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"run_local_test.{os.getpid()}.log")
    log = open(log_path, "w+")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def output():
        with open(log_path) as f:
            return f.read()

    deadline = time.time() + 600
    while "Ctrl-C stops the cluster" not in output():
        if p.poll() is not None or time.time() > deadline:
            print("run_local_test: run_local.sh did not come up:\n" + output()[-3000:])
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            return 1
        time.sleep(0.5)
    try:
        sid, _ = post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                       "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                  "clientInfo": {"name": "run_local_test", "version": "1"}}})
        _, r = post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "infer", "arguments": {"text": "a lovely film"}}}, sid)
        label = r["result"]["structuredContent"]["label"]
        assert label in ("negative", "positive"), r
        if OPTS.replicas > 1:
            time.sleep(1.5)  # metrics are refreshed every second
            killed = kill_primary_of_shard0()
            assert killed, "no replica of shard 0 reports itself primary"
            t0 = time.time()
            others = [OPTS.base_port + 100 + 20 * r for r in range(OPTS.replicas)
                      if OPTS.base_port + 100 + 20 * r != killed]
            while not any(metric(a, 'onlineps_ps_replica{field="primary"}') == 1 for a in others):
                assert time.time() - t0 < 20, "no replica of shard 0 took over"
                time.sleep(0.1)
            took_over = time.time() - t0
            words = "a superb moving witty charming gripping lovely tender film".split()
            _, r = post({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                         "params": {"name": "learn", "arguments": {
                             "examples": [{"text": w, "label": "positive"} for w in words]}}}, sid)
            assert not r["result"].get("isError"), r
            _, r = post({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                         "params": {"name": "infer", "arguments": {"text": "a superb film"}}}, sid)
            assert r["result"]["structuredContent"]["label"] in ("negative", "positive"), r
            print(f"run_local_test: kill -9 of shard 0's primary (admin port {killed}); a "
                  f"backup took over within {took_over:.2f} s (metrics refresh every 1 s); "
                  f"learn and infer answered {time.time() - t0:.2f} s after the kill")
    except Exception as e:  # report, then still stop the cluster
        print(f"run_local_test: the cluster did not serve MCP on {MCP}: {e}")
        os.killpg(p.pid, signal.SIGKILL)
        return 1
    os.killpg(p.pid, signal.SIGINT)
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        print("run_local_test: run_local.sh did not stop within 60 s of Ctrl-C")
        return 1
    time.sleep(0.5)
    rest = output()
    left = cluster_processes()
    print(f"run_local_test: served infer -> {label}; after Ctrl-C exit status {rc}, "
          f"{len(left)} cluster processes left")
    if rc != 0 or left or "cluster stopped" not in rest:
        print(rest[-2000:])
        for pid in left:
            os.kill(int(pid), signal.SIGKILL)
        return 1
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
