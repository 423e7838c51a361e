"""Bag-of-words sentence classifier: nn.Embedding + masked mean + linear, cross-entropy, Adagrad.

Sentences are generated with Python's `random` from two small topic vocabularies; each step the
token ids and labels are Python lists turned into tensors with `torch.tensor(list)` (padded to a
fixed length with a padding id).

Terra features / hard spots: an embedding + cross-entropy classifier; `torch.tensor(python_list)`
built every step (tensor feeds whose contents change every step); Python `random` for data; Adagrad
(state_sum and step); a padding mask built from a comparison; `nn.Embedding(padding_idx=0)`.
"""
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

SPORT = ["ball", "goal", "team", "match", "score", "coach", "league", "win"]
TECH = ["code", "chip", "data", "model", "cloud", "bug", "server", "byte"]
COMMON = ["the", "a", "of", "and", "today", "new"]
VOCAB = ["<pad>"] + SPORT + TECH + COMMON
WORD_ID = {w: i for i, w in enumerate(VOCAB)}
MAX_LEN = 8


def make_sentence():
    label = random.randrange(2)
    topic = SPORT if label == 0 else TECH
    n = random.randint(3, MAX_LEN)
    words = [random.choice(topic) if random.random() < 0.6 else random.choice(COMMON) for _ in range(n)]
    return words, label


def encode(words):
    ids = [WORD_ID[w] for w in words]
    return ids + [0] * (MAX_LEN - len(ids))


class BowClassifier(nn.Module):
    def __init__(self, vocab, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.fc = nn.Linear(dim, 2)

    def forward(self, ids):
        mask = (ids != 0).float().unsqueeze(-1)
        h = (self.emb(ids) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return self.fc(torch.tanh(h))


def main():
    torch.manual_seed(0)
    random.seed(0)
    model = BowClassifier(len(VOCAB))
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)
    batch_size = 16
    correct_history = []
    for epoch in range(3):
        for step in range(12):
            batch = [make_sentence() for _ in range(batch_size)]
            ids = torch.tensor([encode(words) for words, _ in batch])
            labels = torch.tensor([label for _, label in batch])
            logits = model(ids)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct = int((logits.argmax(dim=1) == labels).sum())
            correct_history.append(correct)
            if step % 4 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.5f} correct {correct}/{batch_size}")

    test_words = ["the", "team", "score", "a", "goal"]
    with torch.no_grad():
        probs = F.softmax(model(torch.tensor([encode(test_words)])), dim=1)
    print("p(tech | sport sentence) =", round(probs[0, 1].item(), 5))

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state["correct_history"] = torch.tensor(correct_history)
    state["probs"] = probs
    return state


if __name__ == "__main__":
    main()
