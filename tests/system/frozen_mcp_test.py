#!/usr/bin/env python3
"""A frozen backbone through MCP (issue 22): onlineps_ps, onlineps_worker serving
worker/testdata/frozen_head.pt (backbone saved with requires_grad=False, head trainable)
and onlineps_mcp_bridge as processes; an MCP client reads model_info (every parameter,
frozen ones included, and the frozen base hash), teaches the model with `learn` calls and
sees `infer` change; onlineps_worker_cli then confirms that the worker pushed exactly the
head's bytes per learn and that the backbone in memory still hashes to the base.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: opslib
import opslib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("ONLINEPS_BIN_DIR", os.path.join(HERE, "../../build/bin"))
MODEL = os.path.join(HERE, "..", "..", "worker", "testdata", "frozen_head.pt")
LEARNS = 40
HEAD_BYTES = (3 * 8 + 3) * 4  # head.weight [3, 8] + head.bias [3], float32


def features(e):
    return [2.0 * math.sin(1.7 * e + 0.9 * j) for j in range(6)]


def fail(message):
    print(f"frozen_mcp_test: FAIL: {message}")
    sys.exit(1)


def worker_cli(endpoint, op, body="{}"):
    out = subprocess.run([f"{BIN}/onlineps_worker_cli", "--worker", endpoint, op, body],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    with opslib.Procs(tempfile.mkdtemp(prefix="frozen-mcp-")) as procs:
        shard = procs.start("ps", [f"{BIN}/onlineps_ps", "--listen", "tcp://127.0.0.1:0",
                                   "--admin-port", "-1", "--log-level", "warn"])
        worker = procs.start("worker", [
            f"{BIN}/onlineps_worker", "--ps", opslib.endpoint(shard, "shard"), "--listen",
            "tcp://127.0.0.1:0", "--admin-port", "-1", "--log-level", "warn", "--model",
            "torchscript", "--model-file", MODEL, "--labels", "a,b,c", "--optimizer", "adam",
            "--lr", "0.05"])
        wep = opslib.endpoint(worker, "worker")
        bridge = procs.start("bridge", [f"{BIN}/onlineps_mcp_bridge", "--workers", wep, "--port",
                                        str(opslib.free_port()), "--admin-port", "-1",
                                        "--log-level", "warn"])
        mcp = opslib.McpSession(opslib.endpoint(bridge, "bridge"))

        opslib.wait_until(lambda: mcp.call("model_info", {}).get("model"), 10, "worker stats")
        model = mcp.call("model_info", {})["model"]
        base = model["base"]
        frozen = sorted(p["name"] for p in model["params"] if not p["trainable"])
        trainable = sorted(p["table"] for p in model["params"] if p["trainable"])
        if not base.startswith("sha256:"):
            fail(f"model_info.model.base is {base!r}")
        if frozen != ["backbone.fc0.bias", "backbone.fc0.weight", "backbone.fc1.bias",
                      "backbone.fc1.weight"]:
            fail(f"frozen parameters: {frozen}")
        if trainable != ["torchscript/head.bias", "torchscript/head.weight"]:
            fail(f"trainable tables: {trainable}")
        if model["dense_push_bytes"] != HEAD_BYTES:
            fail(f"dense_push_bytes {model['dense_push_bytes']}, want {HEAD_BYTES}")

        probe = [{"features": features(1000 + e)} for e in range(6)]
        before = [p["scores"] for p in mcp.call("infer", {"examples": probe})["predictions"]]
        losses = []
        for i in range(LEARNS):
            out = mcp.call("learn", {"features": features(i), "label": "abc"[i % 3]})
            if out["outcome"] != "applied":
                fail(f"learn {i}: outcome {out['outcome']}")
            losses.append(out["loss"])
        after = [p["scores"] for p in mcp.call("infer", {"examples": probe})["predictions"]]
        if after == before:
            fail("infer did not change after head-only learns")
        first, last = sum(losses[:9]) / 9, sum(losses[-9:]) / 9
        if not last < first:
            fail(f"loss did not fall: {first:.4f} -> {last:.4f}")

        stats = worker_cli(wep, "worker_stats")
        if stats["push_bytes"] != LEARNS * HEAD_BYTES:
            fail(f"push_bytes {stats['push_bytes']}, want {LEARNS} x {HEAD_BYTES}")
        verified = worker_cli(wep, "model_info", '{"verify": true}')
        if verified["base_now"] != base or not verified["frozen_intact"]:
            fail(f"backbone changed: base {base}, now {verified['base_now']}")
        print(f"frozen_mcp_test: PASS (base {base[:19]}..., {LEARNS} MCP learns, loss "
              f"{first:.3f} -> {last:.3f}, {stats['push_bytes']} bytes pushed, backbone intact)")


if __name__ == "__main__":
    main()
