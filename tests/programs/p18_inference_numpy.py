"""Inference-only evaluation: batched prediction under `torch.inference_mode()` / `torch.no_grad()`
with NumPy post-processing (softmax top-k, confusion matrix, nearest-neighbour retrieval).

A small classifier (with BatchNorm and Dropout, in `eval()` mode) is "pretrained" for a few steps,
then only inference runs: loop 1 under `torch.inference_mode()` computes logits per batch,
converts them with `.numpy()`, and accumulates a confusion matrix and top-2 accuracy in NumPy;
loop 2 under `torch.no_grad()` computes embeddings, finds each query's nearest neighbour with
NumPy, and gathers the neighbours' embeddings back with a tensor index built from the NumPy result.

Terra features / hard spots: an inference-only loop under `torch.no_grad()` and
`torch.inference_mode()` (inference tensors; no autograd recorded); NumPy post-processing of
fetched tensors every step; `torch.from_numpy` feeding a NumPy result back into tensor ops; eval-mode
BatchNorm / Dropout; a ragged last batch (70 queries, batch 16).
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self, d_in=10, hidden=32, n_classes=4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                  nn.Dropout(0.3), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, n_classes)

    def embed(self, x):
        return self.body(x)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    torch.manual_seed(0)
    np.random.seed(0)
    n_classes, d = 4, 10
    centers = torch.randn(n_classes, d) * 2
    y = torch.randint(0, n_classes, (256,))
    x = centers[y] + torch.randn(256, d)
    model = Classifier(d, n_classes=n_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(15):
        idx = torch.randint(0, 256, (32,))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()

    y_test = torch.randint(0, n_classes, (70,))
    x_test = centers[y_test] + 1.5 * torch.randn(70, d)
    batch_size = 16
    confusion = np.zeros((n_classes, n_classes), dtype=np.int64)
    top2_hits = 0
    all_probs = []
    with torch.inference_mode():
        for b, start in enumerate(range(0, x_test.shape[0], batch_size)):
            xb = x_test[start:start + batch_size]
            probs = F.softmax(model(xb), dim=1).numpy()
            labels = y_test[start:start + batch_size].numpy()
            pred = probs.argmax(axis=1)
            np.add.at(confusion, (labels, pred), 1)
            top2 = np.argsort(-probs, axis=1, kind="stable")[:, :2]
            top2_hits += int((top2 == labels[:, None]).any(axis=1).sum())
            all_probs.append(probs)
            print(f"batch {b} size {xb.shape[0]} mean max-prob {probs.max(axis=1).mean():.5f}")
    print("confusion\n", confusion)
    print(f"accuracy {np.trace(confusion) / confusion.sum():.4f} top-2 {top2_hits / 70:.4f}")

    bank = x[:128]
    with torch.no_grad():
        bank_emb = F.normalize(model.embed(bank), dim=1)
        neighbour_labels = []
        gathered = []
        for start in range(0, x_test.shape[0], batch_size):
            q = F.normalize(model.embed(x_test[start:start + batch_size]), dim=1)
            sims = (q @ bank_emb.T).numpy()
            nn_idx = sims.argmax(axis=1)
            neighbour_labels.extend(y[:128][torch.from_numpy(nn_idx)].tolist())
            gathered.append(bank_emb[torch.from_numpy(nn_idx)] * q)
        agreement = torch.cat(gathered).sum(dim=1)
    knn_acc = float(np.mean(np.array(neighbour_labels) == y_test.numpy()))
    print(f"1-NN accuracy {knn_acc:.4f} mean cosine {agreement.mean().item():.5f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    state["confusion"] = torch.from_numpy(confusion)
    state["probs"] = torch.from_numpy(np.concatenate(all_probs))
    state["agreement"] = agreement
    return state


if __name__ == "__main__":
    main()
