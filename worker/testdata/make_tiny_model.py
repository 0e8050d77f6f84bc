"""Writes tiny_model.pt: the TorchScript test model of worker/torchscript_model.cc.

EmbeddingBag(1000, 8, mean) named `embed` + Linear(8, 3) named `out`;
forward(ids, offsets) -> logits [B, 3]. Run with Debian's /usr/bin/python3
(python3-torch) from this folder: /usr/bin/python3 make_tiny_model.py
"""
import os
import sys

import torch
from torch import nn


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(1000, 8, mode="mean")
        self.out = nn.Linear(8, 3)
        # The worker never reads these 1000 rows (the PS initializes and serves embedding
        # rows), so store one row broadcast to all: the file stays a few KB.
        self.embed.weight = nn.Parameter(torch.randn(1, 8).expand(1000, 8))

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids, offsets))


def write_scripted(make_module, file_name: str, seed: int) -> None:
    """Scripts make_module() under `seed` and saves it as file_name beside this script."""
    # TorchScript writes a module's constants in set order: fix the string hash so the
    # same source gives the same bytes.
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    torch.manual_seed(seed)
    module = torch.jit.script(make_module())
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), file_name)
    module.save(path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    write_scripted(TinyModel, "tiny_model.pt", 20261202)
