#!/usr/bin/env python3
"""frozen_bench: what learning only part of a model buys (issue 22, docs/benchmarks.md).

For the example model of docs/frozen.md (a digits backbone 64-512-512 pretrained on the
digits 0-4, a fresh 10-class head), one fresh cluster per mode, same run: full
fine-tuning (every parameter a PS table) against the head only and LoRA r=4 / r=8 on the
frozen backbone. Each mode learns the same 1000-example stream, one MCP `learn` per
example from one session, and prints learn calls/s, payload bytes pushed per learn
(the worker's own counter), worker + shard CPU per learn, and held-out accuracy after
100, 300 and 1000 examples; then the ratios to full fine-tuning.

  python3 bench/frozen_bench.py [--examples N] [--bin build/bin]   (online.py's flags)
"""
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "examples", "frozen_head"))
import online  # noqa: E402


def main():
    args = online.parse_args(modes="full,head,lora4,lora8")
    results = online.run(args, lambda line: print(f"frozen_bench: {line}", flush=True))
    full = next((r for r in results if r["mode"] == "full"), results[0])
    marks = sorted({n for r in results for n, _ in r["curve"]})
    print()
    print(f"| mode | trainable floats | bytes pushed / learn | fewer bytes than full | "
          f"learns/s | vs full | CPU ms / learn | "
          + " | ".join(f"acc @{n}" for n in marks) + f" | acc @{args.examples} |")
    print("|---" * (8 + len(marks)) + "|")
    for r in results:
        curve = dict(r["curve"])
        print(f"| {r['mode']} | {r['trainable']:,} | {r['bytes_per_learn']:,.0f} | "
              f"{full['bytes_per_learn'] / r['bytes_per_learn']:.1f}x | "
              f"{r['learns_per_s']:.0f} | {r['learns_per_s'] / full['learns_per_s']:.2f}x | "
              f"{r['cpu_ms_per_learn']:.2f} | "
              + " | ".join(f"{curve.get(n, float('nan')):.3f}" for n in marks)
              + f" | {r['after']:.3f} |")


if __name__ == "__main__":
    main()
