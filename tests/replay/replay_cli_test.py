#!/usr/bin/env python3
"""onlineps_replay through its command line (issue 23 regressions), real binary:

  none-dataset  `--dataset none --model quadratic --updates N` runs N pushes and the loss
                falls (it used to fail: "dataset '' has no training rows"), and the summary
                gives the final train loss (it printed "final test accuracy nan"); without
                --updates it is refused with a message naming the flag.
  csv-quoting   a --run-name holding a comma and a quote is written as one quoted CSV
                field in curve.csv, staleness.csv and tau_histogram.csv, which every row
                of each parses back to with the header's column count.
  libsvm        a libsvm file learnt by sparse-lr (its keys and values go to a sparse table);
                any other model is refused, naming sparse-lr.
  torchscript   a TorchScript module with a frozen backbone (worker/testdata/frozen_head.pt)
                learns a CSV file and an npz archive: only its trainable parameters become
                PS tables, the manifest records the file's SHA-256, the frozen parameters and
                that they are unchanged; --trainable / --frozen choose other parameters; a
                glob that matches nothing, or --trainable on a built-in model, is refused.
  bad-specs     a --straggler / --churn whose worker field is not a worker index (2^32,
                nan, 0.9: once truncated onto worker 0 or 1) and a trace header whose
                model.tables is not a list of {"table": NAME} (once an abort), and a --loop
                whose events would not fit in memory (once std::bad_alloc), are refused with a
                message naming what is wrong.
  queued-tail   with --sync and 4 workers, --updates 6 leaves the last 2 pushes in the
                shard's accumulator: the manifest's result says queued_at_end 2 and the
                summary says they are not in the final parameters; --updates 8 leaves none.
  plots         a run without a test split (--dataset none; a trace is the same) writes
                every figure docs/replay.md names, curve and staleness in PNG and SVG, with
                no "gnuplot failed" (its empty test-accuracy column once stopped gnuplot at
                the first plot: a half-drawn curve.png and nothing else).
  events-header with --events, events.jsonl's header `dataset` is the dataset's description
                as docs/trace.md defines it (name, files, split, sizes), not wrapped in
                {"dataset": ..., "updates": N}.
  resume        (given --experiments-dir, an `experiments/run.py all --quick` output) the
                same grid again with --resume reuses every run, and each summary says so
                instead of "N runs in 0 s".
"""
import argparse
import csv
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("ONLINEPS_BIN_DIR", os.path.join(ROOT, "build", "bin"))
REPLAY = os.path.join(BIN, "onlineps_replay")


def fail(message):
    print(f"replay_cli_test: FAIL: {message}")
    sys.exit(1)


def replay(*args):
    return subprocess.run([REPLAY, "--no-plots", "--log-level", "warn", *args],
                          capture_output=True, text=True, timeout=120)


def none_dataset():
    out = tempfile.mkdtemp(prefix="replay-none-")
    r = replay("--dataset", "none", "--model", "quadratic", "--updates", "200", "--out", out)
    if r.returncode != 0:
        fail(f"--dataset none --model quadratic exit {r.returncode}: {r.stderr[-500:]}")
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    if manifest["result"]["pushes"] != 200:
        fail(f"pushes {manifest['result']['pushes']}, want 200")
    with open(os.path.join(out, "curve.csv"), newline="") as f:
        curve = list(csv.DictReader(f))
    first, last = float(curve[0]["train_loss"]), float(curve[-1]["train_loss"])
    if not last < first:
        fail(f"quadratic loss did not fall: {first} -> {last}")
    # No test split: the summary gives the train loss, not "test accuracy nan".
    if "nan" in r.stdout or "final train loss" not in r.stdout:
        fail(f"--dataset none summary:\n{r.stdout}")
    r = replay("--dataset", "none", "--model", "quadratic", "--out", out)
    if r.returncode == 0 or "--updates" not in r.stderr:
        fail(f"--dataset none without --updates: exit {r.returncode}, said {r.stderr[-300:]!r}")
    print(f"replay_cli_test: none-dataset PASS (200 pushes, loss {first:.3g} -> {last:.3g})")


def csv_quoting():
    out = tempfile.mkdtemp(prefix="replay-csv-")
    name = 'lr=0.1, tau "fixed:2"'
    r = replay("--dataset", "none", "--model", "quadratic", "--updates", "60", "--staleness",
               "fixed:2", "--workers", "3", "--run-name", name, "--out", out)
    if r.returncode != 0:
        fail(f"replay exit {r.returncode}: {r.stderr[-500:]}")
    for file in ("curve.csv", "staleness.csv", "tau_histogram.csv"):
        with open(os.path.join(out, file), newline="") as f:
            rows = list(csv.reader(f))
        if len(rows) < 2:
            fail(f"{file} has no data rows")
        for row in rows[1:]:
            if len(row) != len(rows[0]) or row[0] != name:
                fail(f"{file}: row {row} does not parse back to run {name!r} with "
                     f"{len(rows[0])} columns")
    print("replay_cli_test: csv-quoting PASS")


def libsvm():
    """A libsvm file through sparse-lr: keys and values reach a sparse table and it learns."""
    work = tempfile.mkdtemp(prefix="replay-libsvm-")
    path = os.path.join(work, "data.svm")
    rng = random.Random(3)
    with open(path, "w") as f:
        for _ in range(400):
            feats = sorted(rng.sample(range(1, 200), 5))
            label = "+1" if sum(1 for k in feats if k < 100) >= 3 else "-1"
            f.write(label + " " + " ".join(f"{k}:{rng.uniform(0.5, 1.5):.3f}" for k in feats) + "\n")
    out = os.path.join(work, "out")
    r = replay("--dataset", f"libsvm:{path}", "--model", "sparse-lr", "--workers", "4",
               "--compute", "exp:1", "--batch", "8", "--epochs", "5", "--optimizer", "adagrad",
               "--lr", "0.5", "--out", out)
    if r.returncode != 0:
        fail(f"libsvm replay exit {r.returncode}: {r.stderr[-500:]}")
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    acc = manifest["result"]["final"]["test_accuracy"]
    if acc < 0.8:
        fail(f"sparse-lr on the libsvm file: test accuracy {acc}")
    r = replay("--dataset", f"libsvm:{path}", "--model", "mlp", "--out", out)
    if r.returncode == 0 or "use --model sparse-lr" not in r.stderr:
        fail(f"libsvm with mlp: exit {r.returncode}, said {r.stderr[-300:]!r}")
    print(f"replay_cli_test: libsvm PASS (test accuracy {acc:.3f})")


def torchscript():
    work = tempfile.mkdtemp(prefix="replay-ts-")
    model_file = os.path.join(ROOT, "worker", "testdata", "frozen_head.pt")  # 6 -> 8 -> 8 -> 3
    rng = random.Random(5)
    rows = []
    for _ in range(300):
        x = [rng.gauss(0, 1) for _ in range(6)]
        rows.append(x + [0 if x[0] + x[1] < -0.5 else 1 if x[0] + x[1] < 0.5 else 2])
    data = os.path.join(work, "data.csv")
    with open(data, "w", newline="") as f:
        csv.writer(f).writerows([f"{v:.4f}" for v in r[:6]] + [r[6]] for r in rows)
    common = ["--model", "torchscript", "--model-file", model_file, "--workers", "4",
              "--batch", "8", "--epochs", "4", "--lr", "0.5"]

    def run(name, dataset, *extra):
        out = os.path.join(work, name)
        r = replay("--dataset", dataset, *common, *extra, "--out", out)
        if r.returncode != 0:
            fail(f"torchscript {name}: exit {r.returncode}: {r.stderr[-600:]}")
        manifest = json.load(open(os.path.join(out, "manifest.json")))
        with open(os.path.join(out, "curve.csv"), newline="") as f:
            curve = list(csv.DictReader(f))
        return manifest["model"], float(curve[0]["train_loss"]), float(curve[-1]["train_loss"])

    model, first, last = run("default", f"csv:{data}")
    tables = sorted(p["table"] for p in model["params"])
    if tables != ["torchscript/head.bias", "torchscript/head.weight"]:
        fail(f"tables of the file's own split: {tables}")
    frozen = sorted(p["name"] for p in model.get("frozen", []))
    if frozen != ["backbone.fc0.bias", "backbone.fc0.weight", "backbone.fc1.bias",
                  "backbone.fc1.weight"]:
        fail(f"frozen parameters in the manifest: {frozen}")
    if model.get("frozen_intact") is not True or not model.get("base", "").startswith("sha256:"):
        fail(f"frozen part not recorded as intact: {model}")
    want_sha = hashlib.sha256(open(model_file, "rb").read()).hexdigest()
    if model.get("file", {}).get("sha256") != want_sha:
        fail(f"model file hash {model.get('file')}, want {want_sha}")
    if not last < first:
        fail(f"the head did not learn: train loss {first} -> {last}")
    model, _, _ = run("trainable", f"csv:{data}", "--trainable", "backbone.fc1.*,head.*")
    if len(model["params"]) != 4 or len(model.get("frozen", [])) != 2:
        fail(f"--trainable backbone.fc1.*,head.*: {model}")
    model, _, _ = run("frozen", f"csv:{data}", "--frozen", "head.*")
    if len(model["params"]) != 4 or [p["name"] for p in model["frozen"]] != ["head.weight",
                                                                             "head.bias"]:
        fail(f"--frozen head.*: {model}")
    npz = os.path.join(work, "data.npz")  # the same rows as a NumPy archive (Debian's numpy)
    subprocess.run(["/usr/bin/python3", "-c", "import numpy as np, sys; r = np.loadtxt(sys.argv[1], "
                    "delimiter=','); np.savez(sys.argv[2], x=r[:, :6], y=r[:, 6].astype(int))",
                    data, npz], check=True)
    model, first, last = run("npz", f"npz:{npz}")
    if len(model["params"]) != 2 or not last < first:
        fail(f"npz: {model['params']}, train loss {first} -> {last}")
    missing = [a if a != model_file else os.path.join(work, "missing.pt") for a in common]
    for args, want in ((common + ["--trainable", "nosuch.*"], "'nosuch.*' matches no parameter"),
                       (missing, "missing.pt")):
        r = replay("--dataset", f"csv:{data}", *args, "--out", work + "/bad")
        if r.returncode == 0 or want not in r.stderr:
            fail(f"{args[-2:]}: exit {r.returncode}, said {r.stderr[-300:]!r}, want {want!r}")
    r = replay("--dataset", f"csv:{data}", "--model", "mlp", "--trainable", "x", "--out",
               work + "/bad")
    if r.returncode == 0 or "torchscript" not in r.stderr:
        fail(f"--trainable with mlp: exit {r.returncode}, said {r.stderr[-300:]!r}")
    print(f"replay_cli_test: torchscript PASS (head learnt {first:.3f} -> {last:.3f} on npz; "
          "csv and npz, --trainable, --frozen, bad globs refused)")


def resume(experiments_dir):
    env = dict(os.environ, ONLINEPS_REPLAY=REPLAY)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "run.py"), "all",
                        "--quick", "--resume", "--out", experiments_dir], env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        fail(f"run.py --resume exit {r.returncode}: {r.stderr[-800:]}")
    for exp in ("e1", "e2", "e3"):
        summary = open(os.path.join(experiments_dir, f"{exp}_summary.md")).read()
        m = re.search(r"(\d+) runs: (\d+) reused from an earlier invocation \(--resume; they "
                      r"took ([0-9.]+) s then\), 0 run now in [0-9.]+ s", summary)
        if not m or m.group(1) != m.group(2) or float(m.group(3)) <= 0:
            fail(f"{exp}_summary.md does not say its runs were reused: "
                 f"{summary.strip().splitlines()[-1]!r}")
    print("replay_cli_test: resume PASS")


def bad_specs():
    common = ["--dataset", "none", "--model", "quadratic", "--updates", "200", "--workers", "2",
              "--compute", "fixed:1", "--dry-run"]
    for flag, value in [("--straggler", "4294967296:0:1e9:10"), ("--straggler", "nan:0:1e9:10"),
                        ("--straggler", "0.9:0:1e9:10"), ("--churn", "4294967297:0:50")]:
        r = subprocess.run([REPLAY, *common, flag, value], capture_output=True, text=True,
                           timeout=60)
        if r.returncode == 0 or "worker index" not in r.stderr:
            fail(f"{flag} {value}: exit {r.returncode}, stderr:\n{r.stderr[-1000:]}")
    with tempfile.TemporaryDirectory() as tmp:
        for tables, said in [("5", "is not an array"), ("[5]", "not {"),
                             ('[{"table": 5}]', "not {")]:
            trace = os.path.join(tmp, "t.jsonl")
            with open(trace, "w") as f:
                f.write('{"kind":"header","format":"onlineps-trace","format_version":1,'
                        '"run_id":"r","source":"hand","start_unix_us":0,"model":{"labels":'
                        '["negative","positive"],"tables":' + tables + '}}\n')
                f.write('{"kind":"call","seq":1,"t_us":1000,"tool":"learn","is_error":false,'
                        '"worker":"w","tau":0,"version":1,"arguments":{"examples":'
                        '[{"text":"good","label":"positive"}]}}\n')
            r = subprocess.run([REPLAY, "--trace", trace, "--model", "quadratic", "--out",
                                os.path.join(tmp, "out")], capture_output=True, text=True,
                               timeout=60)
            if r.returncode in (0, -6, 134) or said not in r.stderr:
                fail(f"trace with model.tables {tables}: exit {r.returncode}, stderr:\n"
                     f"{r.stderr[-1000:]}")
        # --loop of a trace: its events are held in memory, so a loop count that would
        # need about 150 GB is refused at once (it ended in std::bad_alloc).
        trace = os.path.join(tmp, "learns.jsonl")
        with open(trace, "w") as f:
            f.write('{"kind":"header","format":"onlineps-trace","format_version":1,'
                    '"run_id":"r","source":"hand","start_unix_us":0,"model":{"labels":'
                    '["negative","positive"]}}\n')
            for i in range(1000):
                f.write(json.dumps({"kind": "call", "seq": i + 1, "t_us": 1000 * (i + 1),
                                    "tool": "learn", "is_error": False, "worker": "w", "tau": 0,
                                    "version": i + 1, "arguments": {"examples": [
                                        {"text": "good", "label": "positive"}]}}) + "\n")
        r = subprocess.run([REPLAY, "--trace", trace, "--model", "text", "--loop", "1000000",
                            "--dry-run", "--out", os.path.join(tmp, "loop")],
                           capture_output=True, text=True, timeout=60)
        if r.returncode in (0, -6, 134) or "lower --loop" not in r.stderr:
            fail(f"--loop 1000000 of 1000 learns: exit {r.returncode}, stderr:\n{r.stderr[-1000:]}")
    print("replay_cli_test: bad-specs PASS")


def queued_tail():
    with tempfile.TemporaryDirectory() as tmp:
        for updates, want in [(6, 2), (8, 0)]:
            out = os.path.join(tmp, f"sync{updates}")
            r = subprocess.run([REPLAY, "--dataset", "none", "--model", "quadratic", "--sync",
                                "--workers", "4", "--updates", str(updates), "--no-plots",
                                "--out", out], capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                fail(f"--sync --updates {updates}: exit {r.returncode}:\n{r.stderr[-1000:]}")
            with open(os.path.join(out, "manifest.json")) as f:
                got = json.load(f)["result"].get("queued_at_end")
            if got != want:
                fail(f"--sync --workers 4 --updates {updates}: queued_at_end {got}, want {want}")
            if (want > 0) != ("still queued" in r.stdout):
                fail(f"--updates {updates}: the summary does not say what is queued:\n{r.stdout}")
    print("replay_cli_test: queued-tail PASS")


def plots():
    if subprocess.run(["sh", "-c", "command -v gnuplot"], capture_output=True).returncode != 0:
        fail("gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)")
    with tempfile.TemporaryDirectory() as out:
        r = subprocess.run([REPLAY, "--dataset", "none", "--model", "quadratic", "--updates",
                            "60", "--workers", "3", "--log-level", "warn", "--out", out],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            fail(f"--dataset none: exit {r.returncode}:\n{r.stderr[-1000:]}")
        if "gnuplot failed" in r.stderr:
            fail(f"--dataset none: {r.stderr.strip()[-500:]}")
        figures = [f"{name}.{ext}" for name in ("curve", "staleness") for ext in ("png", "svg")]
        missing = [f for f in figures if not os.path.exists(os.path.join(out, f))
                   or os.path.getsize(os.path.join(out, f)) == 0]
        if missing:
            fail(f"--dataset none: no {', '.join(missing)} in {sorted(os.listdir(out))}")
    print("replay_cli_test: plots PASS")


def events_header():
    data = tempfile.mkdtemp(prefix="replay-events-")
    with open(os.path.join(data, "d.csv"), "w") as f:
        f.write("a,b,label\n" + "".join(f"{i % 7},{i % 3},{i % 2}\n" for i in range(40)))
    out = os.path.join(data, "run")
    r = replay("--dataset", f"csv:{data}/d.csv", "--model", "mlp", "--hidden", "4", "--updates",
               "6", "--batch", "4", "--events", "--out", out)
    if r.returncode != 0:
        fail(f"--events: exit {r.returncode}: {r.stderr[-500:]}")
    with open(os.path.join(out, "events.jsonl")) as f:
        header = json.loads(f.readline())
    dataset = header.get("dataset", {})
    if dataset.get("name") != f"csv:{data}/d.csv" or dataset.get("train_size", 0) <= 0 \
            or len(dataset.get("files", [])) != 1:
        fail(f"events.jsonl header dataset is not the dataset's description (docs/trace.md: "
             f"name, package, files, split, ...): {json.dumps(dataset)[:400]}")
    print("replay_cli_test: events-header PASS")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("check",
                    choices=["none-dataset", "csv-quoting", "libsvm", "torchscript", "bad-specs",
                             "queued-tail", "plots", "events-header", "resume"])
    ap.add_argument("--experiments-dir", help="resume: an experiments/run.py all --quick output")
    args = ap.parse_args()
    if args.check == "none-dataset":
        none_dataset()
    elif args.check == "csv-quoting":
        csv_quoting()
    elif args.check == "libsvm":
        libsvm()
    elif args.check == "torchscript":
        torchscript()
    elif args.check == "bad-specs":
        bad_specs()
    elif args.check == "queued-tail":
        queued_tail()
    elif args.check == "plots":
        plots()
    elif args.check == "events-header":
        events_header()
    else:
        if not args.experiments_dir:
            ap.error("resume needs --experiments-dir")
        resume(args.experiments_dir)


if __name__ == "__main__":
    main()
