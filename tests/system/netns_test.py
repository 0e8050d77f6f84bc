#!/usr/bin/env python3
"""Multi-host test: PS shards, workers, the MCP bridge and the client each in their own
Linux network namespace, like pods, wired to one software switch.

  ps0 10.213.0.10   ps1 10.213.0.11      (onlineps_ps, RPC :7000, admin :7100)
  w0  10.213.0.20   w1  10.213.0.21      (onlineps_worker, RPC :7200, admin :7300)
  br  10.213.0.30                        (onlineps_mcp_bridge, MCP :7400, admin :7401)
  cl  10.213.0.40                        (this test's MCP client and probes)

Each namespace has only its loopback and one veth whose peer sits on a Linux bridge in a
seventh namespace (the switch), so every hop is a real TCP connection between addresses,
as between pods. The test checks: every process runs in its own namespace; the cluster
becomes ready; learn through one session's worker is seen by infer through the other
worker (the update went worker -> shards -> worker across namespaces); cutting shard 1's
link turns the workers' /readyz to 503 and restoring it turns it back; SIGTERM stops
every process with exit 0.

Where network namespaces cannot be created (not root, no CAP_SYS_ADMIN / CAP_NET_ADMIN,
no bridge support) the test prints why and exits 77, which ctest reports as skipped.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: opslib
import opslib  # noqa: E402

SKIP = 77
BIN = os.environ.get("ONLINEPS_BIN_DIR", os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "build", "bin"))
PREFIX = f"ops{os.getpid()}"
HOSTS = {"ps0": "10.213.0.10", "ps1": "10.213.0.11", "w0": "10.213.0.20",
         "w1": "10.213.0.21", "br": "10.213.0.30", "cl": "10.213.0.40"}
SWITCH = f"{PREFIX}-sw"


def ns(host):
    return f"{PREFIX}-{host}"


def ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def skip(why):
    print(f"SKIP: multi-host test not run: {why}")
    sys.exit(SKIP)


def veth(host, side):
    # Interface names are at most 15 bytes: "ops" + pid (<= 7 digits) + side + index.
    return f"{PREFIX}{side}{list(HOSTS).index(host)}"


def build_network():
    if shutil.which("ip") is None:
        skip("the `ip` command (iproute2) is not installed")
    if os.geteuid() != 0:
        skip("creating network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)")
    r = ip("netns", "add", SWITCH, check=False)
    if r.returncode != 0:
        skip(f"`ip netns add` failed: {r.stderr.strip()} (a container without "
             "CAP_SYS_ADMIN cannot create network namespaces)")
    r = ip("-n", SWITCH, "link", "add", "sw0", "type", "bridge", check=False)
    if r.returncode != 0:
        skip(f"cannot create a Linux bridge: {r.stderr.strip()}")
    ip("-n", SWITCH, "link", "set", "sw0", "up")
    for host, addr in HOSTS.items():
        ip("netns", "add", ns(host))
        outer, inner = veth(host, "a"), veth(host, "b")
        ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        ip("link", "set", outer, "netns", SWITCH)
        ip("-n", SWITCH, "link", "set", outer, "master", "sw0", "up")
        ip("link", "set", inner, "netns", ns(host))
        ip("-n", ns(host), "link", "set", inner, "name", "eth0")
        ip("-n", ns(host), "addr", "add", f"{addr}/24", "dev", "eth0")
        ip("-n", ns(host), "link", "set", "eth0", "up")
        ip("-n", ns(host), "link", "set", "lo", "up")


def teardown_network():
    for name in [SWITCH] + [ns(h) for h in HOSTS]:
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        ip("netns", "del", name, check=False)


def in_ns(host, argv):
    return ["ip", "netns", "exec", ns(host), *argv]


def probe(host, url, timeout=3):
    """GET from inside the client namespace: returns the HTTP status (0 when unreachable)."""
    r = subprocess.run(in_ns("cl", ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                                    "--max-time", str(timeout), url]),
                       capture_output=True, text=True)
    return int(r.stdout or 0)


def run_client(script):
    """Runs python code in the client namespace with opslib importable; returns stdout."""
    r = subprocess.run(in_ns("cl", [sys.executable, "-c", script]), capture_output=True,
                       text=True, timeout=180,
                       env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})
    if r.returncode != 0:
        raise AssertionError(f"client in namespace cl failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


CLIENT = r"""
import json, opslib, time
url = "http://10.213.0.30:7400/mcp"
train = [{"text": "a wonderful lovely film", "label": "positive"},
         {"text": "a dull tedious waste", "label": "negative"}]
# Sessions until both workers hold at least one (placement is by consistent hashing).
sessions, seen = [], {}
for _ in range(32):
    s = opslib.McpSession(url)
    s.call("infer", {"text": "warm up"})
    info = s.call("model_info", {})
    sessions.append(s)
    busy = [w["endpoint"] for w in info["workers"] if w["sessions"] > 0]
    if len(busy) == 2:
        break
info = sessions[-1].call("model_info", {})
print("WORKERS", json.dumps({w["endpoint"]: w["sessions"] for w in info["workers"]}))
teacher = sessions[0]
before = sessions[-1].call("infer", {"text": "a wonderful lovely film"})
for _ in range(30):
    out = teacher.call("learn", {"examples": train})
print("LEARN", json.dumps(out))
# A worker serves from its parameter cache, refreshed within --dense-max-age-ms (500 ms):
# the other worker sees the update within about that long.
deadline = time.time() + 10
while True:
    after = {i: s.call("infer", {"text": "a wonderful lovely film"}) for i, s in enumerate(sessions)}
    if all(a["model_version"] > 0 for a in after.values()) or time.time() > deadline:
        break
    time.sleep(0.1)
neg = sessions[-1].call("infer", {"text": "a dull tedious waste"})
print("BEFORE", json.dumps(before))
print("AFTER", json.dumps(after))
print("NEG", json.dumps(neg))
"""


def main():
    if not os.path.exists(os.path.join(BIN, "onlineps_mcp_bridge")):
        print(f"netns_test: binaries not found in {BIN} (set ONLINEPS_BIN_DIR)")
        return 1
    try:
        build_network()
    except RuntimeError as e:
        teardown_network()
        skip(str(e))
    work = tempfile.mkdtemp(prefix="onlineps-netns.")
    procs = {}
    try:
        shards = ",".join(f"tcp://{HOSTS[h]}:7000" for h in ("ps0", "ps1"))
        for i, h in enumerate(("ps0", "ps1")):
            procs[h] = opslib.Proc(h, in_ns(h, [
                f"{BIN}/onlineps_ps", "--shard-index", str(i), "--num-shards", "2",
                "--listen", f"tcp://{HOSTS[h]}:7000", "--admin-host", HOSTS[h],
                "--admin-port", "7100", "--checkpoint-dir", os.path.join(work, h),
                "--log-format", "json"]), work)
        for h in ("w0", "w1"):
            procs[h] = opslib.Proc(h, in_ns(h, [
                f"{BIN}/onlineps_worker", "--ps", shards, "--listen", f"tcp://{HOSTS[h]}:7200",
                "--admin-host", HOSTS[h], "--admin-port", "7300", "--model", "text",
                "--labels", "negative,positive", "--lr", "1.0", "--log-format", "json"]), work)
        procs["br"] = opslib.Proc("br", in_ns("br", [
            f"{BIN}/onlineps_mcp_bridge", "--workers",
            ",".join(f"tcp://{HOSTS[h]}:7200" for h in ("w0", "w1")),
            "--host", HOSTS["br"], "--port", "7400", "--allowed-hosts", HOSTS["br"],
            "--admin-host", HOSTS["br"], "--admin-port", "7401", "--log-format", "json"]), work)

        ready = {h: f"http://{HOSTS[h]}:{port}/readyz" for h, port in
                 (("ps0", 7100), ("ps1", 7100), ("w0", 7300), ("w1", 7300), ("br", 7401))}
        for h, url in ready.items():
            opslib.wait_until(lambda: probe(h, url) == 200 or not procs[h].alive(), 120,
                              f"{h} ready at {url}", step=0.5)
            assert procs[h].alive(), f"{h} exited:\n{procs[h].output()[-2000:]}"
        # Every process lives in its own namespace, not in the test's.
        own = os.readlink("/proc/self/ns/net")
        spaces = {h: os.readlink(f"/proc/{p.pid}/ns/net") for h, p in procs.items()}
        assert own not in spaces.values(), f"a process shares the test's namespace: {spaces}"
        assert len(set(spaces.values())) == len(spaces), f"namespaces shared: {spaces}"
        print("netns_test: 6 namespaces, every process ready across veth links")

        out = run_client(CLIENT)
        lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        workers = json.loads(lines["WORKERS"])
        print(f"netns_test: sessions per worker {workers}")
        assert len(workers) == 2 and all(n > 0 for n in workers.values()), \
            f"sessions did not spread over both workers: {workers}"
        after = json.loads(lines["AFTER"])
        neg = json.loads(lines["NEG"])
        before = json.loads(lines["BEFORE"])
        assert all(a["label"] == "positive" for a in after.values()), after
        assert neg["label"] == "negative", neg
        assert after[str(len(after) - 1)]["scores"]["positive"] > before["scores"]["positive"]
        print("netns_test: learn in one session changed infer in every session on both workers")

        # The shards saw the pushes over the network.
        for h in ("ps0", "ps1"):
            r = subprocess.run(in_ns("cl", ["curl", "-s", f"http://{HOSTS[h]}:7100/metrics"]),
                               capture_output=True, text=True)
            pushes = opslib.metric(r.stdout, "onlineps_ps_requests_total", {"op": "push_dense"})
            assert pushes > 0, f"{h} counted no pushes:\n{r.stdout[:2000]}"

        # Cut shard 1's link: both workers stop being ready; restore it: ready again.
        ip("-n", SWITCH, "link", "set", veth("ps1", "a"), "down")
        for h in ("w0", "w1"):
            opslib.wait_until(lambda: probe(h, ready[h]) == 503, 30,
                              f"{h} /readyz 503 with shard 1 unreachable", step=0.5)
        ip("-n", SWITCH, "link", "set", veth("ps1", "a"), "up")
        for h in ("w0", "w1"):
            opslib.wait_until(lambda: probe(h, ready[h]) == 200, 30,
                              f"{h} /readyz 200 once shard 1 is back", step=0.5)
        print("netns_test: link down -> workers not ready; link up -> ready again")

        codes = {}
        for h in ("br", "w0", "w1", "ps0", "ps1"):
            codes[h] = procs[h].stop(signal.SIGTERM, timeout=30)
        assert all(c == 0 for c in codes.values()), f"exit codes after SIGTERM: {codes}"
        print(f"netns_test: SIGTERM -> exit codes {codes}")
        print("netns_test: PASS")
        return 0
    except AssertionError as e:
        print(f"netns_test: FAIL: {e}")
        for h, p in procs.items():
            print(f"--- {h} log (tail) ---\n{p.output()[-1500:]}")
        return 1
    finally:
        for p in procs.values():
            if p.alive():
                p.stop(signal.SIGKILL, timeout=5)
        teardown_network()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
