"""Exports the frozen-backbone example models of docs/frozen.md. Run with Debian's
/usr/bin/python3, which has python3-torch (online.py runs it when the files are missing):

  /usr/bin/python3 examples/frozen_head/export.py --out build/frozen_head

- digits_head.pt: a small CNN backbone (the 8x8 image through Conv2d(1, 16, 3)-ReLU-
  Conv2d(16, 32, 3)-ReLU-MaxPool(2), then fc0 Linear(512, 512)-ReLU-fc1 Linear(512,
  512)-ReLU) pretrained on the digits 0-4 of the stream (the "pretraining task"), saved frozen
  (requires_grad=False), and a fresh head Linear(512, 10) for all ten digits. Served
  as is, only the head learns; with --trainable '*' the same file is full fine-tuning.
- digits_lora4.pt, digits_lora8.pt: the same backbone and head with a rank-4 / rank-8
  LoRA adapter (lora.py, alpha = 2r) on each of the backbone's two 512 x 512 linears
  fc0 and fc1: the adapters and the head learn; the convolutions stay as they are.

The module takes raw pixel values (0..16) and scales them itself. Deterministic: fixed
seeds and PYTHONHASHSEED, so the same torch version writes the same bytes.
"""
import argparse
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import digits  # noqa: E402
from lora import LoRALinear, freeze  # noqa: E402

WIDTH = 512


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv1 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc0 = nn.Linear(32 * 4 * 4, WIDTH)
        self.fc1 = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        image = (x / 16.0).view(-1, 1, 8, 8)
        h = torch.relu(self.conv1(torch.relu(self.conv0(image))))
        h = torch.flatten(torch.max_pool2d(h, 2), 1)
        return torch.relu(self.fc1(torch.relu(self.fc0(h))))


class Net(nn.Module):
    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def pretrain(backbone: Backbone) -> float:
    """Trains backbone + a throwaway 5-class head on the stream's digits 0-4; returns the
    training accuracy."""
    rows = [(x, y) for x, y in digits.load()[0] if y < 5]
    x = torch.tensor([r[0] for r in rows])
    y = torch.tensor([r[1] for r in rows])
    net = Net(backbone, nn.Linear(WIDTH, 5))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(40):
        for i in range(0, len(rows), 32):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x[i:i + 32]), y[i:i + 32]).backward()
            opt.step()
    with torch.no_grad():
        return (net(x).argmax(1) == y).float().mean().item()


def save(module: nn.Module, out: str, name: str) -> None:
    path = os.path.join(out, name)
    torch.jit.script(module).save(path)
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in module.parameters() if not p.requires_grad)
    print(f"wrote {name}: {trainable} trainable + {frozen} frozen floats "
          f"({os.path.getsize(path)} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description="Writes the example models of docs/frozen.md")
    parser.add_argument("--out", default=HERE, help="folder to write the .pt files to")
    out = parser.parse_args().out
    os.makedirs(out, exist_ok=True)
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    torch.manual_seed(digits.SEED)
    backbone = Backbone()
    print(f"pretrained the backbone on digits 0-4: train accuracy {pretrain(backbone):.3f}")
    freeze(backbone)
    head = nn.Linear(WIDTH, 10)
    save(Net(backbone, head), out, "digits_head.pt")
    for r in (4, 8):
        adapted = Backbone()
        adapted.load_state_dict(backbone.state_dict())
        freeze(adapted)
        adapted.fc0 = LoRALinear(adapted.fc0, r=r, alpha=2.0 * r)
        adapted.fc1 = LoRALinear(adapted.fc1, r=r, alpha=2.0 * r)
        save(Net(adapted, head), out, f"digits_lora{r}.pt")


if __name__ == "__main__":
    main()
