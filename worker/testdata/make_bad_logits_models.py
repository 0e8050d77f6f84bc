"""Writes two TorchScript models whose forward does not return trainable float logits.

Both hold a Linear(4, 3) named `out` and take forward(x [B, 4]) -> [B, 3], the shape the
worker wants, but int_logits.pt returns int64 (out(x) > 0, as a module returning class
decisions would) and detached_logits.pt returns out(x).detach() (no gradient reaches any
parameter). Run with Debian's /usr/bin/python3 (python3-torch) from anywhere:
/usr/bin/python3 worker/testdata/make_bad_logits_models.py
"""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_model import write_scripted  # noqa: E402


class IntLogits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.out(x) > 0).long()


class DetachedLogits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x).detach()


if __name__ == "__main__":
    write_scripted(IntLogits, "int_logits.pt", 20261208)
    write_scripted(DetachedLogits, "detached_logits.pt", 20261208)
