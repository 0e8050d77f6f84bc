"""LoRA adapters for a TorchScript model served by onlineps (docs/frozen.md).

LoRALinear(base, r, alpha) wraps an nn.Linear: the base weight and bias are kept and
frozen (requires_grad=False, so an onlineps worker loads them from the model file and
never pushes them), and two trainable matrices are added, lora_A [r, in] (random,
scaled 1/sqrt(in)) and lora_B [out, r] (zeros), so that

    y = x W^T + b + (alpha / r) * (x A^T) B^T

equals the base layer exactly until B learns. Only lora_A and lora_B become PS tables.

    from lora import LoRALinear, freeze
    freeze(model)                                   # every parameter frozen ...
    model.fc1 = LoRALinear(model.fc1, r=4, alpha=8)  # ... then adapters are added
    model.head.weight.requires_grad_(True)          # and what else should learn
    torch.jit.script(model).save("model.pt")
"""
import math

import torch
from torch import nn
from torch.nn import functional as F


class LoRALinear(nn.Module):
    scale: float

    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__()
        if r < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {r}")
        out_features, in_features = base.weight.shape
        self.weight = nn.Parameter(base.weight.detach().clone(), requires_grad=False)
        bias = base.bias if base.bias is not None else torch.zeros(out_features)
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.lora_A = nn.Parameter(torch.randn(r, in_features) / math.sqrt(in_features))
        self.lora_B = nn.Parameter(torch.zeros(out_features, r))
        self.scale = float(alpha) / r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.scale * F.linear(
            F.linear(x, self.lora_A), self.lora_B)


def freeze(module: nn.Module) -> nn.Module:
    """Marks every parameter of `module` frozen (requires_grad=False); returns it."""
    for p in module.parameters():
        p.requires_grad_(False)
    return module
