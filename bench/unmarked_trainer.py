"""A training loop in a module of its own, as a library's (a Trainer.train) is: `terra.run` marks
the loops of the run function's file only, so none of this one's (bench/epoch_loop.py --shape
library)."""


def train(model, opt, loss_fn, batches, epochs):
    for epoch in range(epochs):
        for x, y in batches:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
    return loss
