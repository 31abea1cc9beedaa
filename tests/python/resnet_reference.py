#!/usr/bin/env python3
"""The reference for tests/worker/resnet_test.cc: torchvision's own ResNets (the pinned torchvision).

  resnet_reference.py keys CLASSES                 -> JSON {depth: {name: shape}} of resnet18/34/50's state_dict
  resnet_reference.py step DEPTH WEIGHTS BATCH OUT -> torchvision's DEPTH(num_classes=C) with WEIGHTS loaded
      (load_state_dict(strict=True)), one training-mode forward + cross-entropy backward on BATCH's
      x, y, then an eval-mode forward; OUT (torch.save): logits, loss, grad.<param>, buffer.<name>
      (after the training forward), eval_logits.
"""
import json
import sys

import torch
import torch.nn.functional as F
import torchvision


def main():
    torch.manual_seed(0)
    if sys.argv[1] == "keys":
        classes = int(sys.argv[2])
        out = {}
        for depth in ("resnet18", "resnet34", "resnet50"):
            model = getattr(torchvision.models, depth)(num_classes=classes)
            out[depth] = {k: list(v.shape) for k, v in model.state_dict().items()}
        print(json.dumps(out))
        return
    depth, weights, batch, out = sys.argv[2:6]
    state = torch.load(weights)
    classes = state["fc.weight"].shape[0]
    model = getattr(torchvision.models, depth)(num_classes=classes)
    model.load_state_dict(state, strict=True)
    data = torch.load(batch)
    model.train()
    logits = model(data["x"])
    loss = F.cross_entropy(logits, data["y"])
    loss.backward()
    result = {"logits": logits.detach(), "loss": loss.detach()}
    for name, p in model.named_parameters():
        result["grad." + name] = p.grad
    for name, b in model.named_buffers():
        result["buffer." + name] = b
    model.eval()
    with torch.no_grad():
        result["eval_logits"] = model(data["x"])
    torch.save(result, out)


if __name__ == "__main__":
    main()
