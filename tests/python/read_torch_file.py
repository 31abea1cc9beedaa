"""Reads a file with Python PyTorch's plain torch.load(path) (default
weights_only=True since 2.6) and prints it as JSON: tensors as
{"dtype", "shape", "values"}, containers and scalars as themselves.

usage: read_torch_file.py PATH
"""
import json
import sys

import torch


def as_json(v):
    if isinstance(v, torch.Tensor):
        return {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape),
                "values": v.to(torch.float64).flatten().tolist(), "device": str(v.device),
                "requires_grad": v.requires_grad}
    if isinstance(v, dict):
        return {"__dict__": [[k, as_json(x)] for k, x in v.items()]}
    if isinstance(v, (list, tuple)):
        return [as_json(x) for x in v]
    return v


def main():
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert (major, minor) >= (2, 6), f"the reference must default to weights_only=True, got {torch.__version__}"
    print(json.dumps(as_json(torch.load(sys.argv[1]))))  # no weights_only argument: the default users get


if __name__ == "__main__":
    main()
