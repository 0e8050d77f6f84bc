#!/usr/bin/env python3
"""Online learning on a frozen backbone through MCP (docs/frozen.md): starts one PS
shard, one worker serving a model of export.py and the MCP bridge, measures held-out
accuracy, teaches the model the digits stream one MCP `learn` call per example, and
measures again. Each mode is its own fresh cluster:

  full    digits_head.pt with --trainable '*': every parameter is a PS table
  head    digits_head.pt as saved: the backbone is frozen, the head learns
  lora4   digits_lora4.pt: frozen backbone, rank-4 adapters and the head learn
  lora8   digits_lora8.pt: the same with rank 8

  python3 examples/frozen_head/online.py                     # head only, 1000 examples
  python3 examples/frozen_head/online.py --modes full,head,lora4,lora8 --examples 1000

Standard library only; needs the binaries of a build (--bin, default build/bin), and
the models of export.py in --models (default build/frozen_head; written there with
Debian's /usr/bin/python3 and python3-torch when missing).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import json

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import digits  # noqa: E402
import opslib  # noqa: E402

LABELS = [str(d) for d in range(10)]
MODES = {
    "full": ("digits_head.pt", ["--trainable", "*"]),
    "head": ("digits_head.pt", []),
    "lora4": ("digits_lora4.pt", []),
    "lora8": ("digits_lora8.pt", []),
}


def worker_stats(args, endpoint):
    """The worker's own counters, read with onlineps_worker_cli (exact, not scraped)."""
    out = subprocess.run([f"{args.bin}/onlineps_worker_cli", "--worker", endpoint,
                          "worker_stats"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def ensure_models(folder):
    if all(os.path.exists(os.path.join(folder, f)) for f, _ in MODES.values()):
        return
    python = "/usr/bin/python3"  # Debian's, with python3-torch (scripts/setup.sh installs it)
    if not os.path.exists(python):
        python = shutil.which("python3")
    print(f"online: writing the example models to {folder} (export.py)", flush=True)
    subprocess.run([python, os.path.join(HERE, "export.py"), "--out", folder], check=True)


def accuracy(mcp, rows):
    right = 0
    for i in range(0, len(rows), 100):
        chunk = rows[i:i + 100]
        out = mcp.call("infer", {"examples": [{"features": x} for x, _ in chunk]})
        right += sum(p["label"] == str(y) for p, (_, y) in zip(out["predictions"], chunk))
    return right / len(rows)


def cpu_seconds(pids):
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def run_mode(mode, args, stream, test, log):
    model_file, extra = MODES[mode]
    with opslib.Procs(tempfile.mkdtemp(prefix=f"frozen-{mode}-")) as procs:
        shard = procs.start("ps", [f"{args.bin}/onlineps_ps", "--listen", "tcp://127.0.0.1:0",
                                   "--admin-port", "-1", "--log-level", "warn"])
        worker = procs.start("worker", [
            f"{args.bin}/onlineps_worker", "--ps", opslib.endpoint(shard, "shard"), "--listen",
            "tcp://127.0.0.1:0", "--admin-port", "-1", "--log-level", "warn", "--model",
            "torchscript", "--model-file", os.path.join(args.models, model_file), "--labels",
            ",".join(LABELS), "--optimizer", args.optimizer, "--lr", str(args.lr)] + extra)
        wep = opslib.endpoint(worker, "worker")
        bridge = procs.start("bridge", [f"{args.bin}/onlineps_mcp_bridge", "--workers", wep,
                                        "--port", str(opslib.free_port()), "--admin-port", "-1",
                                        "--log-level", "warn"])
        mcp = opslib.McpSession(opslib.endpoint(bridge, "bridge"))
        opslib.wait_until(lambda: mcp.call("model_info", {}).get("model"), 10, "worker stats")
        info = mcp.call("model_info", {})["model"]
        before = accuracy(mcp, test)
        log(f"{mode}: {info['trainable_floats']} trainable floats, {info['frozen_floats']} "
            f"frozen; accuracy before learning {before:.3f}")
        curve = []
        cpu0 = cpu_seconds([shard.pid, worker.pid])
        learn_s = 0.0
        for i, (x, y) in enumerate(stream[:args.examples]):
            t = time.perf_counter()
            mcp.call("learn", {"features": x, "label": str(y)})
            learn_s += time.perf_counter() - t
            if (i + 1) in args.checkpoints:
                curve.append((i + 1, accuracy(mcp, test)))
                log(f"{mode}:   after {i + 1} examples: accuracy {curve[-1][1]:.3f}")
        cpu = cpu_seconds([shard.pid, worker.pid]) - cpu0
        stats = worker_stats(args, wep)
        learns, pushed = stats["learn_requests"], stats["push_bytes"]
        after = accuracy(mcp, test)
        n = args.examples
        result = {"mode": mode, "trainable": info["trainable_floats"], "before": before,
                  "after": after, "curve": curve, "learns_per_s": n / learn_s,
                  "bytes_per_learn": pushed / max(learns, 1),
                  "cpu_ms_per_learn": 1000 * cpu / n}
        log(f"{mode}: accuracy after {n} examples {after:.3f}; {result['learns_per_s']:.0f} "
            f"learns/s through MCP, {result['bytes_per_learn']:.0f} bytes pushed per learn, "
            f"{result['cpu_ms_per_learn']:.2f} ms worker+shard CPU per learn")
        return result


def parse_args(argv=None, modes="head"):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=modes,
                        help="comma separated: full, head, lora4, lora8 (default: head)")
    parser.add_argument("--examples", type=int, default=1000,
                        help="online examples, one learn call each (at most 1000)")
    parser.add_argument("--checkpoints", default="100,300",
                        help="also measure accuracy after these many examples")
    parser.add_argument("--optimizer", default="adam", help="optimizer of the PS tables")
    parser.add_argument("--lr", type=float, default=0.001, help="learning rate")
    parser.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"),
                        help="folder of the onlineps binaries")
    parser.add_argument("--models", default=os.path.join(ROOT, "build", "frozen_head"),
                        help="folder of the models of export.py (written when missing)")
    args = parser.parse_args(argv)
    args.checkpoints = {int(c) for c in args.checkpoints.split(",") if c}
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            parser.error(f"unknown mode '{m}' (expected {', '.join(MODES)})")
    if not 1 <= args.examples <= digits.STREAM:
        parser.error(f"--examples must be in [1, {digits.STREAM}]")
    if not os.path.exists(f"{args.bin}/onlineps_worker"):
        parser.error(f"no onlineps_worker in {args.bin}: build first (scripts/build.sh)")
    args.modes = modes
    return args


def run(args, log):
    """Runs every mode of `args` in turn; returns one result dict per mode."""
    ensure_models(args.models)
    stream, test = digits.load()
    return [run_mode(m, args, stream, test, log) for m in args.modes]


if __name__ == "__main__":
    run(parse_args(), lambda line: print(f"online: {line}", flush=True))
