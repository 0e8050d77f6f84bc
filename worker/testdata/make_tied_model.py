"""Writes tied_weights.pt: a TorchScript model with one weight under two names.

Linear(3, 3) `a` and Linear(3, 3) `b` whose weight is a's (b.weight = a.weight, as a
language model ties its embedding and output layer); forward(x [B, 3]) ->
b(relu(a(x))), logits [B, 3]. TorchScript lists the tensor twice (a.weight, b.weight).
Run with Debian's /usr/bin/python3 (python3-torch) from anywhere:
/usr/bin/python3 worker/testdata/make_tied_model.py
"""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_model import write_scripted  # noqa: E402


class TiedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


if __name__ == "__main__":
    write_scripted(TiedModel, "tied_weights.pt", 20261209)
