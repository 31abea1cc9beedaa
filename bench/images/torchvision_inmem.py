# Reference for the in-memory decode: what a PyTorch user writes to hold an ImageFolder split decoded
# and resized in memory: ImageFolder + Resize((S,S)) + PILToTensor through DataLoader(num_workers=N),
# concatenated into one uint8 tensor. Prints seconds (listing + decode + resize) and peak RSS
# (main + largest worker).
import json, resource, sys, time
import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms
root, size, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
splits = sys.argv[4].split(",") if len(sys.argv) > 4 else ["val", "train"]
torch.set_num_threads(1)
t0 = time.perf_counter()
out = {}
for split in splits:
    ds = datasets.ImageFolder(f"{root}/{split}", transform=transforms.Compose([
        transforms.Resize((size, size)), transforms.PILToTensor()]))
    dl = DataLoader(ds, batch_size=64, num_workers=workers)
    xs, ys = zip(*dl)
    out[split] = (torch.cat(xs), torch.cat(ys))
secs = time.perf_counter() - t0
rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
print(json.dumps({"side": "torchvision", "decode_s": secs, "peak_rss_mb": rss,
                  "images": sum(v[0].shape[0] for v in out.values()), "splits": splits,
                  "shape": list(out[splits[-1]][0].shape)}))
