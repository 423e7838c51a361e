"""Keras-style training loop with callbacks that keep Python lists and dicts of floats.

Callbacks: `History` (list of per-step loss floats and a dict of per-epoch metrics), `BestKeeper`
(best-so-far validation loss and a cloned copy of the best parameters), `LRLogger` (reads
`param_group['lr']`), and a gradient-norm monitor that reads `p.grad` after backward. An
ExponentialLR scheduler decays the learning rate per epoch.

Terra features / hard spots: callbacks keeping Python lists and dicts of floats (`.item()` fetches
every step); reading `p.grad` from Python; cloning parameters into a Python dict (`.detach().clone()`)
and restoring them at the end with `load_state_dict` (copy_ into parameters); SGD with momentum;
an ExponentialLR scheduler.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Callback:
    def on_step_end(self, trainer, step, logs):
        pass

    def on_epoch_end(self, trainer, epoch, logs):
        pass


class History(Callback):
    def __init__(self):
        self.losses = []
        self.epochs = {}

    def on_step_end(self, trainer, step, logs):
        self.losses.append(logs["loss"])

    def on_epoch_end(self, trainer, epoch, logs):
        self.epochs[epoch] = dict(logs)


class BestKeeper(Callback):
    def __init__(self):
        self.best = {"val_loss": float("inf"), "epoch": -1}
        self.state = None

    def on_epoch_end(self, trainer, epoch, logs):
        if logs["val_loss"] < self.best["val_loss"]:
            self.best = {"val_loss": logs["val_loss"], "epoch": epoch}
            self.state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
            print(f"  new best at epoch {epoch}: {logs['val_loss']:.5f}")


class LRLogger(Callback):
    def __init__(self):
        self.lrs = []

    def on_epoch_end(self, trainer, epoch, logs):
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])


class GradNormMonitor(Callback):
    def __init__(self):
        self.max_norm = 0.0

    def on_step_end(self, trainer, step, logs):
        total = sum(float(p.grad.pow(2).sum()) for p in trainer.model.parameters())
        self.max_norm = max(self.max_norm, total ** 0.5)


class Trainer:
    def __init__(self, model, optimizer, scheduler, callbacks):
        self.model, self.optimizer, self.scheduler, self.callbacks = model, optimizer, scheduler, callbacks

    def fit(self, train, val, epochs, batch_size):
        x, y = train
        for epoch in range(epochs):
            self.model.train()
            for step in range(x.shape[0] // batch_size):
                xb = x[step * batch_size:(step + 1) * batch_size]
                yb = y[step * batch_size:(step + 1) * batch_size]
                loss = F.cross_entropy(self.model(xb), yb)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                logs = {"loss": loss.item()}
                for cb in self.callbacks:
                    cb.on_step_end(self, step, logs)
            self.scheduler.step()
            self.model.eval()
            with torch.no_grad():
                val_loss = F.cross_entropy(self.model(val[0]), val[1]).item()
            logs = {"val_loss": val_loss, "lr": self.optimizer.param_groups[0]["lr"]}
            for cb in self.callbacks:
                cb.on_epoch_end(self, epoch, logs)
            print(f"epoch {epoch} val_loss {val_loss:.5f}")


def main():
    torch.manual_seed(0)
    x = torch.randn(200, 8)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.85)
    history, best, lrs, grads = History(), BestKeeper(), LRLogger(), GradNormMonitor()
    trainer = Trainer(model, optimizer, scheduler, [history, best, lrs, grads])
    trainer.fit((x[:160], y[:160]), (x[160:], y[160:]), epochs=8, batch_size=20)
    print(f"best {best.best}, lrs {[round(v, 5) for v in lrs.lrs]}, max grad norm {grads.max_norm:.5f}")
    print(f"last losses {[round(v, 5) for v in history.losses[-3:]]}")
    model.load_state_dict(best.state)

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state["history"] = torch.tensor(history.losses, dtype=torch.float64)
    state["val_history"] = torch.tensor([history.epochs[e]["val_loss"] for e in sorted(history.epochs)],
                                        dtype=torch.float64)
    return state


if __name__ == "__main__":
    main()
