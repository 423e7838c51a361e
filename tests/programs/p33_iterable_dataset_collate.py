"""An IterableDataset read by two worker processes, with a custom `collate_fn`.

Terra features / hard spots: each worker yields its own shard (`get_worker_info`), batches are
built by a user collate function (a dict of tensors plus a Python list of ids) in the worker and
rebuilt from shared memory in the program's process; `pin_memory=True` (a no-op without a GPU,
with a warning); the last batch of each epoch is smaller (a new shape: a new path).
"""
import warnings

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class Shards(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if info else (0, 1)
        g = torch.Generator().manual_seed(7)
        x = torch.randn(self.n, 6, generator=g)
        for i in range(start, self.n, step):
            yield i, x[i], x[i, :2].sum().reshape(1)


def collate(items):
    ids = [i for i, _, _ in items]
    return {"x": torch.stack([x for _, x, _ in items]), "y": torch.stack([y for _, _, y in items])}, ids


def main():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator
        data = DataLoader(Shards(200), batch_size=16, num_workers=2, collate_fn=collate, pin_memory=True)
        model = nn.Sequential(nn.Linear(6, 24), nn.ReLU(), nn.Linear(24, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        seen = 0
        for epoch in range(4):
            for batch, ids in data:
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
                loss.backward()
                opt.step()
                seen += len(ids)
            print(f"epoch {epoch} seen {seen} loss {loss.item():.5f}")
    return {k: v for k, v in model.state_dict().items()}
