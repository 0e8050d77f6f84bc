"""Small helpers shared by the operations tests (tests/*_test.py): a Streamable HTTP MCP
client on urllib, probe polling, and process start/stop with logs kept for the report.

Standard library only, so the tests run wherever python3 does.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

PROTOCOL = "2025-11-25"


class McpError(Exception):
    pass


class McpSession:
    """One MCP session over Streamable HTTP (JSON replies; SSE replies are parsed too)."""

    def __init__(self, url, timeout=30, opener=None):
        self.url = url
        self.timeout = timeout
        self.sid = None
        self.next_id = 1
        body = self._post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                           "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                                      "clientInfo": {"name": "opslib", "version": "1"}}})
        if "result" not in body:
            raise McpError(f"initialize failed: {body}")
        self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _post(self, message):
        headers = {"Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream"}
        if self.sid:
            headers["Mcp-Session-Id"] = self.sid
            headers["MCP-Protocol-Version"] = PROTOCOL
        req = urllib.request.Request(self.url, json.dumps(message).encode(), headers)
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            if self.sid is None:
                self.sid = r.headers.get("Mcp-Session-Id")
            text = r.read().decode()
            if r.headers.get("Content-Type", "").startswith("text/event-stream"):
                # The last `data:` line that is a response (progress notifications precede it).
                replies = [json.loads(line[5:]) for line in text.splitlines()
                           if line.startswith("data:") and line[5:].strip()]
                replies = [m for m in replies if "id" in m]
                return replies[-1] if replies else {}
            return json.loads(text) if text else {}

    def call(self, tool, arguments):
        """tools/call; returns structuredContent, raises McpError on any error."""
        rid = self.next_id
        self.next_id += 1
        body = self._post({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                           "params": {"name": tool, "arguments": arguments}})
        if "error" in body:
            raise McpError(f"{tool}: {body['error'].get('message')}")
        result = body["result"]
        if result.get("isError"):
            raise McpError(f"{tool}: {result['content'][0]['text']}")
        return result["structuredContent"]


def http_get(url, timeout=2):
    """(status, body) of a GET; status 0 when the server cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, ""


def wait_until(predicate, timeout, what, step=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def endpoint(proc, what, timeout=60):
    """The address a binary prints as `LISTENING ADDR` on stdout; AssertionError with its
    logs if it exits or does not print one within `timeout` seconds."""
    wait_until(lambda: "LISTENING " in proc.stdout() or not proc.alive(), timeout, what)
    m = re.search(r"LISTENING (\S+)", proc.stdout())
    if not m:
        raise AssertionError(f"{what} did not start:\n{proc.stderr()}")
    return m.group(1)


class Proc:
    """A child process; its stdout goes to `<logdir>/<name>.out`, its stderr (the logs) to
    `<logdir>/<name>.err`, both kept for the report."""

    def __init__(self, name, argv, logdir, env=None):
        self.name = name
        self.out_path = os.path.join(logdir, f"{name}.out")
        self.err_path = os.path.join(logdir, f"{name}.err")
        self.out = open(self.out_path, "w")
        self.err = open(self.err_path, "w")
        self.p = subprocess.Popen(argv, stdout=self.out, stderr=self.err, env=env,
                                  start_new_session=True)

    @property
    def pid(self):
        return self.p.pid

    def stdout(self):
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.err_path, errors="replace") as f:
            return f.read()

    def output(self):
        return self.stdout() + self.stderr()

    def alive(self):
        return self.p.poll() is None

    def send(self, sig):
        if self.p.poll() is None:
            self.p.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        """Sends `sig` (None: sends nothing, e.g. after `signal`), waits; returns the exit
        code (SIGKILLs and returns None on timeout)."""
        if sig is not None and self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return None
        finally:
            self.out.close()
            self.err.close()


class Procs:
    """The processes of one run, as a context manager: `start` them in order; on leaving,
    each is stopped, the last started first, and when the block raised, the tail of each
    one's logs goes to stderr first (with the folder that keeps them whole)."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.procs = []

    def start(self, name, argv, env=None):
        proc = Proc(name, argv, self.logdir, env)
        self.procs.append(proc)
        return proc

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            for p in self.procs:
                sys.stderr.write(f"--- {p.name} ({self.logdir}):\n{p.output()[-2000:]}\n")
        for p in reversed(self.procs):
            p.stop()
        return False


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(text, name, labels=None):
    """Sum of the samples of `name` in a Prometheus text page whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric_name = series.split("{", 1)[0]
        if metric_name != name:
            continue
        if labels and not all(f'{k}="{v}"' in series for k, v in labels.items()):
            continue
        total += float(value)
    return total
