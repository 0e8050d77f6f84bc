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


class ScalarModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(4, 3)
        self.temp = nn.Parameter(torch.tensor(1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x) * self.temp


def main() -> None:
    # As make_tiny_model.py: a fixed seed and string hash give the same bytes each time.
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    torch.manual_seed(20261207)
    module = torch.jit.script(ScalarModel())
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scalar_param.pt")
    module.save(path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
