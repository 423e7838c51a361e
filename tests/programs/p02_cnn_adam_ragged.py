"""Small CNN image classifier trained with Adam; the dataset size is not a multiple of the batch size.

Synthetic 1x12x12 images whose class is the brightest quadrant. The data is reshuffled every epoch
with `torch.randperm`, and the last batch of each epoch has 4 samples instead of 16.

Terra features / hard spots: CNN training (Conv2d, MaxPool2d, AdaptiveAvgPool2d, Flatten); Adam
(step counters as 0-d tensors, exp_avg / exp_avg_sq in place); a ragged last batch (shape change at
the end of every epoch); randperm (RNG order); `torch.no_grad()` evaluation between epochs with
`.item()` fetches of the accuracy.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def make_images(n):
    x = 0.3 * torch.randn(n, 1, 12, 12)
    labels = torch.randint(0, 4, (n,))
    for i in range(n):
        q = int(labels[i])
        r, c = divmod(q, 2)
        x[i, 0, r * 6:(r + 1) * 6, c * 6:(c + 1) * 6] += 1.0
    return x, labels


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(2)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 4, 4))

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = F.relu(self.conv2(x))
        return self.head(self.gap(x))


def main():
    torch.manual_seed(0)
    x, labels = make_images(100)
    x_val, labels_val = make_images(40)
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    batch_size = 16

    for epoch in range(4):
        model.train()
        perm = torch.randperm(x.shape[0])
        total = 0.0
        for step, start in enumerate(range(0, x.shape[0], batch_size)):
            idx = perm[start:start + batch_size]
            xb, yb = x[idx], labels[idx]
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * xb.shape[0]
            if step % 3 == 0:
                print(f"epoch {epoch} step {step} batch {xb.shape[0]} loss {loss.item():.5f}")
        with torch.no_grad():
            pred = model(x_val).argmax(dim=1)
            acc = (pred == labels_val).float().mean().item()
        print(f"epoch {epoch} train loss {total / x.shape[0]:.5f} val acc {acc:.4f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return state


if __name__ == "__main__":
    main()
