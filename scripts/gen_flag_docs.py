#!/usr/bin/env python3
"""Rewrites the `--help` blocks of docs/configuration.md ("Flags of each binary") from the
binaries themselves, so that the documented flags, defaults and ranges are the real ones.

    python3 scripts/gen_flag_docs.py [--bin build/bin] [--check]

--check changes nothing and exits 1 when a block differs from what the binaries print
(tests/system/ops_cli_test.py runs it). Each block is the first ``` fence after its
heading; the program name in "Usage:" lines is printed without its directory.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "configuration.md")

# heading prefix -> the commands whose --help output, in order, makes the block
BLOCKS = [
    ("### onlineps_ps ", [["onlineps_ps"]]),
    ("### onlineps_ps_cli ", [["onlineps_ps_cli"]] + [
        ["onlineps_ps_cli", sub] for sub in
        ["curve-keygen", "demo", "push-pattern", "pull", "info", "checkpoint"]]),
    ("### onlineps_worker ", [["onlineps_worker"]]),
    ("### onlineps_worker_cli ", [["onlineps_worker_cli"]]),
    ("### onlineps_mcp_bridge ", [["onlineps_mcp_bridge"]]),
    ("### onlineps_replay ", [["onlineps_replay"]]),
]


def help_text(bin_dir, argv):
    exe = os.path.join(bin_dir, argv[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONLINEPS_")}
    r = subprocess.run([exe] + argv[1:] + ["--help"], capture_output=True, text=True,
                       timeout=60, env=env)
    if r.returncode != 0:
        sys.exit(f"gen_flag_docs: {' '.join(argv)} --help exited {r.returncode}:\n{r.stderr}")
    # "Usage: /path/to/onlineps_ps [OPTIONS]" -> "Usage: onlineps_ps [OPTIONS]"
    return re.sub(r"^Usage: \S*/(onlineps_\w+)", r"Usage: \1", r.stdout, flags=re.M)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    doc = open(DOC).read()
    stale = []
    for heading, commands in BLOCKS:
        at = doc.find("\n" + heading)
        if at < 0:
            sys.exit(f"gen_flag_docs: no heading '{heading.strip()}' in {DOC}")
        start = doc.index("```\n", at) + 4
        end = doc.index("```", start)
        text = "\n".join(help_text(args.bin, c).rstrip("\n") + "\n" for c in commands)
        if doc[start:end] != text:
            stale.append(heading.strip("# ").strip())
            doc = doc[:start] + text + doc[end:]
    if args.check:
        if stale:
            print("gen_flag_docs: out of date in docs/configuration.md: " + ", ".join(stale) +
                  " (run python3 scripts/gen_flag_docs.py)")
            return 1
        return 0
    with open(DOC, "w") as f:
        f.write(doc)
    print("gen_flag_docs: rewrote " + (", ".join(stale) if stale else "nothing (up to date)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
