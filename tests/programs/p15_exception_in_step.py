"""Training loop where Python exceptions are raised in the middle of some steps and caught.

Three kinds of failures, all caught so the loop continues:
- `check_batch` raises ValueError *before* the forward pass when a batch contains an outlier
  (decided from a tensor value: `x.abs().max().item()`);
- `forward_with_guard` raises ValueError *in the middle of the forward pass* (after the first layer
  ran) on a fixed schedule of steps, so ops of a half-finished iteration are abandoned;
- `check_loss` raises a custom `LossSpike` *after* `backward()` but before `optimizer.step()` when
  the loss is above a threshold; the handler zeroes the grads and skips the update.
A `finally:` clause counts attempts on every path.

Terra features / hard spots: a Python exception raised and caught inside the step (state must be
exactly what eager leaves: grads computed by the abandoned backward, no optimizer step); the same
exception type at the same line; data-dependent control flow on fetched values; Adagrad.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LossSpike(Exception):
    pass


def check_batch(x, limit=3.6):
    peak = x.abs().max().item()
    if peak > limit:
        raise ValueError(f"outlier {peak:.3f} in batch")


def forward_with_guard(model, x, step):
    h = F.relu(model[0](x))
    if step % 9 == 4:
        raise ValueError(f"simulated failure at step {step}")
    return model[2](h)


def check_loss(loss, limit):
    if loss.item() > limit:
        raise LossSpike(f"loss {loss.item():.4f} above {limit}")


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    w = torch.randn(6, 1)
    attempts, updates = 0, 0
    errors = {"ValueError": 0, "LossSpike": 0}
    for step in range(45):
        x = torch.randn(16, 6)
        y = x @ w
        if step % 11 == 7:
            y = 4.0 * y  # a corrupted batch: its loss spikes
        try:
            attempts += 1
            check_batch(x)
            pred = forward_with_guard(model, x, step)
            loss = F.mse_loss(pred, y)
            optimizer.zero_grad()
            loss.backward()
            check_loss(loss, limit=2.5)
            optimizer.step()
            updates += 1
        except ValueError as e:
            errors["ValueError"] += 1
            print(f"step {step}: skipped ({e})")
            continue
        except LossSpike as e:
            errors["LossSpike"] += 1
            optimizer.zero_grad()
            print(f"step {step}: no update ({e})")
        finally:
            if step % 15 == 14:
                print(f"step {step}: attempts {attempts} updates {updates} errors {errors}")
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.5f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    for name, p in model.named_parameters():
        if p.grad is not None:
            state[f"grad.{name}"] = p.grad
    state["counts"] = torch.tensor([attempts, updates, errors["ValueError"], errors["LossSpike"]])
    return state


if __name__ == "__main__":
    main()
