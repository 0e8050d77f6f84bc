#!/usr/bin/env python3
"""Soak test: a local cluster (2 PS shards, 2 `text` workers, 1 MCP bridge on loopback,
free ports) under a mixed MCP infer/learn load from several client sessions.

Every --report-s it prints throughput, latency, RSS and errors; at the end it writes
OUT/soak.json (figures and checks) and OUT/rss.csv (every RSS sample), and exits 0 only
if every check passes (1 if one fails, 124 at --hard-timeout):
  errors     no failed call (HTTP, JSON-RPC, tool error, timeout, unexpected result)
  rss        no process grew more than max(--rss-tolerance-mib, --rss-tolerance-pct of
             its baseline) from the baseline window (the --window after --warmup) to
             the last --window of the run
  alive      no process exited during the run
  sessions   the bridge holds no more MCP sessions than the clients have open (ended
             sessions are released)
  shutdown   every process exits 0 within 30 s of SIGTERM (shards write a checkpoint)
The load uses the demo's fixed vocabulary, so the tables stop growing after the first
calls: growth after warm-up is a leak, not data. Standard library only.
"""
import argparse
import csv
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTOCOL = "2025-11-25"
LABELS = ("negative", "positive")
# scripts/mcp_demo.sh's training set; the probes reuse its words.
TRAIN = [("a wonderful and moving film", "positive"), ("great acting and a lovely story", "positive"),
         ("i loved every minute of it", "positive"), ("brilliant funny and warm", "positive"),
         ("an excellent delightful surprise", "positive"), ("a boring and painful mess", "negative"),
         ("terrible acting and a dull story", "negative"), ("i hated every minute of it", "negative"),
         ("awful tedious and cold", "negative"), ("a dreadful disappointing waste", "negative")]
PROBES = ["a lovely warm film", "a dull and tedious waste", "great story", "awful acting",
          "a moving and delightful surprise", "boring cold mess", "i loved it", "i hated it"]
children = []  # every process started, for cleanup on any exit


def parse_args():
    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass
    p = argparse.ArgumentParser(description=__doc__, formatter_class=Formatter)
    a = p.add_argument
    a("--duration", type=float, default=600, metavar="S", help="seconds of load")
    a("--sessions", type=int, default=6, metavar="N", help="concurrent MCP sessions, a thread each")
    a("--learn-fraction", type=float, default=0.3, metavar="F", help="share of calls that learn")
    a("--examples", type=int, default=4, metavar="N", help="most examples per learn (1..N)")
    a("--think-ms", type=float, default=20, metavar="MS", help="pause of a session between calls")
    a("--session-calls", type=int, default=500, metavar="N",
      help="a session ends (DELETE) and a new one opens after N calls (0: never)")
    a("--warmup", type=float, default=60, metavar="S",
      help="seconds left out of the RSS check (at most a third of --duration)")
    a("--window", type=float, default=60, metavar="S", help="seconds averaged for each RSS "
      "figure (first, baseline, last; at most half of what follows the warm-up)")
    a("--rss-tolerance-mib", type=float, default=16, metavar="MIB",
      help="RSS growth allowed per process")
    a("--rss-tolerance-pct", type=float, default=10, metavar="PCT",
      help="RSS growth allowed per process, percent of its baseline (the larger allowance wins)")
    a("--sample-s", type=float, default=1, metavar="S", help="RSS sampling period")
    a("--report-s", type=float, default=10, metavar="S", help="progress line period")
    a("--call-timeout-s", type=float, default=30, metavar="S", help="deadline of one MCP request")
    a("--hard-timeout", type=float, default=0, metavar="S",
      help="kill everything and exit 124 after S seconds (0: --duration + 240)")
    a("--bin-dir", default=os.environ.get("ONLINEPS_BIN_DIR", os.path.join(ROOT, "build", "bin")),
      metavar="DIR", help="where onlineps_ps, onlineps_worker and onlineps_mcp_bridge are ($ONLINEPS_BIN_DIR)")
    a("--out", default="", metavar="DIR",
      help="for soak.json, rss.csv and the logs (empty: a new $TMPDIR/onlineps-soak.*)")
    args = p.parse_args()
    if args.duration <= 0 or args.sessions < 1 or not 0 <= args.learn_fraction <= 1:
        p.error("need --duration > 0, --sessions >= 1 and 0 <= --learn-fraction <= 1")
    return args


class Child:
    """A cluster process in its own process group; stdout and stderr in LOGDIR/NAME.log."""

    def __init__(self, name, argv, logdir):
        self.name, self.log = name, os.path.join(logdir, f"{name}.log")
        # ONLINEPS_* variables would change the flags' defaults: the cluster is what argv says.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ONLINEPS_")}
        with open(self.log, "w") as log:
            self.p = subprocess.Popen(argv + ["--log-level", "info", "--log-format", "text"],
                                      stdout=log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        children.append(self)

    def wait_for(self, pattern, timeout=60):
        """The first match of `pattern` in the process's output; RuntimeError if it exits first."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with open(self.log, errors="replace") as f:
                text = f.read()
            if re.search(pattern, text):
                return re.search(pattern, text).group(1)
            if self.p.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not print /{pattern}/ (exit {self.p.poll()}):\n"
                           + text[-2000:])

    def stop(self, timeout=30):
        """SIGTERM, then SIGKILL to the group after `timeout`; the exit code (None if killed)."""
        if self.p.poll() is None:
            self.p.terminate()
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.p.wait()


def http_get(url, timeout=5):
    """The body of a 200 answer, else None."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except OSError:  # URLError and HTTPError too
        return None


def wait_ready(admin, what, timeout=60):
    deadline = time.time() + timeout
    while http_get(f"http://{admin}/readyz") is None:
        if time.time() > deadline:
            raise RuntimeError(f"{what} not ready on http://{admin}/readyz after {timeout} s")
        time.sleep(0.2)


def start_cluster(b, logdir):
    """Returns ({name: Child}, MCP URL, shard admin addresses, bridge admin address)."""
    admin_re = r"admin endpoints on http://(\S+)/metrics"
    procs, shards, shard_admins, workers = {}, [], [], []
    for i in range(2):
        c = procs[f"ps{i}"] = Child(f"ps{i}", [
            f"{b}/onlineps_ps", "--shard-index", str(i), "--num-shards", "2", "--listen",
            "tcp://127.0.0.1:0", "--admin-port", "0", "--no-restore",
            "--checkpoint-dir", os.path.join(logdir, "checkpoints")], logdir)
        shards.append(c.wait_for(r"LISTENING (\S+)"))
        shard_admins.append(c.wait_for(admin_re))
    for j in range(2):  # scripts/run_local.sh's demo model
        c = procs[f"worker{j}"] = Child(f"worker{j}", [
            f"{b}/onlineps_worker", "--ps", ",".join(shards), "--listen", "tcp://127.0.0.1:0",
            "--admin-port", "0", "--model", "text", "--labels", ",".join(LABELS), "--lr", "1.0",
            "--optimizer", "sgd", "--staleness-policy", "lr_over_tau"], logdir)
        workers.append(c.wait_for(r"LISTENING (\S+)"))
        wait_ready(c.wait_for(admin_re), c.name)
    c = procs["bridge"] = Child("bridge", [f"{b}/onlineps_mcp_bridge", "--workers", ",".join(workers),
                                           "--port", "0", "--admin-port", "0"], logdir)
    url, bridge_admin = c.wait_for(r"LISTENING (\S+)"), c.wait_for(r"ADMIN (\S+)")
    wait_ready(bridge_admin, "the bridge")
    return procs, url, shard_admins, bridge_admin


class Mcp:
    """One MCP session over one keep-alive HTTP connection. Raises on any failure."""

    def __init__(self, url, timeout):
        u = urllib.parse.urlsplit(url)
        self.path, self.sid, self.next_id, self.last = u.path, None, 1, time.monotonic()
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        r = self.request("POST", {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL, "capabilities": {},
            "clientInfo": {"name": "onlineps-soak", "version": "1"}}})
        if "result" not in r or not self.sid:
            raise RuntimeError(f"initialize: {r}")
        self.request("POST", {"jsonrpc": "2.0", "method": "notifications/initialized"})

    def request(self, method, body=None):
        # The bridge closes connections idle for --keep-alive-s (5 s): reconnect before
        # that, so that a connection it closed is never counted as an error.
        if time.monotonic() - self.last > 3:
            self.conn.close()
        headers = {"Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream"}
        if self.sid:
            headers.update({"Mcp-Session-Id": self.sid, "MCP-Protocol-Version": PROTOCOL})
        self.conn.request(method, self.path, body and json.dumps(body), headers)
        resp = self.conn.getresponse()
        text, self.last = resp.read().decode(), time.monotonic()
        if resp.status not in (200, 202, 204):
            raise RuntimeError(f"HTTP {resp.status} {text[:200]}")
        self.sid = self.sid or resp.getheader("Mcp-Session-Id")
        return json.loads(text) if text.strip() else {}  # JSON: no call asks for progress

    def call(self, tool, arguments):
        """tools/call; its structuredContent."""
        rid, self.next_id = self.next_id, self.next_id + 1
        r = self.request("POST", {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                                  "params": {"name": tool, "arguments": arguments}})
        if "error" in r:
            raise RuntimeError(f"JSON-RPC {r['error'].get('code')} {r['error'].get('message')}")
        if r["result"].get("isError"):
            raise RuntimeError(f"tool error: {r['result']['content'][0]['text'][:200]}")
        return r["result"]["structuredContent"]

    def close(self, delete=True):
        try:
            if delete:
                self.request("DELETE")
        finally:
            self.conn.close()


class Stats:
    """Latencies (ms) and errors of the client threads; thread safe."""

    def __init__(self):
        self.mu = threading.Lock()
        self.all, self.interval = {"infer": [], "learn": []}, {"infer": [], "learn": []}
        self.errors, self.error_count, self.open_sessions = [], 0, 0

    def add(self, tool, ms):
        with self.mu:
            self.all[tool].append(ms)
            self.interval[tool].append(ms)

    def error(self, t, what):
        with self.mu:
            self.error_count += 1
            if len(self.errors) < 50:
                self.errors.append({"t_s": round(t, 1), "error": what})

    def sessions(self, delta):
        with self.mu:
            self.open_sessions += delta

    def take_interval(self):
        with self.mu:
            out, self.interval = self.interval, {"infer": [], "learn": []}
            return out


def client(n, url, args, stats, stop, t0):
    """One client thread: calls until `stop`, a new MCP session every --session-calls."""
    rng, mcp, calls = random.Random(n), None, 0
    while not stop.is_set():
        tool = "learn" if rng.random() < args.learn_fraction else "infer"
        try:
            if mcp is None:
                mcp, calls = Mcp(url, args.call_timeout_s), 0
                stats.sessions(+1)
            if tool == "learn":
                ex = rng.sample(TRAIN, rng.randint(1, min(args.examples, len(TRAIN))))
                arguments = {"examples": [{"text": t, "label": lab} for t, lab in ex]}
            else:
                arguments = {"text": rng.choice(PROBES)}
            start = time.perf_counter()
            r = mcp.call(tool, arguments)
            ms = (time.perf_counter() - start) * 1e3
            if tool == "learn" and r.get("outcome") != "applied":
                raise RuntimeError(f"learn outcome {r.get('outcome')!r}: {r}")
            if tool == "infer" and r.get("label") not in LABELS:
                raise RuntimeError(f"infer label {r.get('label')!r}: {r}")
            stats.add(tool, ms)
            calls += 1
            if args.session_calls and calls >= args.session_calls:
                tool, m, mcp = "DELETE", mcp, None
                stats.sessions(-1)
                m.close()
        except Exception as e:  # every failure is counted; the session starts over
            stats.error(time.monotonic() - t0, f"session {n} {tool}: {type(e).__name__}: {e}")
            if mcp is not None:
                mcp.close(delete=False)
                stats.sessions(-1)
            mcp = None
            stop.wait(0.5)
        stop.wait(args.think_ms / 1e3)


def rss_kib(pid):
    """VmRSS of a process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1))
    except (OSError, AttributeError):
        return 0


def cpu_s(pid):
    """User + system CPU seconds of a process so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:  # utime, stime: fields 14, 15 (after "comm)")
            utime, stime = f.read().rsplit(")", 1)[1].split()[11:13]
        return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return 0.0


def metric(text, name):
    """{label string: value} of the samples of metric `name` in a Prometheus page."""
    return {m.group(1) or "": float(m.group(2))
            for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M)}


def staleness(admins):
    """The shards' onlineps_ps_push_staleness summed: ({le: cumulative count}, sum, count)."""
    buckets, total, count = {}, 0.0, 0.0
    for a in admins:
        text = http_get(f"http://{a}/metrics") or ""
        for labels, v in metric(text, "onlineps_ps_push_staleness_bucket").items():
            le = re.search(r'[{,]le="([^"]+)"', labels).group(1)  # not table="..."
            buckets[le] = buckets.get(le, 0) + v
        total += sum(metric(text, "onlineps_ps_push_staleness_sum").values())
        count += sum(metric(text, "onlineps_ps_push_staleness_count").values())
    return buckets, total, count


def staleness_summary(before, after):
    """Pushes between two staleness() scrapes: count, mean, bucket quantiles, tau -> pushes."""
    les = sorted(after[0], key=float)  # float("+Inf") sorts last
    cum = [after[0][le] - before[0].get(le, 0) for le in les]
    count, dist, prev, lo = after[2] - before[2], {}, 0, -1
    for le, c in zip(les, cum):  # tau is an integer: bucket (lo, hi] is lo+1..hi
        hi = float(le)
        key = f">{lo:g}" if hi == float("inf") else f"{hi:g}" if hi - lo <= 1 else f"{lo + 1:g}-{hi:g}"
        dist[key], prev, lo = int(c - prev), c, hi
    q = {f"p{int(p * 100)}_at_most": next((le for le, c in zip(les, cum) if c >= p * count), None)
         for p in (0.5, 0.99)} if count else {}
    return {"pushes": int(count), "mean": round((after[1] - before[1]) / count, 3) if count else None,
            **q, "buckets": dist}


def pct(values, q):
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 2) if s else None


def rss_summary(names, samples, duration, args):
    """Per process: first, baseline and last window averages (MiB), the least-squares slope
    after warm-up, and the growth check."""
    warmup = min(args.warmup, duration / 3)
    window = max(args.sample_s, min(args.window, (duration - warmup) / 2))
    out, failures = {}, []
    for i, name in enumerate(names, 1):
        def avg(lo, hi):
            v = [s[i] for s in samples if lo <= s[0] < hi]
            return sum(v) / len(v) / 1024 if v else float("nan")
        first, base, last = avg(0, window), avg(warmup, warmup + window), avg(duration - window, 1e18)
        pts = [(s[0], s[i] / 1024) for s in samples if s[0] >= warmup] or [(0, 0)]
        mt, mr = sum(t for t, _ in pts) / len(pts), sum(r for _, r in pts) / len(pts)
        var = sum((t - mt) ** 2 for t, _ in pts) or 1
        slope = sum((t - mt) * (r - mr) for t, r in pts) / var * 3600
        allowed = max(args.rss_tolerance_mib, base * args.rss_tolerance_pct / 100)
        out[name] = {k: round(v, 1) for k, v in (
            ("first_window_mib", first), ("baseline_mib", base), ("last_window_mib", last),
            ("growth_mib", last - base), ("allowed_mib", allowed), ("slope_mib_per_hour", slope),
            ("max_mib", max(s[i] for s in samples) / 1024))}
        if not last - base <= allowed:  # NaN (no samples) fails too
            failures.append(f"rss: {name} grew from {base:.1f} MiB (after the {warmup:.0f} s "
                            f"warm-up) to {last:.1f} MiB, more than the {allowed:.1f} MiB allowed")
    return {"warmup_s": round(warmup, 1), "window_s": round(window, 1), "processes": out}, failures


def drive(args, procs, shard_admins, stats, stop, t0):
    """Samples RSS and prints progress until --duration; the samples and any failure."""
    names, samples, failures = list(procs), [], []
    st0, next_report, last_report = staleness(shard_admins), args.report_s, 0.0
    while True:
        now = time.monotonic() - t0
        samples.append([round(now, 2)] + [rss_kib(procs[n].p.pid) for n in names])
        dead = [f"{n} (exit {c.p.poll()})" for n, c in procs.items() if c.p.poll() is not None]
        if dead:
            failures.append("alive: exited during the run: " + ", ".join(dead))
            break
        if now >= next_report or now >= args.duration:
            iv, span = stats.take_interval(), now - last_report
            st = staleness_summary(st0, staleness(shard_admins))
            mib = " ".join(f"{n} {v / 1024:.0f}" for n, v in zip(names, samples[-1][1:]))
            print(f"soak: {now:4.0f}s  infer {len(iv['infer']) / span:5.1f}/s p50 "
                  f"{pct(iv['infer'], .5)} p99 {pct(iv['infer'], .99)} ms  learn "
                  f"{len(iv['learn']) / span:5.1f}/s p99 {pct(iv['learn'], .99)} ms  errors "
                  f"{stats.error_count}  pushes {st['pushes']} mean tau {st['mean']}  RSS MiB {mib}",
                  flush=True)
            last_report, next_report = now, next_report + args.report_s
        if now >= args.duration:
            break
        time.sleep(max(0.0, args.sample_s - (time.monotonic() - t0 - now)))
    return samples, failures


def run(args, out_dir, result):
    procs, url, shard_admins, bridge_admin = start_cluster(args.bin_dir, out_dir)
    names = list(procs)
    result.update(mcp_url=url, pids={n: c.p.pid for n, c in procs.items()})
    print(f"soak: cluster up, MCP {url}; {args.sessions} sessions for {args.duration:.0f} s; "
          f"results and logs in {out_dir}", flush=True)
    stats, stop, st0 = Stats(), threading.Event(), staleness(shard_admins)
    t0, cpu0 = time.monotonic(), time.process_time()
    threads = [threading.Thread(target=client, args=(n, url, args, stats, stop, t0), daemon=True)
               for n in range(args.sessions)]
    for t in threads:
        t.start()
    samples, failures = drive(args, procs, shard_admins, stats, stop, t0)
    stop.set()
    for t in threads:
        t.join(args.call_timeout_s + 5)
    elapsed = time.monotonic() - t0
    with open(os.path.join(out_dir, "rss.csv"), "w", newline="") as f:
        csv.writer(f).writerows([["t_s"] + [f"{n}_rss_kib" for n in names]] + samples)
    # The gauge is refreshed once a second: a session ended in the last second still
    # counts until then. A leak stays.
    deadline = time.monotonic() + 5
    while True:
        held = sum(metric(http_get(f"http://{bridge_admin}/metrics") or "",
                          "onlineps_bridge_mcp_sessions").values())
        if held <= stats.open_sessions or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    if held > stats.open_sessions:
        failures.append(f"sessions: the bridge holds {held:.0f} MCP sessions, the clients "
                        f"{stats.open_sessions}: ended sessions were not released")
    if stats.error_count:
        failures.append(f"errors: {stats.error_count} failed calls, the first: "
                        f"{stats.errors[0]['error']}")
    rss, rss_failures = rss_summary(names, samples, elapsed, args)
    cpu = {n: round(cpu_s(procs[n].p.pid) / elapsed * 100, 1) for n in names}
    cpu["soak_client"] = round((time.process_time() - cpu0) / elapsed * 100, 1)
    result.update(
        elapsed_s=round(elapsed, 1), errors=stats.error_count, first_errors=stats.errors,
        calls={k: {"calls": len(v), "per_s": round(len(v) / elapsed, 1), "p50_ms": pct(v, .5),
                   "p99_ms": pct(v, .99), "max_ms": pct(v, 1)} for k, v in stats.all.items()},
        bridge_sessions_held=held, staleness=staleness_summary(st0, staleness(shard_admins)),
        rss=rss, cpu_percent_of_one_core=cpu)
    codes = result["exit_codes"] = {n: procs[n].stop() for n in reversed(names)}
    bad = [f"{n} {'killed after 30 s' if c is None else f'exit {c}'}"
           for n, c in codes.items() if c != 0]
    if bad:
        failures.append("shutdown: on SIGTERM " + ", ".join(bad))
    return failures + rss_failures


def report(result, out_dir):
    for name, c in result.get("calls", {}).items():
        print(f"soak: {name}: {c['calls']} calls, {c['per_s']}/s, p50 {c['p50_ms']} ms, "
              f"p99 {c['p99_ms']} ms, max {c['max_ms']} ms")
    for name, r in result.get("rss", {}).get("processes", {}).items():
        print(f"soak: RSS {name}: first {r['first_window_mib']} baseline {r['baseline_mib']} "
              f"last {r['last_window_mib']} MiB, slope {r['slope_mib_per_hour']} MiB/h")
    for key in ("cpu_percent_of_one_core", "staleness"):
        if key in result:
            print(f"soak: {key}: {json.dumps(result[key])}")
    for f in result["failures"]:
        print(f"soak: FAIL: {f}")
    print(f"soak: {'PASS' if result['passed'] else 'FAIL'} ({out_dir}/soak.json, {out_dir}/rss.csv)")


def main():
    args = parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="onlineps-soak.")
    os.makedirs(out_dir, exist_ok=True)
    hard = args.hard_timeout or args.duration + 240

    def on_hard_timeout():
        print(f"soak: FAIL: hard timeout after {hard:.0f} s; killing the cluster", flush=True)
        for c in children:
            c.kill()
        os._exit(124)
    watchdog = threading.Timer(hard, on_hard_timeout)
    watchdog.daemon = True
    watchdog.start()

    def on_signal(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    result = {"args": vars(args), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        failures = run(args, out_dir, result)
    except KeyboardInterrupt as e:
        failures = [f"interrupted ({e})"]
    except Exception as e:  # a cluster that does not start, or a bug: reported, cleaned up
        failures = [f"{type(e).__name__}: {e}"]
    finally:
        for c in children:
            if c.p.poll() is None:
                c.stop(timeout=10)
        watchdog.cancel()
    result.update(failures=failures, passed=not failures)
    with open(os.path.join(out_dir, "soak.json"), "w") as f:
        json.dump(result, f, indent=2)
    report(result, out_dir)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
