"""Training loop that hands a metric to a background thread every few steps.

Terra features / hard spots: `threading.Thread` started inside the loop reading a tensor computed
in this iteration (other threads are not intercepted, so the iteration leaves co-execution before
the thread starts and the thread sees a real tensor); the thread's result is joined and printed.
"""
import threading

import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(48, 4), torch.randint(0, 2, (48,))
    reports = []
    for step in range(24):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 8 == 7:
            worker = threading.Thread(
                target=lambda l=logits: reports.append(float((l.argmax(1) == y).float().mean())))
            worker.start()
            worker.join()
            print(f"step {step} loss {loss.item():.6f} accuracy {reports[-1]:.4f}")
    return dict(model.state_dict(keep_vars=True))


if __name__ == "__main__":
    main()
