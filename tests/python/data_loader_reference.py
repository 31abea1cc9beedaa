#!/usr/bin/python3
"""What PyTorch's DataLoader(dataset, batch_size=B, sampler=DistributedSampler(...)) yields, epoch by
epoch with set_epoch, for a data set whose item i is i: the batches of indices each rank sees.

tests/libddp/data_loader_test.cc compares ddp::DataLoaderSampler under torch::data::make_data_loader
(with worker threads) against every case printed here, as JSON:
{"torch_version": str, "cases": [{"n", "world", "rank", "seed", "shuffle", "drop_last", "batch_size",
"epochs": [[[indices of batch 0], ...] per epoch]}]}
"""
import itertools
import json

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Indices(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def case(n, world, seed, shuffle, drop_last, batch_size):
    out = []
    for rank in range(world):
        sampler = DistributedSampler(Indices(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
                                     drop_last=drop_last)
        loader = DataLoader(Indices(n), batch_size=batch_size, sampler=sampler)
        epochs = []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            epochs.append([batch.tolist() for batch in loader])
        out.append({"n": n, "world": world, "rank": rank, "seed": seed, "shuffle": shuffle,
                    "drop_last": drop_last, "batch_size": batch_size, "epochs": epochs})
    return out


def main():
    cases = []
    for n, world, seed, shuffle, drop_last, batch_size in itertools.product(
            [23, 64], [1, 3], [0, 7], [True, False], [False, True], [4, 5]):
        cases.extend(case(n, world, seed, shuffle, drop_last, batch_size))
    print(json.dumps({"torch_version": torch.__version__, "cases": cases}))


if __name__ == "__main__":
    main()
