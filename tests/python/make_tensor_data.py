"""Writes small data sets the way a PyTorch user saves tensors, for data.name: tensors.

    python make_tensor_data.py DIR

DIR/float_{train,test}.pt: x float32 [N, 1, 8, 8], y int64 from a fixed rule (a linear map of
4x4 block means: learnable by both models).
DIR/bytes_{train,test}.pt: x uint8 [N, 3, 8, 8], y int32 (widened by the reader), same rule.
DIR/features_train.pt: x float64 [N, 20], y int64.
DIR/mismatch.pt: x 10 samples, y 9.  DIR/float_labels.pt: y float.  DIR/list.pt: a list, not a dict.
DIR/reference.json: what Python sees in each file (shapes, dtypes, sums, first labels, a few values).
"""
import json
import sys

import torch


def rule(x, classes, seed=1234):
    """A learnable labelling: a fixed linear map of the means of 4x4 blocks (of the features, for 2-D x)."""
    g = torch.Generator().manual_seed(seed)
    x = x.to(torch.float64)
    f = torch.nn.functional.avg_pool2d(x, 4).reshape(len(x), -1) if x.dim() == 4 else x
    w = torch.randn(f.shape[1], classes, generator=g, dtype=torch.float64)
    return (f @ w).argmax(1)


def main():
    out = sys.argv[1]
    g = torch.Generator().manual_seed(7)
    ref = {}

    def save(name, x, y, **extra):
        torch.save({"x": x, "y": y, **extra}, f"{out}/{name}.pt")
        ref[name] = {"x_shape": list(x.shape), "x_dtype": str(x.dtype), "x_sum": float(x.to(torch.float64).sum()),
                     "y_first": [int(v) for v in y[:10]], "y_sum": int(y.to(torch.int64).sum()),
                     "x_first": [float(v) for v in x.flatten()[:16].to(torch.float64)]}

    for split, n in (("train", 1024), ("test", 256)):
        x = torch.randn(n, 1, 8, 8, generator=g)
        save(f"float_{split}", x, rule(x, 4))
        xb = torch.randint(0, 256, (n, 3, 8, 8), generator=g, dtype=torch.uint8)
        save(f"bytes_{split}", xb, rule(xb.float() / 255 - 0.5, 5).to(torch.int32), note="extra keys are ignored")
    xf = torch.randn(64, 20, generator=g, dtype=torch.float64)
    save("features_train", xf, rule(xf, 3))
    torch.save({"x": torch.zeros(10, 4), "y": torch.zeros(9, dtype=torch.long)}, f"{out}/mismatch.pt")
    torch.save({"x": torch.zeros(10, 4), "y": torch.zeros(10)}, f"{out}/float_labels.pt")
    torch.save([torch.zeros(3)], f"{out}/list.pt")
    with open(f"{out}/reference.json", "w") as f:
        json.dump(ref, f)


if __name__ == "__main__":
    main()
