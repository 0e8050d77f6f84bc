"""sklearn's 8x8 digits (the copy Debian's python3-sklearn ships), split the same way by
export.py and online.py: standard library only, so any python3 runs it."""
import csv
import gzip
import random

DIGITS_CSV = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
SEED = 20261206
STREAM = 1000  # the online stream; the other 797 examples are the test set


def load():
    """(stream, test): lists of (64 pixel values 0..16, label 0..9)."""
    with gzip.open(DIGITS_CSV, "rt") as f:
        rows = [(list(map(float, r[:64])), int(float(r[64]))) for r in csv.reader(f) if r]
    order = list(range(len(rows)))
    random.Random(SEED).shuffle(order)
    rows = [rows[i] for i in order]
    return rows[:STREAM], rows[STREAM:]
