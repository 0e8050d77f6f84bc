"""A grid of onlineps_replay runs from an experiment description file (TOML, or YAML with
the same keys), for `experiments/run.py FILE.toml|FILE.yaml` (experiments/README.md,
"Your own grid"):

    name = "wine-staleness"          # names the outputs: NAME_results.csv, NAME_summary.md, ...
    seeds = [1, 2, 3]                # every configuration runs once per seed

    [fixed]                          # onlineps_replay flags of every run (without "--")
    dataset = "csv:wine.csv"         # a flag without a value: true
    label-column = "cultivar"
    model = "mlp"
    epochs = 10

    [grid]                           # every combination of these values
    workers = [1, 4, 16]
    staleness-policy = ["none", "lr_over_tau", "dc_adaptive"]

    [plot]                           # optional; defaults shown
    x = "workers"                    # the first grid key
    series = "staleness-policy"      # the second grid key (none with one key)
    metrics = ["test_accuracy", "test_loss"]

Outputs under --out: NAME_results.csv (tidy: one row per run, the grid keys as columns,
then seed, status and the metrics), NAME_summary.md (per configuration: runs, and mean ±
sd [95% CI of the mean, Student's t] over seeds of each metric; the command lines), and
NAME_<metric>.png/.svg (mean over seeds against x, one line per series, 95% CI bars).
"""

import itertools
import math
import re
import subprocess
import sys
import tomllib
from pathlib import Path

METRICS = ["test_accuracy", "test_loss", "train_loss", "progressive_accuracy", "staleness_mean",
           "staleness_p99", "pushes", "updates_per_s", "wall_s"]
LABELS = {  # axis labels with units
    "test_accuracy": "test accuracy (fraction correct)",
    "test_loss": "test loss (cross-entropy, nats)",
    "train_loss": "train loss (nats)",
    "progressive_accuracy": "progressive accuracy (fraction correct)",
    "staleness_mean": "measured staleness, mean (pushes)",
    "staleness_p99": "measured staleness, p99 (pushes)",
    "pushes": "pushes applied",
    "updates_per_s": "replay speed (updates/s)",
    "wall_s": "wall time (s)",
}
# The summary's columns (every metric is in the CSV) and their decimals.
SUMMARY = {"test_accuracy": 4, "test_loss": 4, "progressive_accuracy": 4, "staleness_mean": 2,
           "staleness_p99": 1, "wall_s": 2}
RESERVED = {"seed", "out", "run-name", "quiet", "no-plots"}  # the driver sets these
PATH_FLAGS = {"test-file", "model-file", "trace", "data-dir", "bridge-token-file"}


def absolute(key, value, base):
    """A relative file in `value` made absolute against `base` (the description's folder):
    every run works in its own folder."""
    if not isinstance(value, str):
        return value
    for prefix in ("csv:", "npz:", "libsvm:"):
        if key == "dataset" and value.startswith(prefix):
            return prefix + str((base / value[len(prefix):]).resolve())
    if key in PATH_FLAGS and value:
        return str((base / value).resolve())
    return value


class GridError(Exception):
    pass


def replay_flags(binary):
    """The long flags `binary --help` lists (without "--")."""
    text = subprocess.run([str(binary), "--help"], capture_output=True, text=True).stdout
    flags = set()
    for line in text.splitlines():
        for word in line.replace(",", " ").split():
            if word.startswith("--") and len(word) > 2:
                flags.add(word[2:].split("=")[0])
    return flags


def is_description(path):
    """Whether `path` names a description file (by its extension) rather than e1-e3."""
    return path.endswith((".toml", ".yaml", ".yml"))


def read_yaml(f, path):
    """A YAML description: the same keys and values as the TOML form. Only true/false are
    booleans (YAML 1.1 also reads yes/no/on/off as booleans, which would turn
    `csv-header: no` into a missing flag)."""
    try:
        import yaml
    except ImportError:
        raise GridError(f"{path}: YAML descriptions need PyYAML (apt-get install python3-yaml), "
                        "or write the description in TOML")

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:bool",
                                 re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))
    try:
        spec = yaml.load(f, Loader=Loader)
    except yaml.YAMLError as e:
        raise GridError(f"{path}: not valid YAML: {e}")
    if not isinstance(spec, dict):
        raise GridError(f"{path}: the description must be a mapping (name:, seeds:, fixed:, grid:)")
    return spec


def load(path, binary):
    """The parsed and checked description; GridError names what is wrong."""
    try:
        with open(path, "rb") as f:
            spec = tomllib.load(f) if path.endswith(".toml") else read_yaml(f, path)
    except OSError as e:
        raise GridError(f"{path}: {e.strerror}")
    except tomllib.TOMLDecodeError as e:
        raise GridError(f"{path}: not valid TOML: {e}")
    unknown = set(spec) - {"name", "seeds", "fixed", "grid", "plot"}
    if unknown:
        raise GridError(f"{path}: unknown key(s) {sorted(unknown)} (name, seeds, fixed, grid, plot)")
    name = spec.get("name")
    if not isinstance(name, str) or not name or any(c in name for c in "/\\ "):
        raise GridError(f"{path}: 'name' must be a non-empty string without '/' or spaces")
    seeds = spec.get("seeds", [1])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise GridError(f"{path}: 'seeds' must be a non-empty list of integers")
    fixed, grid = spec.get("fixed", {}), spec.get("grid", {})
    if not isinstance(fixed, dict) or not isinstance(grid, dict):
        raise GridError(f"{path}: [fixed] and [grid] must be tables")
    if not grid:
        raise GridError(f"{path}: [grid] is empty: name at least one flag and its values")
    known = replay_flags(binary)
    for table, keys in (("fixed", fixed), ("grid", grid)):
        for k in keys:
            if k in RESERVED:
                raise GridError(f"{path}: [{table}] {k}: set by the driver (use 'seeds' for seeds)")
            if k not in known:
                raise GridError(f"{path}: [{table}] {k}: onlineps_replay has no flag --{k}")
    for k in set(fixed) & set(grid):
        raise GridError(f"{path}: {k} is in both [fixed] and [grid]")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise GridError(f"{path}: [grid] {k} must be a non-empty list of values")
    base = Path(path).resolve().parent
    fixed = {k: absolute(k, v, base) for k, v in fixed.items()}
    grid = {k: [absolute(k, v, base) for v in vs] for k, vs in grid.items()}
    keys = list(grid)
    plot = spec.get("plot", {})
    x = plot.get("x", keys[0])
    series = plot.get("series", keys[1] if len(keys) > 1 else None)
    metrics = plot.get("metrics", ["test_accuracy", "test_loss"])
    for what, k in (("x", x), ("series", series)):
        if k is not None and k not in grid:
            raise GridError(f"{path}: [plot] {what} = '{k}' is not a [grid] key ({keys})")
    for m in metrics:
        if m not in METRICS:
            raise GridError(f"{path}: [plot] metric '{m}' is not one of {METRICS}")
    return {"name": name, "seeds": seeds, "fixed": fixed, "grid": grid, "x": x,
            "series": series, "metrics": metrics}


def flag_args(flags):
    out = []
    for k, v in flags.items():
        if v is True:
            out.append(f"--{k}")
        elif v is not False:
            out += [f"--{k}", str(v)]
    return out


def run_class(r):
    """run.py's Run with the grid's own argv (its flags already hold --mode) and a name
    that is a single path component."""
    class GridRun(r.Run):
        @property
        def name(self):
            return super().name.replace("/", "-").replace(" ", "")

        def argv(self, binary, out):
            return [str(binary)] + self.flags + [
                "--seed", str(self.seed), "--quiet", "--no-plots", "--out", str(out),
                "--run-name", self.name]
    return GridRun


def make_runs(spec, run_cls):
    keys = list(spec["grid"])
    runs = []
    for values in itertools.product(*(spec["grid"][k] for k in keys)):
        config = dict(zip(keys, values))
        flags = flag_args(spec["fixed"]) + flag_args(config)
        if "mode" not in spec["fixed"] and "mode" not in config:
            flags += ["--mode", "logical"]
        for seed in spec["seeds"]:
            runs.append(run_cls(spec["name"], config, seed, flags))
    return runs


def metrics_of(run, manifest, curve):
    res = manifest["result"]
    final = res.get("final", {})
    prog = final.get("progressive_accuracy", -1)
    return {
        "test_accuracy": final.get("test_accuracy", float("nan")),
        "test_loss": final.get("test_loss", float("nan")),
        "train_loss": final.get("train_loss", float("nan")),
        "progressive_accuracy": prog if prog is not None and prog >= 0 else "",
        "staleness_mean": res["staleness"]["mean"],
        "staleness_p99": res["staleness"]["p99"],
        "pushes": res["pushes"],
        "updates_per_s": res["updates_per_s"],
        "wall_s": res["wall_s"],
        "params_sha256": res["params_sha256"][:16],
    }


def summary(spec, rows, argvs, timing, binary, r):
    keys = list(spec["grid"])
    shown = [m for m in SUMMARY if any(x.get(m, "") != "" for x in rows)]
    md = [f"# {spec['name']}\n",
          f"{len(rows)} runs: every combination of {', '.join(keys)} with seeds "
          f"{spec['seeds']}. Cells: {r.ci_note(spec['seeds'])}.\n",
          "| " + " | ".join(keys) + " | runs | " + " | ".join(shown) + " |",
          "|---" * (len(keys) + 1 + len(shown)) + "|"]
    for cfg, rs in r.groups(rows, keys).items():
        ok = len([x for x in rs if x["status"] == "ok"])
        md.append("| " + " | ".join(str(v) for v in cfg) + f" | {ok}/{len(rs)}"
                  f"{r.status_note(rs)} | " +
                  " | ".join(r.pm(r.ok_vals(rs, m), SUMMARY[m]) for m in shown) + " |")
    md.append("\nCommand lines (first runs):\n")
    md.append(r.command_block(argvs))
    md.append(f"{r.runs_line(len(rows), timing)} with {binary.name}.\n")
    return "\n".join(md) + "\n"


def plots(spec, rows, out, r):
    x, series = spec["x"], spec["series"]
    xs = list(dict.fromkeys(spec["grid"][x]))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs)
    pos = {v: (v if numeric else i) for i, v in enumerate(xs)}
    names = list(dict.fromkeys(spec["grid"][series])) if series else [None]
    paths = []
    seeds = spec["seeds"]
    for metric in spec["metrics"]:
        data, lines = [], []
        for i, s in enumerate(names):
            pts = []
            for v in xs:
                rs = [row for row in rows if row[x] == v and (s is None or row[series] == s)]
                vals = r.ok_vals(rs, metric)
                m = r.mean_sd(vals)[0]
                pts.append(f"{pos[v]} {r.gp_num(m)} {r.gp_num(r.ci95(vals))}")
            data.append(r.datablock(f"s{i}", f"{series}={s}: x mean ci95", pts))
            title = f"{series} = {s}" if s is not None else metric
            lines.append(f"$s{i} using 1:2:3 with yerrorlines lw 2 pt 7 title '{title}'")
        xtics = ("" if numeric else
                 "set xtics (" + ", ".join(f"'{v}' {pos[v]}" for v in xs) + ")\n"
                 f"set xrange [-0.5:{len(xs) - 0.5}]\n")
        body = (f"set multiplot layout 1,1 title '{spec['name']}: mean over {len(seeds)} seeds, "
                f"error bars: 95% CI of the mean (t)'\n"
                f"set grid\nset key outside right top\nset xlabel '{x}'\n"
                "set offsets graph 0.05, graph 0.05, graph 0.05, graph 0.05\n"
                f"set ylabel '{LABELS[metric]}'\n{xtics}"
                + ("set logscale x 2\n" if numeric and min(xs) > 0 and max(xs) / min(xs) >= 8
                   else "")
                + "plot " + ", ".join(lines) + "\n")
        paths += r.run_gnuplot(out, f"{spec['name']}_{metric}", {"data": "".join(data),
                                                                 "plot": body})
    return paths


def main(path, args, binary, r):
    """Runs the grid of `path`; returns the exit status (0: every run ok and every output
    written)."""
    try:
        spec = load(path, binary)
    except GridError as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = make_runs(spec, run_class(r))
    r.METRICS[spec["name"]] = metrics_of

    def describe(row):
        if row["status"] != "ok":
            return row["status"] + ": " + row.get("error", "")
        return f"acc {row['test_accuracy']:.4f} loss {row['test_loss']:.4f}"

    rows, argvs, timing = r.run_all(spec["name"], runs, args, binary, describe)
    r.write_csv(out / f"{spec['name']}_results.csv", rows)
    written = plots(spec, rows, out, r)
    md = summary(spec, rows, argvs, timing, binary, r)
    md += "\nPlots: " + ", ".join(f"[{p.name}]({p.name})" for p in written) + "\n"
    (out / f"{spec['name']}_summary.md").write_text(md)
    failed = [row for row in rows if row["status"] != "ok"]
    missing = [p for p in written if not p.exists() or p.stat().st_size == 0]
    print(f"[{spec['name']}] {r.runs_line(len(rows), timing)}; wrote {out}/{spec['name']}"
          f"_results.csv, _summary.md, {len(written)} plots; {len(failed)} run(s) not ok",
          file=sys.stderr)
    if len(written) != 2 * len(spec["metrics"]) or missing:
        print("run.py: FAILED: plots missing", file=sys.stderr)
        return 1
    return 1 if failed else 0
