#!/usr/bin/env python3
"""Start/stop cycles of a 2 x 2 cluster (2 onlineps_ps shards, 2 onlineps_worker
processes on loopback, free ports): each cycle starts everything, has each worker learn
one example and infer one (real worker RPC through onlineps_worker_cli), then SIGTERMs
the workers and the shards, which must exit 0. A cycle that takes longer than
--cycle-timeout is a hang: every process is killed and the test fails naming the cycle
and the step. Prints the cycle times at the end.

usage: cycles_test.py [--cycles N] [--cycle-timeout S] [--bin-dir DIR]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: opslib
import opslib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Hang(Exception):
    pass


def run_cycle(n, bins, logdir, deadline, step):
    procs = []

    def left():
        remaining = deadline - time.time()
        if remaining <= 0:
            raise Hang(step[0])
        return remaining

    try:
        # The two processes of a kind start, call and stop side by side (a cycle took
        # 2.2 s one after another, 221 s of the CI run), each step still timed and named.
        step[0] = "starting shards"
        for i in range(2):
            procs.append(opslib.Proc(f"c{n}-ps{i}", [f"{bins}/onlineps_ps", "--shard-index", str(i),
                                                     "--num-shards", "2", "--listen", "tcp://127.0.0.1:0",
                                                     "--admin-port", "-1", "--log-level", "warn"], logdir))
        shards = [opslib.endpoint(p, f"shard {i}", timeout=left()) for i, p in enumerate(procs[:2])]
        step[0] = "starting workers"
        for i in range(2):
            procs.append(opslib.Proc(f"c{n}-w{i}", [f"{bins}/onlineps_worker", "--ps", ",".join(shards),
                                                    "--listen", "tcp://127.0.0.1:0", "--admin-port", "-1",
                                                    "--log-level", "warn", "--model", "text", "--labels",
                                                    "negative,positive"], logdir))
        workers = [opslib.endpoint(p, f"worker {i}", timeout=left()) for i, p in enumerate(procs[2:])]
        for op, body in (("learn", {"examples": [{"text": f"great film {n}", "label": "positive"}]}),
                         ("infer", {"examples": [{"text": "great film"}]})):
            step[0] = f"workers {op}"
            calls = [subprocess.Popen([f"{bins}/onlineps_worker_cli", "--worker", w, "--timeout-ms", "10000", op,
                                       json.dumps(body)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True) for w in workers]
            for i, call in enumerate(calls):
                try:
                    out, _ = call.communicate(timeout=left())
                except (Hang, subprocess.TimeoutExpired):
                    for c in calls:
                        c.kill()
                    raise
                if call.returncode != 0:
                    raise AssertionError(f"cycle {n}: worker {i} {op} failed: {out}")
        # Workers first (they flush to the shards), then the shards (they drain).
        for group in (procs[2:], procs[:2]):
            for p in group:
                p.send(signal.SIGTERM)
            for p in group:
                step[0] = f"stopping {p.name}"
                rc = p.stop(None, timeout=max(0.1, left()))
                if rc is None:
                    raise Hang(step[0])
                if rc != 0:
                    raise AssertionError(f"cycle {n}: {p.name} exited {rc}:\n{p.stderr()[-2000:]}")
    finally:
        for p in procs:
            if p.alive():
                p.stop(signal.SIGKILL, timeout=5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=100, help="start/stop cycles (default 100)")
    ap.add_argument("--cycle-timeout", type=float, default=60, help="seconds one cycle may take (default 60)")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"), help="where the binaries are")
    args = ap.parse_args()
    if args.cycles < 1 or args.cycle_timeout <= 0:
        ap.error("--cycles must be >= 1 and --cycle-timeout > 0")
    times = []
    with tempfile.TemporaryDirectory(prefix="onlineps-cycles.") as logdir:
        for n in range(args.cycles):
            start = time.time()
            step = ["starting"]
            try:
                run_cycle(n, args.bin_dir, logdir, start + args.cycle_timeout, step)
            except (Hang, subprocess.TimeoutExpired):
                print(f"cycles_test: FAIL: cycle {n} hung at '{step[0]}' (over {args.cycle_timeout:.0f} s)")
                return 1
            except AssertionError as e:
                print(f"cycles_test: FAIL: cycle {n} at '{step[0]}': {e}")
                return 1
            times.append(time.time() - start)
            if (n + 1) % 10 == 0:
                print(f"cycles_test: {n + 1}/{args.cycles} cycles, last {times[-1]:.2f} s", flush=True)
            for f in os.listdir(logdir):  # keep only the running cycle's logs
                os.unlink(os.path.join(logdir, f))
    times.sort()
    print(f"cycles_test: {len(times)} start/stop cycles of 2 shards x 2 workers, 0 hangs; "
          f"cycle time median {times[len(times) // 2]:.2f} s, max {times[-1]:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
