"""DataLoader with worker processes over several epochs.

Terra features / hard spots: every batch arrives from a worker process through shared memory and
is rebuilt in the program's process (`torch.empty` + `set_` onto the received Storage): those
storages are inputs of the graph, different objects every batch, never constants. A shuffled,
seeded sampler and `persistent_workers`; the loss is fetched with `.item()` once per epoch.
"""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    x = torch.randn(256, 12)
    y = (x[:, :3].sum(dim=1, keepdim=True) > 0).float()
    data = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, num_workers=2,
                      persistent_workers=True, generator=torch.Generator().manual_seed(1))
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.BCEWithLogitsLoss()
    for epoch in range(5):
        total = torch.zeros(())
        for xb, yb in data:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            total += loss.detach()
        print(f"epoch {epoch} mean loss {total.item() / len(data):.5f}")
    return {k: v for k, v in model.state_dict().items()}
