#!/usr/bin/env python3
"""Operations checks of the real binaries, one per argument:

  json-logs    ps, worker and bridge run with --log-format json --log-level debug and get
               input whose text holds quotes, backslashes and newlines (a checkpoint
               directory, an MCP protocol version); every stderr line of each is one JSON
               object with ts, level, component and msg, and those characters survive.
  precedence   the documented precedence, flag > env > config file > default, holds for
               each binary (read back with --print-config).
  final-checkpoint
               a shard whose final checkpoint cannot be written (its directory was
               replaced by a file) answers `ps_cli checkpoint` at once with the reason,
               logs why and exits 1 on SIGTERM; with a writable
               directory it exits 0 and the checkpoint is there. Past the file size
               limit (ulimit -f) a checkpoint fails the same way, not by SIGXFSZ.
  docs-flags   every long flag in each binary's --help is documented in
               docs/configuration.md, and so is each ONLINEPS_* env name the code reads
               outside the flag parser.
  bad-flags    each binary (and each bench/ program) answers --help with exit 0, names an
               unknown flag (exit 2), refuses out-of-range ports, the bridge refuses sizes
               of 0 that would refuse every request and a negative --rate-limit, and the worker refuses a
               bad --optimizer / --lr / --device before waiting for its shards (they are
               unreachable here); all within seconds.
  ports-taken  a worker whose --listen port, and a bridge whose --port or --admin-port,
               another process holds exits within seconds naming the flag and "Address
               already in use", before waiting for its shards or workers (unreachable
               here, with long waits).
  run-local-port-taken
               scripts/run_local.sh with a shard's port already taken stops within seconds
               and prints the shard's own "Address already in use" line.
  run-local-bad-values
               scripts/run_local.sh refuses each bad flag value (not a number, out of
               range, a missing value, an MCP port that the cluster's ports take, an
               unknown name) at once with exit 2 and a message naming the flag and what
               it takes, before it sets anything up: no /tmp/onlineps-local.* directory.
  run-local-sigterm
               SIGTERM to run_local.sh's own PID (not its process group) while its PS
               workload runs stops the whole cluster within seconds, exit 0, and no
               process it started is left.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: opslib
import opslib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("ONLINEPS_BIN_DIR", os.path.join(ROOT, "build", "bin"))
BINARIES = ["onlineps_ps", "onlineps_ps_cli", "onlineps_worker", "onlineps_worker_cli",
            "onlineps_mcp_bridge", "onlineps_replay"]


def fail(msg):
    print(f"ops_cli_test: FAIL: {msg}")
    sys.exit(1)


def json_logs():
    work = tempfile.mkdtemp(prefix="onlineps-jsonlogs.")
    ckpt = os.path.join(work, 'ck "quoted" \\ dir')
    os.makedirs(ckpt)
    common = ["--log-format", "json", "--log-level", "debug"]
    procs = []
    try:
        shard = opslib.Proc("ps", [f"{BIN}/onlineps_ps", "--shard-index", "0", "--num-shards", "1",
                                   "--listen", "tcp://127.0.0.1:0", "--admin-port", "-1",
                                   "--checkpoint-dir", ckpt, *common], work)
        procs.append(shard)
        opslib.wait_until(lambda: "LISTENING " in shard.stdout() or not shard.alive(), 30,
                          "the shard to listen")
        ps_ep = re.search(r"LISTENING (\S+)", shard.stdout()).group(1)
        worker = opslib.Proc("worker", [f"{BIN}/onlineps_worker", "--ps", ps_ep, "--listen",
                                        "tcp://127.0.0.1:0", "--admin-port", "-1", "--model",
                                        "text", "--labels", 'negative,"positive"', *common], work)
        procs.append(worker)
        opslib.wait_until(lambda: "LISTENING " in worker.stdout() or not worker.alive(), 60,
                          "the worker to listen")
        w_ep = re.search(r"LISTENING (\S+)", worker.stdout()).group(1)
        bridge = opslib.Proc("bridge", [f"{BIN}/onlineps_mcp_bridge", "--workers", w_ep,
                                        "--port", "0", "--admin-port", "-1", *common], work)
        procs.append(bridge)
        opslib.wait_until(lambda: "LISTENING " in bridge.stdout() or not bridge.alive(), 30,
                          "the bridge to listen")
        url = re.search(r"LISTENING (\S+)", bridge.stdout()).group(1)

        # A client asking for a protocol version with quotes, a backslash and a newline
        # (the bridge negotiates its own and logs what was asked at debug level).
        odd = 'v"1\\\n2'
        req = urllib.request.Request(url, json.dumps({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": odd, "capabilities": {},
                       "clientInfo": {"name": 'quote " client', "version": "1"}}}).encode(),
            {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
        s = opslib.McpSession(url)
        s.call("learn", {"examples": [{"text": 'say "great" \\o/', "label": '"positive"'}]})

        codes = {p.name: p.stop(signal.SIGTERM) for p in reversed(procs)}
        if any(c != 0 for c in codes.values()):
            fail(f"exit codes after SIGTERM: {codes}")
        seen_quote = seen_newline = False
        for p in procs:
            lines = p.stderr().splitlines()
            if not lines:
                fail(f"{p.name} logged nothing at debug level")
            for n, line in enumerate(lines, 1):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{p.name} stderr line {n} is not JSON ({e}): {line[:300]}")
                if not isinstance(obj, dict) or set(obj) != {"ts", "level", "component", "msg"}:
                    fail(f"{p.name} stderr line {n} has fields {sorted(obj)}: {line[:300]}")
                seen_quote |= '"' in obj["msg"]
                seen_newline |= "\n" in obj["msg"]
            print(f"ops_cli_test: {p.name}: {len(lines)} JSON log lines, all valid")
        if not seen_quote or not seen_newline:
            fail("no message carried a quote and a newline: the escaping went untested "
                 f"(quote {seen_quote}, newline {seen_newline})")
        if odd not in "".join(json.loads(line)["msg"] for line in bridge.stderr().splitlines()):
            fail("the bridge's debug log did not carry the requested protocol version intact")
        print("ops_cli_test: json-logs PASS (quotes, backslashes and newlines escaped)")
    finally:
        for p in procs:
            if p.alive():
                p.stop(signal.SIGKILL)


def final_checkpoint():
    work = tempfile.mkdtemp(prefix="onlineps-finalckpt.")
    for broken in (False, True):
        ckpt = os.path.join(work, f"ck-{int(broken)}")
        os.makedirs(ckpt)
        shard = opslib.Proc(f"ps{int(broken)}", [
            f"{BIN}/onlineps_ps", "--shard-index", "0", "--num-shards", "1", "--listen",
            "tcp://127.0.0.1:0", "--admin-port", "-1", "--checkpoint-dir", ckpt], work)
        try:
            opslib.wait_until(lambda: "LISTENING " in shard.stdout() or not shard.alive(), 30,
                              "the shard to listen")
            if broken:
                shutil.rmtree(ckpt)  # with the lock file the shard holds from its start
                with open(ckpt, "w") as f:
                    f.write("not a directory\n")
                # An on-demand checkpoint fails at once with the reason, not after retries.
                ep = re.search(r"LISTENING (\S+)", shard.stdout()).group(1)
                t0 = time.monotonic()
                r = subprocess.run([f"{BIN}/onlineps_ps_cli", "--shards", ep, "checkpoint"],
                                   capture_output=True, text=True, timeout=60)
                took = time.monotonic() - t0
                if r.returncode == 0 or "checkpoint not written" not in r.stdout + r.stderr \
                        or took > 3:
                    fail(f"ps_cli checkpoint on an unwritable dir: exit {r.returncode} after "
                         f"{took:.1f} s:\n{r.stdout}{r.stderr}")
            code = shard.stop(signal.SIGTERM)
        finally:
            if shard.alive():
                shard.stop(signal.SIGKILL)
        logged = "final checkpoint failed" in shard.stderr()
        if broken and (code != 1 or not logged):
            fail(f"unwritable checkpoint dir: exit {code}, logged {logged}:\n{shard.stderr()}")
        if not broken and (code != 0 or logged or not os.listdir(ckpt)):
            fail(f"writable checkpoint dir: exit {code}, files {os.listdir(ckpt)}:\n"
                 f"{shard.stderr()}")
    # A checkpoint past the file size limit (ulimit -f, RLIMIT_FSIZE) fails like a full
    # disk: the write gets EFBIG, the shard answers and serves on; SIGXFSZ does not kill it.
    ckpt = os.path.join(work, "ck-fsize")
    shard = opslib.Proc("ps-fsize", [
        "bash", "-c", 'ulimit -f 1000 && exec "$@"', "bash", f"{BIN}/onlineps_ps",
        "--shard-index", "0", "--num-shards", "1", "--listen", "tcp://127.0.0.1:0",
        "--admin-port", "-1", "--checkpoint-dir", ckpt], work)
    try:
        opslib.wait_until(lambda: "LISTENING " in shard.stdout() or not shard.alive(), 30,
                          "the shard to listen")
        ep = re.search(r"LISTENING (\S+)", shard.stdout()).group(1)
        cli = [f"{BIN}/onlineps_ps_cli", "--shards", ep]
        subprocess.run(cli + ["push-pattern", "--pushes", "1", "--dense-size", "300000"],
                       capture_output=True, text=True, timeout=60, check=True)
        r = subprocess.run(cli + ["checkpoint"], capture_output=True, text=True, timeout=60)
        if r.returncode == 0 or "checkpoint not written" not in r.stdout + r.stderr or \
                not shard.alive():
            fail(f"checkpoint past the file size limit: exit {r.returncode}, shard alive "
                 f"{shard.alive()}:\n{r.stdout}{r.stderr}{shard.stderr()}")
        code = shard.stop(signal.SIGTERM)
    finally:
        if shard.alive():
            shard.stop(signal.SIGKILL)
    if code != 1 or "final checkpoint failed" not in shard.stderr():
        fail(f"checkpoint past the file size limit: exit {code}:\n{shard.stderr()}")
    print("ops_cli_test: final-checkpoint PASS (exit 1 when it cannot be written, else 0)")


def print_config(binary, args=(), env=None):
    r = subprocess.run([f"{BIN}/{binary}", *args, "--print-config"], capture_output=True,
                       text=True, env={k: v for k, v in (env or os.environ).items()}, timeout=30)
    if r.returncode != 0:
        fail(f"{binary} --print-config exited {r.returncode}: {r.stderr.strip()}")
    values = {}
    for line in r.stdout.splitlines():
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            values[k.strip()] = v.strip().strip('"')
    return values


def precedence():
    # (binary, option, file value, env value, flag value, required args)
    cases = [
        ("onlineps_ps", "admin-port", "1111", "2222", "3333",
         ["--shard-index", "0", "--num-shards", "1"]),
        ("onlineps_worker", "admin-port", "1111", "2222", "3333", ["--ps", "tcp://127.0.0.1:9"]),
        ("onlineps_mcp_bridge", "port", "1111", "2222", "3333", ["--workers", "tcp://127.0.0.1:9"]),
    ]
    work = tempfile.mkdtemp(prefix="onlineps-precedence.")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("ONLINEPS_")}
    for binary, opt, file_v, env_v, flag_v, required in cases:
        conf = os.path.join(work, f"{binary}.conf")
        with open(conf, "w") as f:
            f.write(f"# written by ops_cli_test\n{opt} = {file_v}\n")
        env_name = "ONLINEPS_" + opt.upper().replace("-", "_")
        default = print_config(binary, required, base_env)[opt]
        got = {
            "default": print_config(binary, required, base_env)[opt],
            "file": print_config(binary, [*required, "--config", conf], base_env)[opt],
            "file via ONLINEPS_CONFIG": print_config(binary, required,
                                                     {**base_env, "ONLINEPS_CONFIG": conf})[opt],
            "env over file": print_config(binary, [*required, "--config", conf],
                                          {**base_env, env_name: env_v})[opt],
            "flag over env and file": print_config(binary, [*required, "--config", conf,
                                                            f"--{opt}", flag_v],
                                                   {**base_env, env_name: env_v})[opt],
        }
        want = {"default": default, "file": file_v, "file via ONLINEPS_CONFIG": file_v,
                "env over file": env_v, "flag over env and file": flag_v}
        if got != want or default in (file_v, env_v, flag_v):
            fail(f"{binary} --{opt}: got {got}, want {want}")
        print(f"ops_cli_test: {binary} --{opt}: default {default} < file {file_v} < "
              f"{env_name} {env_v} < flag {flag_v}")
        # A bad value in the file is refused with the file, line and key named.
        with open(conf, "w") as f:
            f.write(f"{opt} = not-a-number\n")
        r = subprocess.run([f"{BIN}/{binary}", *required, "--config", conf, "--print-config"],
                           capture_output=True, text=True, env=base_env, timeout=30)
        if r.returncode == 0 or f"{conf}:1" not in r.stderr or opt not in r.stderr:
            fail(f"{binary}: a bad config value gave exit {r.returncode}, stderr {r.stderr!r}")
    print("ops_cli_test: precedence PASS")


def docs_flags():
    doc = open(os.path.join(ROOT, "docs", "configuration.md")).read()
    missing = []
    for binary in BINARIES:
        r = subprocess.run([f"{BIN}/{binary}", "--help"], capture_output=True, text=True,
                           timeout=30)
        flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", r.stdout))
        if len(flags) < 3:
            fail(f"{binary} --help listed only {sorted(flags)}:\n{r.stdout}{r.stderr}")
        for flag in sorted(flags):
            if not re.search(re.escape(flag) + r"(?![a-z0-9-])", doc):
                missing.append(f"{binary} {flag}")
        print(f"ops_cli_test: {binary}: {len(flags)} flags, documented")
    # Environment variables read directly by the code (not through the flag parser).
    env_names = set()
    for d in ("common", "ps", "worker", "mcp_bridge", "replay"):
        for name in os.listdir(os.path.join(ROOT, d)):
            if name.endswith((".cc", ".h")):
                text = open(os.path.join(ROOT, d, name)).read()
                env_names |= set(re.findall(r'getenv\("([A-Z0-9_]+)"\)', text))
    ops = os.path.join(ROOT, "docs", "operations.md")
    ops_doc = open(ops).read() if os.path.exists(ops) else ""
    for name in sorted(env_names):
        if name not in doc and name not in ops_doc:
            missing.append(f"env {name}")
    if missing:
        fail("not documented in docs/configuration.md: " + ", ".join(missing))
    # The --help blocks are the binaries' own, defaults and ranges included.
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_flag_docs.py"),
                        "--bin", BIN, "--check"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"the --help blocks of docs/configuration.md are stale:\n{r.stdout}{r.stderr}")
    print(f"ops_cli_test: docs-flags PASS (env read directly: {sorted(env_names)})")


def run(args, timeout=30, env=None):
    t0 = time.monotonic()
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        fail(f"{' '.join(args)} still ran after {timeout} s")
    return r, time.monotonic() - t0


def expect(args, code, pattern, within_s, env=None):
    """Runs args; its exit code is `code` and its output matches `pattern`, within_s."""
    # A right answer that came too late runs once more before failing: under a loaded
    # 2-core CI run a process start alone can lose seconds, while a path that really
    # waits (a connect timeout, a 30 s wait for shards) is slow both times.
    for attempt in (1, 2):
        r, took = run(args, timeout=max(60, within_s * 3), env=env)
        out = r.stdout + r.stderr
        if r.returncode != code or not re.search(pattern, out):
            fail(f"{' '.join(args)}: exit {r.returncode} (want {code}), output does not match "
                 f"{pattern!r}:\n{out[-2000:]}")
        if took <= within_s:
            break
        if attempt == 2:
            fail(f"{' '.join(args)} took {took:.1f} s, twice (want < {within_s} s)")
        print(f"ops_cli_test: {' '.join(args)} took {took:.1f} s (want < {within_s} s); again")
    print(f"ops_cli_test: ok: {os.path.basename(args[0])} {' '.join(args[1:])} -> exit {code} "
          f"in {took:.1f} s: {re.search(pattern, out).group(0)!r}")


def bad_flags():
    dead = f"tcp://127.0.0.1:{opslib.free_port()}"  # nothing listens there
    b = lambda name: os.path.join(BIN, name)  # noqa: E731
    benches = [n for n in ("ps_bench", "worker_bench", "bridge_bench", "replay_bench",
                           "freshness_bench", "ps_scale") if os.path.exists(b(n))]
    for name in BINARIES + benches:
        expect([b(name), "--help"], 0, r"(?i)usage", 10)
    for name in BINARIES:
        expect([b(name), "--no-such-flag"], 2, r"unknown flag --no-such-flag", 10)
    for name in benches:
        expect([b(name), "--no-such-flag"], 2, r"--no-such-flag", 10)
    if "replay_bench" in benches:  # numbers: "-5" was read as ~1.8e19, "abc" as 1
        expect([b("replay_bench"), "--updates", "-5"], 2, r"--updates takes a whole number", 10)
        expect([b("replay_bench"), "--rounds", "abc"], 2, r"--rounds takes a whole number", 10)
    expect([b("onlineps_ps_cli"), "--shards", dead, "nosuchcmd"], 2,
           r"unknown subcommand 'nosuchcmd' \(expected one of: [a-z, -]+\)", 10)
    # Ports: flags in 0..65535 (-1 where it turns the admin port off); endpoints too.
    expect([f"{BIN}/onlineps_mcp_bridge", "--workers", dead, "--port", "70000"], 2,
           r"--port: Value 70000 not in range 0 to 65535", 10)
    for name in ("onlineps_ps", "onlineps_mcp_bridge"):
        expect([b(name), "--admin-port", "65536"], 2, r"--admin-port: Value 65536 not in range", 10)
    expect([b("onlineps_ps"), "--listen", "tcp://127.0.0.1:70000", "--admin-port", "-1"], 1,
           r"port '70000' is not in 0\.\.65535", 10)
    expect([f"{BIN}/onlineps_mcp_bridge", "--workers", "tcp://127.0.0.1:99999"], 2,
           r"--workers: endpoint 'tcp://127.0.0.1:99999': port '99999' is not in 0\.\.65535", 10)
    # --workers-dns too: a port past 65535 left every worker down for good.
    expect([f"{BIN}/onlineps_mcp_bridge", "--workers-dns", "localhost:99999"], 2,
           r"--workers-dns 'localhost:99999': port '99999' is not in 0\.\.65535", 10)
    # A token bucket that never holds a whole token refuses every call as rate-limited.
    for burst in ("0", "0.5", "-3"):
        expect([f"{BIN}/onlineps_mcp_bridge", "--workers", dead, "--rate-limit", "5",
                "--rate-burst", burst], 2, r"--rate-burst: must be a number >= 1, not '"
               + re.escape(burst) + "'", 10)
    # Bridge sizes of 0 (and a negative rate) started a bridge that refused everything
    # (every body 413, every initialize 503, every context or infer refused) or, for
    # --rate-limit -1, silently did not limit at all.
    for flag, value, message in [
            ("--max-request-bytes", "0", r"--max-request-bytes: Value 0 not in range 1024 to"),
            ("--max-sessions", "0", r"--max-sessions: Value 0 not in range 1 to"),
            ("--context-max-sessions", "0", r"--context-max-sessions: Value 0 not in range 1 to"),
            ("--max-examples", "0", r"--max-examples: Value 0 not in range 1 to"),
            ("--rate-limit", "-1", r"--rate-limit: must be a number >= 0, not '-1'")]:
        expect([f"{BIN}/onlineps_mcp_bridge", "--workers", dead, "--admin-port", "-1", flag,
                value], 2, message, 10)
    expect([f"{BIN}/onlineps_worker", "--ps", "tcp://127.0.0.1:123456", "--admin-port", "-1"], 1,
           r"port '123456' is not in 0\.\.65535", 15)
    # The worker's learning and model flags fail at once, not after its 30 s wait for
    # shards that are not there.
    worker = [f"{BIN}/onlineps_worker", "--ps", dead, "--admin-port", "-1"]
    expect(worker + ["--optimizer", "nope"], 2,
           r"unknown optimizer 'nope'; valid optimizer names: sgd, adagrad, ftrl, adam", 15)
    expect(worker + ["--lr", "-1"], 2, r"--optimizer sgd \(--lr, --opt-param\): optimizer "
           r"'sgd': parameter 'lr' must be > 0, got -1", 15)
    expect(worker + ["--device", "gpu"], 2, r"--device 'gpu': expected cpu, cuda or cuda:N", 20)
    expect(worker + ["--model", "torchscript", "--model-file", "/nonexistent/m.pt"], 2,
           r"/nonexistent/m\.pt", 20)
    # Local steps move the weights by --local-lr times the gradient: 0 pushed zero deltas
    # (nothing learned, every learn a success), a negative one climbed the loss, and one
    # past the float range pushed inf/nan into the shared tables.
    for lr in ("0", "-0.05", "1e39"):
        expect(worker + ["--local-steps", "4", "--local-lr", lr], 2,
               r"--local-lr must be > 0 and finite as a float, got -?\d", 15)
    # Durations in seconds are multiplied into milliseconds: a negative context TTL meant
    # "never" and a huge checkpoint interval wrapped to a few hundred milliseconds.
    expect(worker + ["--context-ttl-s", "-1"], 2, r"--context-ttl-s: Value -1 not in range", 15)
    expect([b("onlineps_ps"), "--admin-port", "-1", "--checkpoint-interval-s",
            "18446744073709551"], 2, r"--checkpoint-interval-s: Value 18446744073709551 not in", 10)
    # The worker CLI's default target is a worker RPC port (run_local.sh's first worker),
    # not the MCP HTTP port.
    r, _ = run([b("onlineps_worker_cli"), "--help"])
    if "tcp://127.0.0.1:7200" not in r.stdout:
        fail(f"onlineps_worker_cli --help does not default to tcp://127.0.0.1:7200:\n{r.stdout}")
    print("ops_cli_test: bad-flags PASS")


def ports_taken():
    import socket
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    cases = [
        ("worker", [f"{BIN}/onlineps_worker", "--ps", "tcp://127.0.0.1:1", "--listen",
                    f"tcp://127.0.0.1:{port}", "--admin-port", "-1", "--model", "mlp",
                    "--labels", "a,b"], "(--listen)"),
        ("bridge", [f"{BIN}/onlineps_mcp_bridge", "--workers", "tcp://127.0.0.1:1", "--port",
                    str(port), "--wait-workers-s", "60", "--admin-port", "-1"], "--port"),
        ("bridge admin", [f"{BIN}/onlineps_mcp_bridge", "--workers", "tcp://127.0.0.1:1", "--port",
                          "0", "--wait-workers-s", "60", "--admin-port", str(port)],
         "--admin-port"),
    ]
    for name, args, flag in cases:
        r, took = run(args, timeout=45)
        said = r.stdout + r.stderr
        if r.returncode == 0 or "Address already in use" not in said or flag not in said:
            fail(f"{name} with port {port} taken: exit {r.returncode} after {took:.1f} s, "
                 f"no 'Address already in use' naming {flag}:\n{said[-2000:]}")
        if took > 20:
            fail(f"{name} with port {port} taken took {took:.1f} s to say so")
        print(f"ops_cli_test: {name}: exit {r.returncode} in {took:.1f} s")
    taken.close()
    print("ops_cli_test: ports-taken PASS")


def run_local_port_taken():
    import socket
    base = 21000 + (os.getpid() % 400) * 10  # its own range; shard 0 on base
    taken = socket.socket()
    taken.bind(("127.0.0.1", base))
    taken.listen(1)
    env = dict(os.environ, ONLINEPS_JOBS=os.environ.get("ONLINEPS_JOBS", "2"))
    args = ["bash", os.path.join(ROOT, "scripts", "run_local.sh"), "--base-port", str(base),
            "--mcp-port", str(base + 9), "--shards", "2", "--workers", "1"]
    r, took = run(args, timeout=900, env=env)
    taken.close()
    out = r.stdout + r.stderr
    if r.returncode == 0:
        fail(f"run_local.sh succeeded with port {base} taken:\n{out[-2000:]}")
    want = [rf"run_local: shard 0 \(replica 0, tcp://127\.0\.0\.1:{base}\) exited",
            r"Address already in use"]
    for pattern in want:
        if not re.search(pattern, out):
            fail(f"run_local.sh output lacks {pattern!r}:\n{out[-3000:]}")
    if re.search(r"worker \d+ did not", out):
        fail(f"run_local.sh blamed a worker for the shard's port:\n{out[-3000:]}")
    print(f"ops_cli_test: run-local-port-taken PASS (exit {r.returncode}, {took:.1f} s including "
          "setup and build checks)")


def run_local_bad_values():
    script = os.path.join(ROOT, "scripts", "run_local.sh")
    with open(script) as f:
        if "mktemp -d /tmp/onlineps-local." not in f.read():
            fail("run_local.sh no longer makes its data dir with mktemp: update this check")
    # A mktemp first on PATH records each directory run_local.sh makes, so that a data dir
    # left by a refused value is seen even while other tests make their own.
    shim = tempfile.mkdtemp(prefix="onlineps-badvalues.")
    made = os.path.join(shim, "made")
    with open(os.path.join(shim, "mktemp"), "w") as f:
        f.write(f'#!/bin/sh\nd=$("{shutil.which("mktemp")}" "$@") || exit $?\n'
                f'echo "$d" >>"{made}"\necho "$d"\n')
    os.chmod(os.path.join(shim, "mktemp"), 0o755)
    env = dict(os.environ, PATH=shim + os.pathsep + os.environ["PATH"],
               ONLINEPS_JOBS=os.environ.get("ONLINEPS_JOBS", "2"))
    base = 26000 + (os.getpid() % 10) * 600  # were a value accepted, its cluster's own ports
    common = ["bash", script, "--exit", "--base-port", str(base), "--mcp-port", str(base + 450)]
    ranges = {"--shards": (1, 100), "--workers": (1, 100), "--steps": (1, 100000000),
              "--base-port": (1024, 65034), "--mcp-port": (1024, 65535), "--replicas": (1, 5)}
    bad = [("--shards", "abc"), ("--shards", "0"), ("--shards", "-1"), ("--shards", "101"),
           ("--workers", "abc"), ("--workers", "0"), ("--steps", "0"), ("--steps", "abc"),
           ("--base-port", "abc"), ("--base-port", "70000"), ("--base-port", "80"),
           ("--base-port", "65100"),  # no room for P+501
           ("--mcp-port", "0"), ("--mcp-port", "65536"), ("--replicas", "9")]
    cases = [([flag, v], rf"{flag} must be an integer from {ranges[flag][0]} to {ranges[flag][1]}, "
                         rf"got '{v}'") for flag, v in bad]
    cases += [
        (["--mcp-port", str(base + 200)],  # worker 0's port
         rf"--mcp-port {base + 200} is one of the cluster's ports "
         rf"\(P\+200 of --base-port {base}\)"),
        (["--replicas", "2", "--shards", "21"],
         r"with --replicas 2, --shards must be at most 20 \(ports P\+i\+20r\), got '21'"),
        (["--optimizer", "bogus"], r"--optimizer must be sgd, adagrad, ftrl or adam, got 'bogus'"),
        (["--staleness", "bogus"], r"--staleness must be none, lr_over_tau, dc_constant or "
                                   r"dc_adaptive, got 'bogus'"),
        (["--model", "bogus"], r"--model must be text or mlp, got 'bogus'"),
        (["--shards"], r"--shards needs a value"),
    ]
    try:
        for extra, pattern in cases:
            expect(common + extra, 2, "run_local: " + pattern, 5, env=env)
            if os.path.exists(made):
                with open(made) as f:
                    fail(f"run_local.sh {' '.join(extra)} left {f.read().split()} behind")
    finally:
        if os.path.exists(made):
            with open(made) as f:
                for d in f.read().split():
                    shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(shim, ignore_errors=True)
    print(f"ops_cli_test: run-local-bad-values PASS ({len(cases)} values refused, exit 2, "
          "no data dir)")


def descendants(root_pid):
    """{pid: start time} of root_pid's processes and theirs, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append((int(entry), fields[19]))
    found, todo = {}, [root_pid]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            found[pid] = start
            todo.append(pid)
    return found


def still_running(procs):
    """Those of procs ({pid: start time}) that still run (neither gone, nor a zombie, nor
    their pid reused)."""
    left = []
    for pid, start in procs.items():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and fields[19] == start:
            left.append(pid)
    return left


def run_local_sigterm():
    base = 26000 + (os.getpid() % 10) * 600  # its own range, P..P+501
    env = dict(os.environ, ONLINEPS_JOBS=os.environ.get("ONLINEPS_JOBS", "2"))
    # mlp: no MCP demo, so the PS workload (that never ends on its own here) comes sooner.
    args = ["bash", os.path.join(ROOT, "scripts", "run_local.sh"), "--base-port", str(base),
            "--mcp-port", str(base + 450), "--shards", "1", "--workers", "1", "--model", "mlp",
            "--steps", "100000000"]
    log = tempfile.NamedTemporaryFile("w+", prefix="onlineps-sigterm.", suffix=".log",
                                      delete=False)
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         env=env, start_new_session=True)

    def output():
        with open(log.name) as f:
            return f.read()

    data = None  # its data dir, removed at the end
    try:
        deadline = time.monotonic() + 600  # setup and build checks come first
        while "asynchronous PS workload" not in output():
            if p.poll() is not None or time.monotonic() > deadline:
                fail(f"run_local.sh did not reach its PS workload:\n{output()[-3000:]}")
            time.sleep(0.2)
        time.sleep(1)  # the workload runs
        procs = descendants(p.pid)
        cmdlines = []
        for pid in procs:
            try:
                with open(f"/proc/{pid}/cmdline") as f:
                    cmdlines.append(f.read().split("\0"))
            except OSError:
                pass
        for argv in cmdlines:
            if "--checkpoint-dir" in argv[:-1]:
                data = os.path.dirname(argv[argv.index("--checkpoint-dir") + 1])
        if not any(os.path.basename(argv[0]) == "onlineps_ps_cli" for argv in cmdlines):
            fail(f"no PS workload runs under run_local.sh:\n{output()[-3000:]}")
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGTERM)
        try:
            code = p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            fail(f"run_local.sh still ran 15 s after SIGTERM to its PID:\n{output()[-2000:]}")
        took = time.monotonic() - t0
        left = still_running(procs)
        while left and time.monotonic() - t0 < took + 2:
            time.sleep(0.1)
            left = still_running(procs)
        if code != 0:
            fail(f"run_local.sh exited {code} on SIGTERM (want 0):\n{output()[-2000:]}")
        if left:
            fail(f"processes of run_local.sh still run after it exited: {left}")
        if "run_local: cluster stopped" not in output():
            fail(f"run_local.sh did not say it stopped the cluster:\n{output()[-2000:]}")
        if took > 8:
            fail(f"run_local.sh took {took:.1f} s to stop after SIGTERM (want < 8 s)")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()
        if data and os.path.basename(data).startswith("onlineps-local."):
            shutil.rmtree(data, ignore_errors=True)
        os.unlink(log.name)
    print(f"ops_cli_test: run-local-sigterm PASS (stopped {len(procs)} processes in {took:.1f} s, "
          "exit 0)")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    checks = {"json-logs": json_logs, "precedence": precedence, "docs-flags": docs_flags,
              "final-checkpoint": final_checkpoint, "bad-flags": bad_flags,
              "ports-taken": ports_taken, "run-local-port-taken": run_local_port_taken,
              "run-local-bad-values": run_local_bad_values, "run-local-sigterm": run_local_sigterm}
    if mode not in checks:
        print(f"usage: ops_cli_test.py {'|'.join(checks)}")
        sys.exit(2)
    checks[mode]()
