"""CNN + MLP head with BatchNorm2d / BatchNorm1d, switching `train()` / `eval()` every epoch.

Each epoch trains in `train()` mode (batch statistics, running stats updated in place,
`num_batches_tracked` incremented), then evaluates in `eval()` mode under `torch.no_grad()` (running
statistics used, nothing updated). One BatchNorm1d uses `momentum=None` (cumulative moving average,
whose factor depends on `num_batches_tracked`).

Terra features / hard spots: BatchNorm with `train()`/`eval()` switching mid-program and
`torch.no_grad()` evaluation between epochs (same modules, different ops and no autograd); buffers
mutated in place; RMSprop with momentum and centered=True; the training/eval accuracy as Python
floats.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn2d = nn.BatchNorm2d(8)
        self.fc1 = nn.Linear(8 * 4 * 4, 32)
        self.bn1d = nn.BatchNorm1d(32, momentum=None)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn2d(self.conv(x))), 2)
        x = F.relu(self.bn1d(self.fc1(x.flatten(1))))
        return self.fc2(x)


def make_data(n):
    labels = torch.randint(0, 3, (n,))
    x = torch.randn(n, 1, 8, 8)
    x[labels == 0, :, :4] += 1.0
    x[labels == 1, :, 4:] += 1.0
    x[labels == 2, :, :, :4] -= 1.0
    return x, labels


def main():
    torch.manual_seed(0)
    x, labels = make_data(128)
    x_val, labels_val = make_data(48)
    model = BNNet()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3, momentum=0.5, centered=True)
    batch_size = 16
    for epoch in range(4):
        model.train()
        for step in range(x.shape[0] // batch_size):
            xb = x[step * batch_size:(step + 1) * batch_size]
            yb = labels[step * batch_size:(step + 1) * batch_size]
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 4 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.5f}")
        model.eval()
        with torch.no_grad():
            val_logits = model(x_val)
            val_loss = F.cross_entropy(val_logits, labels_val)
            val_acc = (val_logits.argmax(1) == labels_val).float().mean()
        print(f"epoch {epoch} val loss {val_loss.item():.5f} acc {val_acc.item():.4f} "
              f"bn running_mean[0] {model.bn2d.running_mean[0].item():.5f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return state


if __name__ == "__main__":
    main()
