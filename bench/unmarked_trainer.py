"""A training loop in a module of its own, as a library's (a Trainer.train) is: `terra.run` marks
the loops of the run function's file only, so none of this one's (bench/epoch_loop.py --shape
library)."""


def step(model, opt, loss_fn, x, y):
    """One training step (bench/epoch_loop.py's own loop calls it too)."""
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


def train(model, opt, loss_fn, batches, epochs):
    for epoch in range(epochs):
        for x, y in batches:
            loss = step(model, opt, loss_fn, x, y)
    return loss
