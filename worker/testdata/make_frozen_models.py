"""Writes the frozen-backbone test models of tests/worker (docs/frozen.md):

- frozen_head.pt: backbone Linear(6, 8)-ReLU-Linear(8, 8)-ReLU saved with
  requires_grad=False (frozen by default), head Linear(8, 3) (trainable);
- frozen_head_other.pt: the same with other backbone weights (another base hash);
- lora_r2.pt: frozen_head.pt's backbone and head, each backbone Linear wrapped with a
  rank-2 LoRA adapter (lora_A random, lora_B zeros, scale alpha / r): before any learn it
  computes exactly what frozen_head.pt does;
- frozen_jit.pt: frozen_head.pt's model through torch.jit.freeze(preserved_attrs=["head"]):
  the backbone's weights become constants of the code, the head stays parameters.

forward(x [B, 6]) -> logits [B, 3]. Run with Debian's /usr/bin/python3 (python3-torch)
from anywhere: /usr/bin/python3 worker/testdata/make_frozen_models.py
"""
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "frozen_head"))
from lora import LoRALinear, freeze  # noqa: E402  (the documented LoRA wrapper)


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc0 = nn.Linear(6, 8)
        self.fc1 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc1(torch.relu(self.fc0(x))))


class Net(nn.Module):
    def __init__(self, backbone: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def save(module: nn.Module, name: str) -> None:
    path = os.path.join(HERE, name)
    torch.jit.script(module).save(path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != "0":  # same source, same bytes
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    torch.manual_seed(20261206)
    backbone, head = Backbone(), nn.Linear(8, 3)
    freeze(backbone)
    save(Net(backbone, head), "frozen_head.pt")

    other = Backbone()
    freeze(other)
    save(Net(other, head), "frozen_head_other.pt")

    lora = Backbone()
    lora.load_state_dict(backbone.state_dict())
    lora.fc0 = LoRALinear(lora.fc0, r=2, alpha=4.0)
    lora.fc1 = LoRALinear(lora.fc1, r=2, alpha=4.0)
    save(Net(lora, head), "lora_r2.pt")

    folded = torch.jit.freeze(torch.jit.script(Net(backbone, head)).eval(),
                              preserved_attrs=["head"])
    path = os.path.join(HERE, "frozen_jit.pt")
    folded.save(path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
