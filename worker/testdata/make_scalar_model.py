"""Writes scalar_param.pt: a TorchScript model with a 0-dim trainable parameter.

Linear(4, 3) named `out` and a temperature `temp` = 1.5 (a 0-dim nn.Parameter, as a
logit scale or a temperature usually is); forward(x) -> out(x) * temp, logits [B, 3].
Run with Debian's /usr/bin/python3 (python3-torch) from anywhere:
/usr/bin/python3 worker/testdata/make_scalar_model.py
"""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_model import write_scripted  # noqa: E402


class ScalarModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(4, 3)
        self.temp = nn.Parameter(torch.tensor(1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x) * self.temp


if __name__ == "__main__":
    write_scripted(ScalarModel, "scalar_param.pt", 20261207)
