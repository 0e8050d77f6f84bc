#!/usr/bin/env python3
"""experiments/run.py FILE.toml / FILE.yaml (issue 23): a researcher's own grid from a
description file. Writes a small CSV dataset and a description that names it by a relative path, runs
the grid with the real onlineps_replay, and checks the tidy CSV (one row per run and seed,
all ok), the summary (mean ± sd with the 95% CI), the plots, the progress lines with ETA;
then the same grid written in YAML (where `csv-header: no` must stay the string "no");
then that bad descriptions are refused with a message naming the problem.
"""
import csv
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "..", "..", "experiments", "run.py")

DESCRIPTION = """
name = "tiny"
seeds = [1, 2]

[fixed]
dataset = "csv:data.csv"
model = "mlp"
hidden = "8"
compute = "exp:1"
batch = 8
updates = 30

[grid]
workers = [1, 4]
staleness-policy = ["none", "lr_over_tau"]
"""


def fail(message):
    print(f"grid_test: FAIL: {message}")
    sys.exit(1)


YAML = """
name: tiny-yaml
seeds: [1]
fixed:
  dataset: csv:data-nohead.csv
  csv-header: no           # YAML 1.1 would read a boolean here
  model: mlp
  hidden: "8"
  compute: exp:1
  batch: 8
  updates: 30
grid:
  workers: [1, 4]
"""


def run(toml_text, work, name="g.toml"):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write(toml_text)
    return subprocess.run([sys.executable, RUN, path, "--out", os.path.join(work, "out")],
                          capture_output=True, text=True, timeout=600)


def main():
    work = tempfile.mkdtemp(prefix="grid-test-")
    rng = random.Random(7)
    with open(os.path.join(work, "data.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["x1", "x2", "label"])
        for _ in range(200):
            x1, x2 = rng.gauss(0, 1), rng.gauss(0, 1)
            w.writerow([f"{x1:.4f}", f"{x2:.4f}", "pos" if x1 + x2 > 0 else "neg"])
    r = run(DESCRIPTION, work)
    if r.returncode != 0:
        fail(f"run.py exit {r.returncode}: {r.stderr[-1500:]}")
    if "ETA" not in r.stderr or "[tiny 8/8]" not in r.stderr:
        fail(f"no progress with ETA: {r.stderr[-600:]}")
    out = os.path.join(work, "out")
    with open(os.path.join(out, "tiny_results.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    if len(rows) != 8 or any(row["status"] != "ok" for row in rows):
        fail(f"{len(rows)} result rows, statuses {[row['status'] for row in rows]}")
    combos = {(row["workers"], row["staleness-policy"], row["seed"]) for row in rows}
    if len(combos) != 8:
        fail(f"configurations repeat: {sorted(combos)}")
    if not all(0 <= float(row["test_accuracy"]) <= 1 for row in rows):
        fail("test_accuracy out of [0, 1]")
    summary = open(os.path.join(out, "tiny_summary.md")).read()
    if "95% confidence interval" not in summary or summary.count(" [") < 4:
        fail(f"summary without confidence intervals:\n{summary[:800]}")
    for metric in ("test_accuracy", "test_loss"):
        for ext in ("png", "svg"):
            p = os.path.join(out, f"tiny_{metric}.{ext}")
            if not os.path.exists(p) or os.path.getsize(p) == 0:
                fail(f"{p} missing or empty")
    svg = open(os.path.join(out, "tiny_test_accuracy.svg")).read()
    if "95% CI" not in svg or "test accuracy (fraction correct)" not in svg:
        fail("the plot does not state its error bars or its axis")

    with open(os.path.join(work, "data.csv")) as src, \
            open(os.path.join(work, "data-nohead.csv"), "w") as dst:
        dst.writelines(src.readlines()[1:])
    r = run(YAML, work, "g.yaml")
    if r.returncode != 0:
        fail(f"run.py on YAML: exit {r.returncode}: {r.stderr[-1500:]}")
    with open(os.path.join(out, "tiny-yaml_results.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    if len(rows) != 2 or any(row["status"] != "ok" for row in rows):
        fail(f"YAML grid: {len(rows)} result rows, statuses {[row['status'] for row in rows]}")
    summary = open(os.path.join(out, "tiny-yaml_summary.md")).read()
    if "--csv-header no" not in summary:
        fail(f"YAML grid: csv-header: no did not reach the command line:\n{summary[-800:]}")

    # A libsvm file named relative to the description, like csv: and npz:.
    with open(os.path.join(work, "data.svm"), "w") as f:
        for _ in range(100):
            k = rng.randrange(1, 50)
            f.write(f"{'+1' if k % 2 else '-1'} {k}:1 {k + 50}:0.5\n")
    r = run('name = "svm"\n[fixed]\ndataset = "libsvm:data.svm"\nmodel = "sparse-lr"\n'
            'updates = 20\n[grid]\nworkers = [2]\n', work, "svm.toml")
    if r.returncode != 0 or "0 run(s) not ok" not in r.stderr:
        fail(f"libsvm grid: exit {r.returncode}: {r.stderr[-1500:]}")

    toml_bad = [
        (DESCRIPTION.replace('hidden = "8"', 'hidden = "8"\nnosuch = 1'),
         "onlineps_replay has no flag --nosuch"),
        (DESCRIPTION.replace('hidden = "8"', 'hidden = "8"\nseed = 3'), "seed: set by the driver"),
        (DESCRIPTION.replace("workers = [1, 4]", "workers = 4"), "workers must be a non-empty list"),
        (DESCRIPTION.replace('name = "tiny"', 'name = "a/b"'), "'name' must be"),
        (DESCRIPTION + "\n[plot]\nx = \"lr\"\n", "[plot] x = 'lr' is not a [grid] key"),
        ("name = \"x\"\n[grid\n", "not valid TOML"),
    ]
    yaml_bad = [
        ("name: x\ngrid: [1, 2\n", "not valid YAML"),
        ("- name: x\n", "the description must be a mapping"),
        (YAML.replace("workers: [1, 4]", "worker: [1, 4]"), "onlineps_replay has no flag --worker"),
    ]
    bad = [(t, w, "bad.toml") for t, w in toml_bad] + [(t, w, "bad.yaml") for t, w in yaml_bad]
    for text, want, name in bad:
        r = run(text, work, name)
        if r.returncode != 2 or want not in r.stderr:
            fail(f"bad description: exit {r.returncode}, said {r.stderr[-300:]!r}, want {want!r}")
    print(f"grid_test: PASS (8 runs, summary with 95% CIs, 4 plots, a YAML grid, {len(bad)} bad "
          "descriptions refused)")


if __name__ == "__main__":
    main()
