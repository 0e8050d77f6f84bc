#!/usr/bin/env python3
"""CurveZMQ across real processes: a shard, a worker and the bridge, each with its own
certificate made by `onlineps_ps_cli curve-keygen`, the shard and the worker admitting
only the keys in their --curve-allow lists.

  - MCP learn and infer work through the encrypted links;
  - onlineps_ps_cli reaches the shard with an allowed certificate, and gets nothing
    through (a timeout, exit 1) without CURVE or with a certificate not on the list;
  - onlineps_worker_cli without the worker's key gets nothing through either;
  - a bad key file is refused at start, naming the file and line;
  - two workers in a --group local over CURVE (each its own certificate, admitted by
    --group-curve-keys) complete their rounds.
"""
import json
import socket
import os
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: opslib
import opslib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("ONLINEPS_BIN_DIR", os.path.join(ROOT, "build", "bin"))


def fail(msg):
    print(f"curve_cluster_test: FAIL: {msg}")
    sys.exit(1)


endpoint = opslib.endpoint


def run(argv, timeout=60):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def main():
    work = tempfile.mkdtemp(prefix="onlineps-curve.")
    certs = {}
    for name in ("ps", "worker", "bridge", "cli", "stranger"):
        path = os.path.join(work, name)
        r = run([f"{BIN}/onlineps_ps_cli", "curve-keygen", path])
        if r.returncode != 0 or not os.path.exists(path + ".pub"):
            fail(f"curve-keygen {name}: {r.returncode}\n{r.stdout}{r.stderr}")
        if os.stat(path).st_mode & 0o077:
            fail(f"{path} is readable by others")
        certs[name] = path
    r = run([f"{BIN}/onlineps_ps_cli", "curve-keygen", certs["ps"]])
    if r.returncode == 0 or "exists" not in r.stderr:
        fail(f"curve-keygen over an existing file: {r.returncode} {r.stderr}")
    ps_allow = os.path.join(work, "ps.allow")
    with open(ps_allow, "w") as f:
        for name in ("worker", "cli"):
            f.write(open(certs[name] + ".pub").read())

    bad = os.path.join(work, "bad.pub")
    with open(bad, "w") as f:
        f.write("# a key file with a typo\nnot-a-key\n")
    r = run([f"{BIN}/onlineps_ps", "--listen", "tcp://127.0.0.1:0", "--admin-port", "-1",
             "--curve-cert", certs["ps"], "--curve-allow", bad])
    if r.returncode != 2 or "bad.pub:2" not in r.stderr:
        fail(f"a bad --curve-allow file: exit {r.returncode}\n{r.stderr}")

    procs = []
    try:
        shard = opslib.Proc("ps", [f"{BIN}/onlineps_ps", "--listen", "tcp://127.0.0.1:0",
                                   "--admin-port", "-1", "--curve-cert", certs["ps"],
                                   "--curve-allow", ps_allow], work)
        procs.append(shard)
        ps = endpoint(shard, "the shard")
        worker = opslib.Proc("worker", [f"{BIN}/onlineps_worker", "--ps", ps, "--listen",
                                        "tcp://127.0.0.1:0", "--admin-port", "-1", "--model",
                                        "text", "--curve-cert", certs["worker"],
                                        "--curve-server-key", certs["ps"] + ".pub",
                                        "--curve-allow", certs["bridge"] + ".pub"], work)
        procs.append(worker)
        w = endpoint(worker, "the worker")
        bridge = opslib.Proc("bridge", [f"{BIN}/onlineps_mcp_bridge", "--workers", w, "--port",
                                        "0", "--admin-port", "-1", "--curve-cert",
                                        certs["bridge"], "--curve-server-key",
                                        certs["worker"] + ".pub"], work)
        procs.append(bridge)
        url = endpoint(bridge, "the bridge")
        s = opslib.McpSession(url)
        for _ in range(3):
            learned = s.call("learn", {"examples": [{"text": "great film", "label": "positive"},
                                                    {"text": "dull film", "label": "negative"}]})
        if learned.get("model_version", 0) < 1:
            fail(f"learn over CURVE: {learned}")
        s.call("infer", {"text": "a great film"})
        print(f"curve_cluster_test: learn and infer over CURVE (model version "
              f"{learned['model_version']})")

        def cli(*cert):
            return run([f"{BIN}/onlineps_ps_cli", "--shards", ps, "--timeout-ms", "1500",
                        *cert, "pull", "--table", "text/out.bias"], timeout=30)
        ok = cli("--curve-cert", certs["cli"], "--curve-server-key", certs["ps"] + ".pub")
        if ok.returncode != 0:
            fail(f"the allowed CLI certificate was refused:\n{ok.stdout}{ok.stderr}")
        for what, args in (("without CURVE", ()),
                           ("a certificate not on the list",
                            ("--curve-cert", certs["stranger"], "--curve-server-key",
                             certs["ps"] + ".pub")),
                           ("the wrong server key",
                            ("--curve-cert", certs["cli"], "--curve-server-key",
                             certs["worker"] + ".pub"))):
            r = cli(*args)
            if r.returncode == 0:
                fail(f"onlineps_ps_cli {what} read the table:\n{r.stdout}")
        r = run([f"{BIN}/onlineps_worker_cli", "--worker", w, "--timeout-ms", "1500",
                 "worker_stats"], timeout=30)
        if r.returncode == 0:
            fail(f"onlineps_worker_cli without CURVE got an answer:\n{r.stdout}")
        r = run([f"{BIN}/onlineps_worker_cli", "--worker", w, "--timeout-ms", "3000",
                 "--curve-cert", certs["bridge"], "--curve-server-key", certs["worker"] + ".pub",
                 "worker_stats"], timeout=30)
        if r.returncode != 0:
            fail(f"onlineps_worker_cli with the bridge's certificate:\n{r.stdout}{r.stderr}")
        if "refused a CURVE client" not in shard.stderr():
            fail("the shard did not log the refused client key")
        s.call("infer", {"text": "still serving"})

        group_keys = os.path.join(work, "group.keys")
        with open(group_keys, "w") as f:  # rank 0's key first
            for name in ("worker", "cli"):
                f.write(open(certs[name] + ".pub").read())
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            group_ep = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
        members = []
        for rank, cert in ((0, "worker"), (1, "cli")):
            g = opslib.Proc(f"group{rank}", [
                f"{BIN}/onlineps_worker", "--ps", ps, "--listen", "tcp://127.0.0.1:0",
                "--admin-port", "-1", "--model", "text", "--curve-cert", certs[cert],
                "--curve-server-key", certs["ps"] + ".pub", "--curve-allow",
                certs["bridge"] + ".pub", "--group", "local", "--group-size", "2",
                "--group-rank", str(rank), "--group-endpoint", group_ep,
                "--group-curve-keys", group_keys, "--group-round-ms", "50",
                "--group-timeout-ms", "5000"], work)
            procs.append(g)
            members.append((g, endpoint(g, f"group member {rank}")))

        def stats(ep):
            r = run([f"{BIN}/onlineps_worker_cli", "--worker", ep, "--timeout-ms", "3000",
                     "--curve-cert", certs["bridge"], "--curve-server-key",
                     certs["worker"] + ".pub" if ep == members[0][1] else certs["cli"] + ".pub",
                     "worker_stats"], timeout=30)
            if r.returncode != 0:
                fail(f"worker_stats of {ep}: {r.returncode}\n{r.stdout}{r.stderr}")
            return json.loads(r.stdout)

        opslib.wait_until(lambda: all(stats(ep)["group_rounds"] >= 3 for _, ep in members),
                          30, "three local group rounds over CURVE")
        for g, ep in members:
            st = stats(ep)
            if not st["group_active"]:
                fail(f"{g.name}: the group broke: {st}\n{g.stderr()[-2000:]}")
        print("curve_cluster_test: a local group of two workers over CURVE completes rounds")
        for p in reversed(procs):
            if p.stop(signal.SIGTERM) != 0:
                fail(f"{p.name} did not exit 0:\n{p.stderr()[-2000:]}")
    finally:
        for p in procs:
            if p.alive():
                p.stop(signal.SIGKILL)
    print("curve_cluster_test: PASS (CURVE links work; peers without the right keys get "
          "nothing through; bad key files named)")


if __name__ == "__main__":
    main()
