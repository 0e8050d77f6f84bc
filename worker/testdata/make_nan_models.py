"""Writes two TorchScript models whose file holds a NaN parameter value.

A frozen Linear(4, 4) `backbone` (requires_grad=False) under a trainable Linear(4, 3)
`head`; forward(x [B, 4]) -> head(backbone(x)), logits [B, 3]. In nan_frozen.pt one
backbone weight is NaN, in nan_trainable.pt one head weight is. Run with Debian's
/usr/bin/python3 (python3-torch) from anywhere:
/usr/bin/python3 worker/testdata/make_nan_models.py
"""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_model import write_scripted  # noqa: E402


class Net(nn.Module):
    def __init__(self, nan_in: str) -> None:
        super().__init__()
        self.backbone = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)
        with torch.no_grad():
            getattr(self, nan_in).weight[1, 2] = float("nan")
        for p in self.backbone.parameters():
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


if __name__ == "__main__":
    write_scripted(lambda: Net("backbone"), "nan_frozen.pt", 20261210)
    write_scripted(lambda: Net("head"), "nan_trainable.pt", 20261210)
