#!/usr/bin/env python3
"""Experiments of issue 6: delay compensation (E1), a staleness sweep (E2) and sparse
online learning on SpamAssassin (E3), run with onlineps_replay (docs/replay.md).

Standard library only. Every run is one onlineps_replay process (logical mode, one
in-process shard, --quiet --no-plots), run one at a time; the driver reads each run's
manifest.json and curve.csv and writes, per experiment, under --out:

  eN_results.csv   one row per run (experiment, config columns, seed, status, metrics)
  eN_summary.md    mean and sd over seeds, and the command lines
  eN_*.png/.svg    gnuplot plots (eN.gp holds the script with its data inline)

Usage: experiments/run.py {e1,e2,e3,all} [--quick] [--out DIR] [--seeds 1,2,3]
                          [--runs-dir DIR] [--resume]
       experiments/run.py FILE.toml|FILE.yaml [--out DIR] [--runs-dir DIR] [--resume]
                          (a grid of your own runs: experiments/grid.py)
The binary is <repo>/build/bin/onlineps_replay unless $ONLINEPS_REPLAY names another.
Exit status: 0 when every run finished and every results row and plot is there with
finite metrics; 1 otherwise (a diverged run counts as a failure only with --quick).
See experiments/README.md.
"""

import argparse
import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BIN = REPO / "build" / "bin" / "onlineps_replay"

# ---------------------------------------------------------------------------------------
# Experiment definitions. Everything an experiment varies is in its config dict; the
# flags shared by all of its runs are in its "base" list.
# ---------------------------------------------------------------------------------------

E1_POLICIES = ["none", "lr_over_tau", "dc_constant", "dc_adaptive", "sync"]


def e1_setup(quick):
    if quick:
        return {
            "base": ["--dataset", "digits", "--model", "mlp", "--compute", "exp:1",
                     "--batch", "16", "--updates", "48", "--eval-every", "16", "--lr", "0.1"],
            "workers": [1, 4],
            "updates": 48,
        }
    # 1872 = 117 * 16 pushes of 32 examples (59,904 samples, 99.8% of one epoch): a
    # whole number of synchronous rounds for every M.
    return {
        "base": ["--dataset", "fashion-mnist", "--model", "mlp", "--compute", "exp:1",
                 "--batch", "32", "--updates", "1872", "--eval-every", "234",
                 "--eval-rows", "0", "--lr", "0.1"],
        "workers": [1, 4, 8, 16],
        "updates": 1872,
    }


def e1_runs(quick, seeds):
    s = e1_setup(quick)
    runs = []
    for m in s["workers"]:
        # With one worker tau is always 0: lr/tau scales by 1/max(0,1) = 1, DC sees
        # w - w_bak = 0 and a synchronous round is one push, so all five are plain
        # sequential SGD; it is run once per seed.
        policies = ["sequential"] if m == 1 else E1_POLICIES
        for p in policies:
            flags = ["--workers", str(m)]
            if p == "sync":
                flags += ["--sync"]
            elif p != "sequential":
                flags += ["--staleness-policy", p]
            for seed in seeds:
                runs.append(Run("e1", {"workers": m, "policy": p}, seed, s["base"] + flags))
    return runs


def e1_metrics(run, manifest, curve):
    res = manifest["result"]
    last = curve[-1]
    m = run.config["workers"]
    pushes = res["pushes"]
    tail = [fnum(r["test_accuracy"]) for r in curve[-3:]]
    return {
        "test_accuracy": fnum(last["test_accuracy"]),
        "test_loss": fnum(last["test_loss"]),
        # The last three evaluations (full test set), a less noisy view of the end state.
        "test_accuracy_last3": statistics.fmean(tail),
        "test_rows": manifest["workload"]["dataset"]["test_size"],
        "pushes": pushes,
        "samples": int(last["samples"]),
        # With --sync the PS applies one averaged update per M pushes (accumulate = M).
        "ps_updates": pushes // m if run.config["policy"] == "sync" else pushes,
        "staleness_mean": res["staleness"]["mean"],
        "staleness_p99": res["staleness"]["p99"],
        "staleness_max": res["staleness"]["max"],
        "params_sha256": res["params_sha256"][:16],
        "wall_s": res["wall_s"],
    }


E2_STALENESS = [0, 2, 4, 8, 16]
E2_OPTIMIZERS = {"sgd": 0.02, "adam": 0.001}  # one lr per optimizer, for every s (pilots)


def e2_setup(quick):
    if quick:
        return {
            "base": ["--dataset", "digits", "--model", "mlp", "--batch", "16",
                     "--updates", "60", "--eval-every", "10", "--eval-rows", "200",
                     "--workers", "3"],
            "staleness": [0, 2],
            "targets": {"sgd": 0.3, "adam": 0.3},
            "updates": 60,
        }
    return {
        "base": ["--dataset", "fashion-mnist", "--model", "mlp", "--batch", "32",
                 "--updates", "1875", "--eval-every", "25", "--eval-rows", "1000",
                 "--workers", "17"],
        "staleness": E2_STALENESS,
        "targets": {"sgd": 0.75, "adam": 0.75},
        "updates": 1875,
    }


def e2_runs(quick, seeds):
    s = e2_setup(quick)
    runs = []
    for opt, lr in E2_OPTIMIZERS.items():
        for st in s["staleness"]:
            flags = ["--optimizer", opt, "--lr", str(lr), "--staleness", f"fixed:{st}"]
            for seed in seeds:
                runs.append(Run("e2", {"optimizer": opt, "lr": lr, "staleness": st}, seed,
                                s["base"] + flags, extra={"target": s["targets"][opt]}))
    return runs


def e2_metrics(run, manifest, curve):
    res = manifest["result"]
    target = run.extra["target"]
    first = next((int(r["updates"]) for r in curve
                  if math.isfinite(fnum(r["test_accuracy"])) and
                  fnum(r["test_accuracy"]) >= target), None)
    accs = [fnum(r["test_accuracy"]) for r in curve]
    return {
        "target": target,
        "updates_to_target": first if first is not None else "",
        "reached": int(first is not None),
        "final_subset_accuracy": accs[-1],
        "best_subset_accuracy": max(accs),
        "eval_rows": min(int(run.flags[run.flags.index("--eval-rows") + 1]) or 10**9,
                         manifest["workload"]["dataset"]["test_size"]),
        "pushes": res["pushes"],
        "staleness_mean": res["staleness"]["mean"],
        "staleness_max": res["staleness"]["max"],
        "wall_s": res["wall_s"],
    }


E3_STALENESS = [0, 8, 32]
E3_OPTIMIZERS = {"ftrl": 0.1, "adagrad": 0.1, "sgd": 0.1}  # chosen at s = 0 (pilots)


def e3_setup(quick):
    if quick:
        return {
            "base": ["--dataset", "spam-assassin", "--model", "sparse-lr", "--no-shuffle",
                     "--progressive", "--batch", "8", "--max-train", "320", "--max-test",
                     "100", "--eval-every", "20", "--eval-rows", "0"],
            "staleness": [0, 2],
        }
    return {
        "base": ["--dataset", "spam-assassin", "--model", "sparse-lr", "--no-shuffle",
                 "--progressive", "--batch", "8", "--eval-every", "121", "--eval-rows", "0"],
        "staleness": E3_STALENESS,
    }


def e3_runs(quick, seeds):
    s = e3_setup(quick)
    runs = []
    for opt, lr in E3_OPTIMIZERS.items():
        for st in s["staleness"]:
            flags = ["--optimizer", opt, "--lr", str(lr), "--staleness", f"fixed:{st}",
                     "--workers", str(st + 1)]
            for seed in seeds:
                runs.append(Run("e3", {"optimizer": opt, "lr": lr, "staleness": st}, seed,
                                s["base"] + flags))
    return runs


def e3_metrics(run, manifest, curve):
    res = manifest["result"]
    last = curve[-1]
    return {
        "progressive_accuracy": fnum(last["progressive_accuracy"]),
        "test_accuracy": fnum(last["test_accuracy"]),
        "test_loss": fnum(last["test_loss"]),
        "test_rows": manifest["workload"]["dataset"]["test_size"],
        "pushes": res["pushes"],
        "samples": int(last["samples"]),
        "staleness_mean": res["staleness"]["mean"],
        "staleness_max": res["staleness"]["max"],
        "params_sha256": res["params_sha256"][:16],
        "wall_s": res["wall_s"],
    }


# Metrics that must be finite in an "ok" run (checked by the self-test).
REQUIRED = {
    "e1": ["test_accuracy", "test_loss", "staleness_mean"],
    "e2": ["final_subset_accuracy", "best_subset_accuracy", "staleness_mean"],
    "e3": ["progressive_accuracy", "test_accuracy", "test_loss", "staleness_mean"],
}
METRICS = {"e1": e1_metrics, "e2": e2_metrics, "e3": e3_metrics}
RUNS = {"e1": e1_runs, "e2": e2_runs, "e3": e3_runs}


# ---------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------

def fnum(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


class Run:
    def __init__(self, exp, config, seed, flags, extra=None):
        self.exp, self.config, self.seed, self.flags = exp, config, seed, flags
        self.extra = extra or {}

    @property
    def name(self):
        parts = [f"{k}-{v}" for k, v in self.config.items()]
        return "_".join(parts + [f"seed-{self.seed}"]).replace(":", "")

    def argv(self, binary, out):
        return [str(binary)] + self.flags + [
            "--seed", str(self.seed), "--mode", "logical", "--shards", "1",
            "--quiet", "--no-plots", "--out", str(out), "--run-name", self.name]


def rel(path):
    """path relative to the working directory when it is below it (tidier CSVs)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def dataset_of(setup):
    return setup["base"][setup["base"].index("--dataset") + 1]


def child_env():
    # Every flag also reads an ONLINEPS_* variable: keep the caller's out of the runs.
    return {k: v for k, v in os.environ.items() if not k.startswith("ONLINEPS_")}


def read_curve(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def execute(run, binary, runs_dir, resume):
    out = (runs_dir / run.exp / run.name).resolve()  # the run's cwd is `out` itself
    argv = run.argv(binary, out)
    manifest_path = out / "manifest.json"
    reused = False
    t0 = time.monotonic()
    if resume and manifest_path.exists():
        try:
            old = json.loads(manifest_path.read_text())
            reused = (old.get("argv", [])[1:] == argv[1:]
                      and old.get("interrupted") is None)
            # What the reused run took when it ran (its own wall time, not this call's).
            reused_s = float(old.get("result", {}).get("wall_s", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            reused = False
    rc, err_tail = 0, ""
    if not reused:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        with open(out / "log.txt", "w") as log:
            rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=child_env(),
                                cwd=str(out)).returncode
        err_tail = (out / "log.txt").read_text(errors="replace")[-2000:]
    elapsed = reused_s if reused else time.monotonic() - t0
    row = {"experiment": run.exp, **run.config, "seed": run.seed}
    status, metrics = "failed", {}
    if rc == 0 and manifest_path.exists() and (out / "curve.csv").exists():
        manifest = json.loads(manifest_path.read_text())
        curve = read_curve(out / "curve.csv")
        if curve and manifest.get("interrupted") is None:
            metrics = METRICS[run.exp](run, manifest, curve)
            status = "ok"
            row["commit"] = manifest.get("commit", "")
    elif "NON_FINITE" in err_tail or "NaN or Inf" in err_tail:
        status = "diverged"  # the PS refused a push holding NaN/Inf: the run blew up
    row["status"] = status
    row.update(metrics)
    row["run_dir"] = rel(out)
    if status != "ok":
        last = [l for l in err_tail.splitlines() if l.strip()][-1:] or ["(no output)"]
        row["error"] = last[0][:300]
    return row, argv, elapsed, reused


def fmt_metric(exp, row):
    if row["status"] != "ok":
        return row["status"] + ": " + row.get("error", "")
    if exp == "e1":
        return f"acc {row['test_accuracy']:.4f} tau_mean {row['staleness_mean']:.2f}"
    if exp == "e2":
        u = row["updates_to_target"]
        return (f"to {row['target']}: {u if u != '' else 'not reached'}, "
                f"best {row['best_subset_accuracy']:.4f} tau_mean {row['staleness_mean']:.2f}")
    return (f"progressive {row['progressive_accuracy']:.4f} test {row['test_accuracy']:.4f} "
            f"tau_mean {row['staleness_mean']:.2f}")


def run_all(label, runs, args, binary, describe):
    """Runs `runs` one at a time (execute), a progress line each with an ETA from the runs
    done so far; returns the rows, the argvs and the timing for runs_line."""
    runs_dir = Path(args.runs_dir) if args.runs_dir else Path(args.out) / "runs"
    rows, argvs = [], []
    timing = {"reused": 0, "reused_s": 0.0}
    fresh_s, fresh_n = 0.0, 0
    t0 = time.monotonic()
    for i, run in enumerate(runs, 1):
        row, argv, elapsed, reused = execute(run, binary, runs_dir, args.resume)
        rows.append(row)
        argvs.append(argv)
        if reused:
            timing["reused"] += 1
            timing["reused_s"] += elapsed
        else:
            fresh_s += elapsed
            fresh_n += 1
        left = len(runs) - i
        eta = ("done" if not left else
               f"ETA {left * fresh_s / fresh_n:.0f} s" if fresh_n else "ETA ?")
        cfg = " ".join(f"{k}={v}" for k, v in run.config.items())
        print(f"[{label} {i}/{len(runs)}] {cfg} seed={run.seed}: {describe(row)} "
              f"({f'reused, ran {elapsed:.1f} s earlier' if reused else f'{elapsed:.1f} s'}; "
              f"{time.monotonic() - t0:.0f} s so far, {eta})", file=sys.stderr, flush=True)
    timing["wall"] = time.monotonic() - t0
    return rows, argvs, timing


def run_experiment(exp, args, binary, seeds):
    runs = RUNS[exp](args.quick, seeds)
    rows, argvs, timing = run_all(exp, runs, args, binary, lambda row: fmt_metric(exp, row))
    return runs, rows, argvs, timing


def runs_line(n, timing):
    """How long the runs took: with --resume, the reused ones took their time earlier."""
    if not timing["reused"]:
        return f"{n} runs in {timing['wall']:.0f} s"
    fresh = n - timing["reused"]
    return (f"{n} runs: {timing['reused']} reused from an earlier invocation (--resume; they "
            f"took {timing['reused_s']:.1f} s then), {fresh} run now in {timing['wall']:.1f} s")


# ---------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------

def write_csv(path, rows):
    cols = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: fmt_cell(r.get(k, "")) for k in cols})


def fmt_cell(v):
    if isinstance(v, float):
        return "" if not math.isfinite(v) else repr(v)
    return v


def mean_sd(values):
    v = [x for x in values if isinstance(x, (int, float)) and math.isfinite(x)]
    if not v:
        return float("nan"), float("nan"), 0
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else 0.0), len(v)


# Two-sided 95% quantiles of Student's t by degrees of freedom (n - 1); 1.96 beyond 30.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
       17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064,
       25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042}


def ci95(values):
    """Half-width of the 95% confidence interval of the mean (t, n - 1 dof); NaN below 2."""
    m, s, n = mean_sd(values)
    if n < 2:
        return float("nan")
    return T95.get(n - 1, 1.96) * s / math.sqrt(n)


def groups(rows, keys):
    out = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def pm(values, digits=4, scale=1.0):
    """mean ± sd [95% CI of the mean] over the values (seeds)."""
    v = [x * scale for x in values]
    m, s, n = mean_sd(v)
    if n == 0:
        return "n/a"
    h = ci95(v)
    ci = f" [{m - h:.{digits}f}, {m + h:.{digits}f}]" if math.isfinite(h) else ""
    return f"{m:.{digits}f} ± {s:.{digits}f}{ci}"


def ci_note(seeds):
    return (f"mean ± sd [95% confidence interval of the mean, Student's t with n - 1 degrees "
            f"of freedom] over the {len(seeds)} seeds {seeds}")


def bars_note(seeds):
    return f"error bars: 95% CI of the mean over {len(seeds)} seeds (t)"


def ok_vals(rs, key):
    return [r[key] for r in rs if r["status"] == "ok" and r.get(key, "") != ""]


def command_block(argvs, n=3):
    lines = []
    for a in argvs[:n]:
        lines.append("onlineps_replay " + " ".join(a[1:]))
    return "```\n" + "\n".join(lines) + "\n```\n"


def status_note(rs):
    bad = [r for r in rs if r["status"] != "ok"]
    if not bad:
        return ""
    return " (" + ", ".join(sorted({r["status"] for r in bad})) + f": {len(bad)}/{len(rs)})"


def summary_e1(rows, argvs, setup, seeds):
    md = [f"# E1: delay compensation ({dataset_of(setup)}, MLP)\n",
          f"Test accuracy on the full test set after {setup['updates']} pushes per run "
          f"(the same samples for every configuration), {ci_note(seeds)}. "
          "`ps updates` is the number of model updates the PS applied (M pushes per update "
          "with --sync).\n",
          "`last 3 evals` averages the accuracy of the last three evaluations (full test set, "
          f"every {setup['base'][setup['base'].index('--eval-every') + 1]} pushes), a less "
          "noisy view of the end of training.\n",
          "| M | policy | test accuracy | last 3 evals | test loss | measured tau mean | tau p99 "
          "| ps updates | runs |",
          "|---|---|---|---|---|---|---|---|---|"]
    g = groups(rows, ["workers", "policy"])
    for (m, p), rs in g.items():
        md.append(f"| {m} | {p} | {pm(ok_vals(rs, 'test_accuracy'))} | "
                  f"{pm(ok_vals(rs, 'test_accuracy_last3'))} | {pm(ok_vals(rs, 'test_loss'))} | {pm(ok_vals(rs, 'staleness_mean'), 2)} | "
                  f"{pm(ok_vals(rs, 'staleness_p99'), 1)} | "
                  f"{int(mean_sd(ok_vals(rs, 'ps_updates'))[0]) if ok_vals(rs, 'ps_updates') else 'n/a'} | "
                  f"{len(ok_vals(rs, 'test_accuracy'))}/{len(rs)}{status_note(rs)} |")
    seq = mean_sd(ok_vals(g.get((1, "sequential"), []), "test_accuracy"))[0]
    if math.isfinite(seq):
        md.append("\nTest error (%), and the share of the async gap each policy recovers: "
                  "(err(none) - err(policy)) / (err(none) - err(sequential)).\n")
        md.append("| M | " + " | ".join(E1_POLICIES) + " |")
        md.append("|---|" + "---|" * len(E1_POLICIES))
        md.append(f"| 1 (sequential) | " + " | ".join(
            [f"{100 * (1 - seq):.2f}"] * len(E1_POLICIES)) + " |")
        for m in sorted({r["workers"] for r in rows if r["workers"] != 1}):
            err = {p: 100 * (1 - mean_sd(ok_vals(g.get((m, p), []), "test_accuracy"))[0])
                   for p in E1_POLICIES}
            cells = []
            for p in E1_POLICIES:
                e = err[p]
                gap = err["none"] - 100 * (1 - seq)
                if not math.isfinite(e):
                    cells.append("n/a")
                elif p == "none" or abs(gap) < 1e-9:
                    cells.append(f"{e:.2f}")
                else:
                    cells.append(f"{e:.2f} ({100 * (err['none'] - e) / gap:+.0f}%)")
            md.append(f"| {m} | " + " | ".join(cells) + " |")
    md.append("\nCommand lines (first runs; the others differ in --workers, "
              "--staleness-policy / --sync and --seed):\n")
    md.append(command_block(argvs))
    return "\n".join(md) + "\n"


def summary_e2(rows, argvs, setup, seeds):
    md = [f"# E2: staleness sweep ({dataset_of(setup)}, MLP, `--staleness fixed:S`)\n",
          f"Updates (pushes) until the test accuracy on the first "
          f"{rows[0].get('eval_rows', '?')} test rows first reaches the target, evaluated "
          f"every {setup['base'][setup['base'].index('--eval-every') + 1]} pushes, budget "
          f"{setup['updates']} pushes, seeds {seeds}. `relative` is updates(s) / updates(0) "
          f"per seed. Cells: {ci_note(seeds)}; a run that never reaches the target is "
          "counted as not reached and left out of the mean (the `reached` column says how "
          "many did).\n",
          "| optimizer | lr | s | target | updates to target | relative to s=0 | reached | "
          "best accuracy | measured tau mean |",
          "|---|---|---|---|---|---|---|---|---|"]
    g = groups(rows, ["optimizer", "staleness"])
    for (opt, s), rs in g.items():
        base = {r["seed"]: r for r in g.get((opt, 0), [])}
        rel = []
        for r in rs:
            b = base.get(r["seed"])
            if (r["status"] == "ok" and b and b["status"] == "ok" and
                    r["updates_to_target"] != "" and b["updates_to_target"] != ""):
                rel.append(r["updates_to_target"] / b["updates_to_target"])
        reached = sum(1 for r in rs if r["status"] == "ok" and r["reached"])
        md.append(f"| {opt} | {rs[0]['lr']} | {s} | {rs[0].get('target', '')} | "
                  f"{pm(ok_vals(rs, 'updates_to_target'), 0)} | {pm(rel, 2)} | "
                  f"{reached}/{len(rs)}{status_note(rs)} | "
                  f"{pm(ok_vals(rs, 'best_subset_accuracy'))} | "
                  f"{pm(ok_vals(rs, 'staleness_mean'), 2)} |")
    md.append("\nCommand lines (first runs; the others differ in --optimizer, --lr, "
              "--staleness and --seed):\n")
    md.append(command_block(argvs))
    return "\n".join(md) + "\n"


def summary_e3(rows, argvs, setup, seeds):
    md = ["# E3: sparse online learning on SpamAssassin (`sparse-lr`, `--no-shuffle "
          "--progressive`)\n",
          f"One pass in file order, batch 8; progressive accuracy = each batch scored "
          f"before it is learned (on the parameters its pull read), over the whole pass; "
          f"test accuracy on the full held-out split at the end. Cells: {ci_note(seeds)}; "
          "`distinct params` counts the distinct final-parameter hashes over "
          "the seeds.\n",
          "| optimizer | lr | s | progressive accuracy | test accuracy | test loss | "
          "measured tau mean | distinct params | runs |",
          "|---|---|---|---|---|---|---|---|---|"]
    for (opt, s), rs in groups(rows, ["optimizer", "staleness"]).items():
        md.append(f"| {opt} | {rs[0]['lr']} | {s} | {pm(ok_vals(rs, 'progressive_accuracy'))} | "
                  f"{pm(ok_vals(rs, 'test_accuracy'))} | {pm(ok_vals(rs, 'test_loss'))} | "
                  f"{pm(ok_vals(rs, 'staleness_mean'), 2)} | "
                  f"{len(set(ok_vals(rs, 'params_sha256')))} | "
                  f"{len(ok_vals(rs, 'test_accuracy'))}/{len(rs)}{status_note(rs)} |")
    md.append("\nCommand lines (first runs; the others differ in --optimizer, --lr, "
              "--staleness, --workers and --seed):\n")
    md.append(command_block(argvs))
    return "\n".join(md) + "\n"


# ------------------------------------ plots (gnuplot) ----------------------------------

def datablock(name, header, lines):
    return f"${name} << EOD\n# {header}\n" + "\n".join(lines) + "\nEOD\n"


def gp_num(v):
    return "NaN" if v is None or not math.isfinite(v) else f"{v:.6g}"


def run_gnuplot(out, stem, body):
    """Writes stem.gp (data inline) and renders stem.png and stem.svg; returns the paths."""
    paths = []
    script = [f"# gnuplot script written by experiments/run.py; run: gnuplot {stem}.gp\n"]
    script.append(body["data"])
    for term, ext in (("pngcairo noenhanced size 1100,500 font ',10'", "png"),
                      ("svg noenhanced size 1100,500 font ',10'", "svg")):
        script.append(f"set terminal {term}\nset output '{stem}.{ext}'\n")
        script.append(body["plot"])
        script.append("unset multiplot\nset output\n")
        paths.append(out / f"{stem}.{ext}")
    gp = out / f"{stem}.gp"
    gp.write_text("".join(script))
    r = subprocess.run(["gnuplot", gp.name], cwd=str(out), capture_output=True, text=True)
    if r.returncode != 0:
        print(f"gnuplot failed on {gp}: {r.stderr[-500:]}", file=sys.stderr)
        return []
    return paths


def plots_e1(out, rows, setup):
    g = groups(rows, ["workers", "policy"])
    seq = g.get((1, "sequential"), [])
    data = []
    ms = sorted({r["workers"] for r in rows})
    for i, p in enumerate(E1_POLICIES):
        lines = []
        for m in ms:
            rs = seq if m == 1 else g.get((m, p), [])
            av, lv = ok_vals(rs, "test_accuracy"), ok_vals(rs, "test_loss")
            lines.append(f"{m} {gp_num(mean_sd(av)[0])} {gp_num(ci95(av))} "
                         f"{gp_num(mean_sd(lv)[0])} {gp_num(ci95(lv))}")
        data.append(datablock(f"p{i}", f"{p}: M acc acc_ci95 loss loss_ci95", lines))
    seeds = sorted({r["seed"] for r in rows})
    plot = [f"set multiplot layout 1,2 title 'E1: {dataset_of(setup)} MLP, {setup['updates']} "
            f"pushes, exp compute times (M=1: sequential); mean over seeds, {bars_note(seeds)}'",
            "set grid\nset logscale x 2\nset xrange [0.8:20]\nset xtics (1,4,8,16)",
            "set xlabel 'workers M'\nset key bottom left",
            "set ylabel 'test accuracy'",
            "plot " + ", ".join(f"$p{i} using ($1*{1 + 0.03 * (i - 2):.2f}):2:3 with "
                                f"yerrorlines lw 2 title '{p}'"
                                for i, p in enumerate(E1_POLICIES)),
            "set key top left\nset ylabel 'test loss'",
            "plot " + ", ".join(f"$p{i} using ($1*{1 + 0.03 * (i - 2):.2f}):4:5 with "
                                f"yerrorlines lw 2 title '{p}'"
                                for i, p in enumerate(E1_POLICIES))]
    return run_gnuplot(out, "e1_accuracy", {"data": "".join(data),
                                            "plot": "\n".join(plot) + "\n"})


def plots_e2(out, rows, setup):
    paths = []
    g = groups(rows, ["optimizer", "staleness"])
    data = []
    opts = list(E2_OPTIMIZERS)
    for i, opt in enumerate(opts):
        base = {r["seed"]: r for r in g.get((opt, 0), [])}
        lines = []
        for s in setup["staleness"]:
            rel = []
            for r in g.get((opt, s), []):
                b = base.get(r["seed"])
                if (r["status"] == "ok" and b and b["status"] == "ok" and
                        r["updates_to_target"] != "" and b["updates_to_target"] != ""):
                    rel.append(r["updates_to_target"] / b["updates_to_target"])
            lines.append(f"{s} {gp_num(mean_sd(rel)[0])} {gp_num(ci95(rel))}")
        data.append(datablock(f"r{i}", f"{opt}: s relative ci95", lines))
    seeds = sorted({r["seed"] for r in rows})
    plot = ["set multiplot layout 1,1 title 'E2: updates to reach the target, relative to s = 0 "
            f"(points missing: target not reached); mean over seeds, {bars_note(seeds)}'",
            "set grid\nset xlabel 'staleness s (fixed)'\nset ylabel 'updates(s) / updates(0)'",
            "set key top left\nset xrange [-1:17]\nset xtics (0,2,4,8,16)",
            "plot " + ", ".join(f"$r{i} using 1:2:3 with yerrorlines lw 2 pt 7 title '{o}'"
                                for i, o in enumerate(opts)) + ", 1 with lines dt 2 lc 'gray' notitle"]
    paths += run_gnuplot(out, "e2_relative_updates",
                         {"data": "".join(data), "plot": "\n".join(plot) + "\n"})
    # Curves: mean test accuracy (subset) over seeds per update count.
    data, plot = [], ["set multiplot layout 1,%d title 'E2: test accuracy (eval subset) "
                      "vs updates, mean over seeds'" % len(opts),
                      "set grid\nset xlabel 'updates (pushes)'\nset ylabel 'test accuracy'",
                      "set key bottom right\nset yrange [0.2:0.92]"]
    for i, opt in enumerate(opts):
        target = setup["targets"][opt]
        series = []
        for j, s in enumerate(setup["staleness"]):
            rs = [r for r in g.get((opt, s), []) if r["status"] == "ok"]
            by_u = {}
            for r in rs:
                for c in read_curve(Path(r["run_dir"]) / "curve.csv"):
                    by_u.setdefault(int(c["updates"]), []).append(fnum(c["test_accuracy"]))
            lines = [f"{u} {gp_num(statistics.fmean(v))}" for u, v in sorted(by_u.items())]
            data.append(datablock(f"c{i}_{j}", f"{opt} s={s}: updates acc", lines or ["0 NaN"]))
            series.append(f"$c{i}_{j} using 1:2 with lines lw 2 title 's = {s}'")
        plot.append(f"set title '{opt} (lr {E2_OPTIMIZERS[opt]})'")
        plot.append("plot " + ", ".join(series) +
                    f", {target} with lines dt 2 lc 'black' title 'target {target}'")
    paths += run_gnuplot(out, "e2_curves", {"data": "".join(data), "plot": "\n".join(plot) + "\n"})
    return paths


def plots_e3(out, rows, setup):
    paths = []
    g = groups(rows, ["optimizer", "staleness"])
    opts = list(E3_OPTIMIZERS)
    data = []
    for i, opt in enumerate(opts):
        lines = []
        for s in setup["staleness"]:
            rs = g.get((opt, s), [])
            pv, tv = ok_vals(rs, "progressive_accuracy"), ok_vals(rs, "test_accuracy")
            lines.append(f"{s} {gp_num(mean_sd(pv)[0])} {gp_num(ci95(pv))} "
                         f"{gp_num(mean_sd(tv)[0])} {gp_num(ci95(tv))}")
        data.append(datablock(f"a{i}", f"{opt}: s prog prog_ci95 test test_ci95", lines))
    seeds = sorted({r["seed"] for r in rows})
    xt = ",".join(str(s) for s in setup["staleness"])
    plot = ["set multiplot layout 1,2 title 'E3: SpamAssassin sparse-lr, one pass in file order, "
            f"batch 8; mean over seeds, {bars_note(seeds)}'",
            f"set grid\nset xlabel 'staleness s (fixed)'\nset xtics ({xt})",
            f"set xrange [-2:{max(setup['staleness']) + 2}]\nset key bottom left",
            "set ylabel 'progressive accuracy'",
            "plot " + ", ".join(f"$a{i} using 1:2:3 with yerrorlines lw 2 pt 7 title '{o}'"
                                for i, o in enumerate(opts)),
            "set ylabel 'final test accuracy'",
            "plot " + ", ".join(f"$a{i} using 1:4:5 with yerrorlines lw 2 pt 7 title '{o}'"
                                for i, o in enumerate(opts))]
    paths += run_gnuplot(out, "e3_accuracy", {"data": "".join(data),
                                              "plot": "\n".join(plot) + "\n"})
    # Progressive accuracy over the pass, first seed.
    data, plot = [], [f"set multiplot layout 1,{len(opts)} title 'E3: cumulative progressive "
                      "accuracy over the pass (first seed)'",
                      "set grid\nset xlabel 'training examples seen (thousands)'\n"
                      "set key bottom right\nset xtics 1 format '%g'",
                      "set ylabel 'progressive accuracy'\nset yrange [0.5:1]"]
    for i, opt in enumerate(opts):
        series = []
        for j, s in enumerate(setup["staleness"]):
            rs = [r for r in g.get((opt, s), []) if r["status"] == "ok"]
            lines = ["0 NaN"]
            if rs:
                lines = [f"{int(c['samples']) / 1000:g} {gp_num(fnum(c['progressive_accuracy']))}"
                         for c in read_curve(Path(rs[0]["run_dir"]) / "curve.csv")]
            data.append(datablock(f"q{i}_{j}", f"{opt} s={s}: samples prog", lines))
            series.append(f"$q{i}_{j} using 1:2 with linespoints lw 2 title 's = {s}'")
        plot.append(f"set title '{opt} (lr {E3_OPTIMIZERS[opt]})'")
        plot.append("plot " + ", ".join(series))
    paths += run_gnuplot(out, "e3_progressive", {"data": "".join(data),
                                                 "plot": "\n".join(plot) + "\n"})
    return paths


# ---------------------------------------------------------------------------------------

def verify(exp, out, runs, quick):
    """Reads back what was written; returns a list of problems."""
    problems = []
    path = out / f"{exp}_results.csv"
    if not path.exists():
        return [f"{path} missing"]
    with open(path, newline="") as f:
        got = list(csv.DictReader(f))
    keyed = {}
    for r in got:
        keyed[(r["seed"],) + tuple(str(r[k]) for k in runs[0].config)] = r
    for run in runs:
        key = (str(run.seed),) + tuple(str(v) for v in run.config.values())
        r = keyed.get(key)
        if r is None:
            problems.append(f"{exp}: no results row for {run.name}")
            continue
        if r["status"] != "ok":
            if quick or r["status"] != "diverged":
                problems.append(f"{exp}: {run.name} {r['status']}: {r.get('error', '')}")
            continue
        for m in REQUIRED[exp]:
            if not math.isfinite(fnum(r.get(m))):
                problems.append(f"{exp}: {run.name}: metric {m} = {r.get(m)!r} is not finite")
    for name in [f"{exp}_summary.md"]:
        if not (out / name).exists() or (out / name).stat().st_size == 0:
            problems.append(f"{exp}: {name} missing or empty")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment",
                    help="e1 | e2 | e3 | all, or an experiment description file FILE.toml or FILE.yaml "
                         "(a grid of your own: experiments/grid.py, experiments/README.md)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny versions (digits / 320 SpamAssassin rows, one seed): a smoke test")
    ap.add_argument("--out", default=str(REPO / "docs" / "experiments"),
                    help="where results, summaries and plots go (default docs/experiments)")
    ap.add_argument("--seeds", default=None,
                    help="comma-separated seeds (default 1,2,3; --quick: 1)")
    ap.add_argument("--runs-dir", default=None,
                    help="scratch directory for the per-run --out folders (default OUT/runs)")
    ap.add_argument("--resume", action="store_true",
                    help="reuse a run whose manifest.json has the same argv")
    args = ap.parse_args()

    binary = Path(os.environ.get("ONLINEPS_REPLAY") or DEFAULT_BIN)
    if not binary.exists():
        print(f"run.py: {binary} not found (build it, or set ONLINEPS_REPLAY)", file=sys.stderr)
        return 1
    if shutil.which("gnuplot") is None:
        print("run.py: gnuplot not found (apt-get install gnuplot-nox)", file=sys.stderr)
        return 1
    import grid  # experiments/grid.py, next to this file
    if grid.is_description(args.experiment):
        if args.quick or args.seeds:
            print("run.py: --quick and --seeds are for e1-e3; a grid file sets its own seeds",
                  file=sys.stderr)
            return 2
        return grid.main(args.experiment, args, binary, sys.modules[__name__])
    if args.experiment not in ("e1", "e2", "e3", "all"):
        ap.error(f"experiment '{args.experiment}': expected e1, e2, e3, all or a .toml / .yaml file")
    seeds = [int(s) for s in (args.seeds or ("1" if args.quick else "1,2,3")).split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    exps = ["e1", "e2", "e3"] if args.experiment == "all" else [args.experiment]
    setups = {"e1": e1_setup, "e2": e2_setup, "e3": e3_setup}
    problems = []
    total = time.monotonic()
    for exp in exps:
        runs, rows, argvs, timing = run_experiment(exp, args, binary, seeds)
        write_csv(out / f"{exp}_results.csv", rows)
        setup = setups[exp](args.quick)
        if exp == "e1":
            md, plots = summary_e1(rows, argvs, setup, seeds), plots_e1(out, rows, setup)
        elif exp == "e2":
            md, plots = summary_e2(rows, argvs, setup, seeds), plots_e2(out, rows, setup)
        else:
            md, plots = summary_e3(rows, argvs, setup, seeds), plots_e3(out, rows, setup)
        md += "\nPlots: " + ", ".join(f"[{p.name}]({p.name})" for p in plots) + "\n"
        md += (f"\n{runs_line(len(runs), timing)} with {binary.name} "
               f"(commit {next((r.get('commit') for r in rows if r.get('commit')), '?')}).\n")
        (out / f"{exp}_summary.md").write_text(md)
        if not plots:
            problems.append(f"{exp}: plots were not written")
        for p in plots:
            if not p.exists() or p.stat().st_size == 0:
                problems.append(f"{exp}: plot {p} missing or empty")
        problems += verify(exp, out, runs, args.quick)
        print(f"[{exp}] done: {runs_line(len(runs), timing)}; wrote {out}/{exp}_results.csv, "
              f"{exp}_summary.md, {len(plots)} plots", file=sys.stderr, flush=True)
    print(f"run.py: {' '.join(exps)} finished in {time.monotonic() - total:.0f} s",
          file=sys.stderr)
    if problems:
        for p in problems:
            print("run.py: FAILED: " + p, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
