"""Gated MLP with a custom autograd.Function, a gradient hook and a module forward hook.

Terra features / hard spots: `torch.autograd.Function.apply` (its forward runs eagerly and
untraced in the program's thread; its Python backward runs inside `loss.backward()`); a tensor
hook registered on a weight that records the gradient norm and rescales the gradient, whose list
is printed right after each backward (so the backward, hooks included, must have run at that
point of the program, not later on another thread); a forward hook that counts calls; printing.
"""
import torch
import torch.nn as nn


class ScaledSoftsign(torch.autograd.Function):
    """y = x / (1 + |x|) * scale, with a hand-written backward."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x / (1 + x.abs()) * scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * ctx.scale / (1 + x.abs()) ** 2, None


def main():
    torch.manual_seed(0)
    first, second = nn.Linear(6, 24), nn.Linear(24, 1)
    params = list(first.parameters()) + list(second.parameters())
    optimizer = torch.optim.Adam(params, lr=0.01)
    grad_norms, calls = [], [0]
    second.weight.register_hook(lambda g: grad_norms.append(round(g.norm().item(), 6)) or g * 0.5)
    first.register_forward_hook(lambda module, args, out: calls.__setitem__(0, calls[0] + 1))
    x = torch.randn(64, 6)
    y = (x[:, :1] * 2 - x[:, 1:2]).tanh()
    for step in range(30):
        h = ScaledSoftsign.apply(first(x), 1.5)
        loss = nn.functional.mse_loss(second(h), y)
        optimizer.zero_grad()
        loss.backward()
        seen = len(grad_norms)  # the hook has run exactly once per backward so far
        optimizer.step()
        if step % 6 == 0:
            print(f"step {step} loss {loss.item():.6f} hooks {seen} last norm {grad_norms[-1]} calls {calls[0]}")
    return {"first.weight": first.weight, "first.bias": first.bias, "second.weight": second.weight,
            "second.bias": second.bias, "norms": torch.tensor(grad_norms)}


if __name__ == "__main__":
    main()
