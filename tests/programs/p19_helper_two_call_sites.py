"""Consistency-regularized training where a module-level helper is called from several call sites.

`forward_loss(model, x, y)` (module level) is called three times per iteration from different
places: on the clean batch and on an augmented batch inside `train_step`, and from `evaluate`
under `torch.no_grad()`. `smooth_targets` is another module-level helper used at two sites.
The same source lines inside the helpers therefore produce different ops depending on who called
them.

Terra features / hard spots: a helper function defined at module level called from two (here
three) call sites (location keys must include the caller's frames, otherwise the ops collide);
the same op at the same line with and without grad mode; SGD with momentum and weight decay;
KL-divergence consistency loss.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def smooth_targets(y, n_classes, eps):
    return F.one_hot(y, n_classes).float() * (1 - eps) + eps / n_classes


def forward_loss(model, x, y, eps=0.0):
    logits = model(x)
    target = smooth_targets(y, logits.shape[1], eps)
    loss = -(target * F.log_softmax(logits, dim=1)).sum(dim=1).mean()
    return loss, logits


def train_step(model, optimizer, x, y):
    clean_loss, clean_logits = forward_loss(model, x, y, eps=0.1)
    x_aug = x + 0.1 * torch.randn_like(x)
    aug_loss, aug_logits = forward_loss(model, x_aug, y, eps=0.1)
    consistency = F.kl_div(F.log_softmax(aug_logits, dim=1), F.softmax(clean_logits.detach(), dim=1),
                           reduction="batchmean")
    loss = clean_loss + 0.5 * aug_loss + 0.3 * consistency
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def evaluate(model, x, y):
    with torch.no_grad():
        loss, logits = forward_loss(model, x, y)
    return loss.item(), (logits.argmax(1) == y).float().mean().item()


def main():
    torch.manual_seed(0)
    n_classes = 3
    x = torch.randn(180, 6)
    y = torch.bucketize(x[:, 0] + x[:, 1] * x[:, 2], torch.tensor([-0.5, 0.5]))
    model = nn.Sequential(nn.Linear(6, 48), nn.ReLU(), nn.Linear(48, n_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    batch_size = 30
    for epoch in range(5):
        for step in range(150 // batch_size):
            xb = x[step * batch_size:(step + 1) * batch_size]
            yb = y[step * batch_size:(step + 1) * batch_size]
            loss = train_step(model, optimizer, xb, yb)
            if step % 2 == 0:
                print(f"epoch {epoch} step {step} loss {loss:.5f}")
        val_loss, val_acc = evaluate(model, x[150:], y[150:])
        print(f"epoch {epoch} val loss {val_loss:.5f} acc {val_acc:.4f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return state


if __name__ == "__main__":
    main()
