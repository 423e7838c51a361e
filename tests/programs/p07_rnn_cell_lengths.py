"""Hand-written Elman RNN unrolled in Python over sequences whose lengths come from a Python list.

Task: read a sequence of numbers and predict their sum. Each training step takes a batch of
sequences of one length, taken from the Python list `LENGTHS` (cycled), so the number of unrolled
cell applications differs from step to step.

Terra features / hard spots: a hand-written recurrent loop (an RNN cell applied in a Python `for t in
range(length)` loop, the same source line producing the op at every time step: occurrence counts in
location keys); data-dependent loop counts from a Python list (several paths, each recurring);
parameters as raw `nn.Parameter`s used through `torch.addmm`/`@`; Adam with amsgrad=True;
`clip_grad_norm_` (backprop through time).
"""
import torch
import torch.nn as nn

LENGTHS = [5, 8, 3, 8, 6, 3, 5, 8]


class ElmanRNN(nn.Module):
    def __init__(self, d_in=1, hidden=32):
        super().__init__()
        self.hidden = hidden
        self.w_xh = nn.Parameter(torch.randn(d_in, hidden) * 0.3)
        self.w_hh = nn.Parameter(torch.randn(hidden, hidden) * (1.0 / hidden ** 0.5))
        self.b_h = nn.Parameter(torch.zeros(hidden))
        self.readout = nn.Linear(hidden, 1)

    def cell(self, x_t, h):
        return torch.tanh(x_t @ self.w_xh + torch.addmm(self.b_h, h, self.w_hh))

    def forward(self, x):
        h = torch.zeros(x.shape[0], self.hidden)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return self.readout(h)


def main():
    torch.manual_seed(0)
    model = ElmanRNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3, amsgrad=True)
    batch_size = 16
    step = 0
    for epoch in range(4):
        for i, length in enumerate(LENGTHS):
            x = torch.rand(batch_size, length, 1) - 0.5
            target = x.sum(dim=1)
            pred = model(x)
            loss = ((pred - target) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            if step % 6 == 0:
                print(f"epoch {epoch} seq {i} len {length} loss {loss.item():.6f}")
            step += 1

    with torch.no_grad():
        probe = torch.full((1, 10, 1), 0.1)
        print(f"sum of ten 0.1s predicted as {model(probe).item():.4f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return state


if __name__ == "__main__":
    main()
