#!/usr/bin/env python3
"""The README's run command serves MCP, and Ctrl-C stops the whole cluster with exit 0.

Starts scripts/run_local.sh (ports 17000+, so a developer's own cluster on the default
ports is not disturbed) in its own process group, waits until it says it is serving,
calls tools/call infer on its MCP endpoint, then sends SIGINT to the group as a
terminal's Ctrl-C does, and checks the exit status and that no cluster process is left.
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MCP = "http://127.0.0.1:17400/mcp"


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
    out = subprocess.run(["pgrep", "-f", "tcp://127.0.0.1:17"], capture_output=True, text=True)
    return [p for p in out.stdout.split() if p]


def main():
    if cluster_processes():
        print("run_local_test: processes on ports 17xxx already run; stop them first")
        return 1
    cmd = ["bash", os.path.join(ROOT, "scripts/run_local.sh"), "--steps", "20",
           "--base-port", "17000", "--mcp-port", "17400"]
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
