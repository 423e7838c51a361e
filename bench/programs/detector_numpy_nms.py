"""One-stage detector (YOLO-like, 8x8 grid, 2 anchors per cell) on synthetic 32x32 images with
bright squares. Each step, the predicted boxes are moved to NumPy, decoded and suppressed with a
NumPy non-maximum suppression; the surviving false positives (NumPy indices) feed the next part of
the loss as hard negatives (torch.from_numpy every step)."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.programs import _common

NAME = "detector_numpy_nms"
DESCRIPTION = "YOLO-like detector, NumPy decode + NMS each step feeding hard negatives to the loss"
BATCH, IMG, GRID, A = 12, 32, 8, 2
CELL = IMG // GRID


def nms_numpy(boxes, scores, thresh=0.5, top=20):
    order = np.argsort(-scores, kind="stable")[:top]
    keep = []
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = (x2 - x1).clip(0) * (y2 - y1).clip(0)
    while order.size > 0:
        i = order[0]
        keep.append(i)
        xx1 = np.maximum(x1[i], x1[order[1:]])
        yy1 = np.maximum(y1[i], y1[order[1:]])
        xx2 = np.minimum(x2[i], x2[order[1:]])
        yy2 = np.minimum(y2[i], y2[order[1:]])
        inter = (xx2 - xx1).clip(0) * (yy2 - yy1).clip(0)
        iou = inter / (areas[i] + areas[order[1:]] - inter + 1e-9)
        order = order[1:][iou <= thresh]
    return np.array(keep, dtype=np.int64)


class TinyDetector(nn.Module):
    def __init__(self, ch=32):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, ch, 3, padding=1), nn.BatchNorm2d(ch), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(ch, 2 * ch, 3, padding=1), nn.BatchNorm2d(2 * ch), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * ch, 2 * ch, 3, padding=1), nn.BatchNorm2d(2 * ch), nn.ReLU())
        self.head = nn.Conv2d(2 * ch, A * 5, 1)

    def forward(self, x):
        out = self.head(self.backbone(x))  # (b, A*5, G, G)
        return out.view(x.shape[0], A, 5, GRID, GRID).permute(0, 3, 4, 1, 2).reshape(x.shape[0], -1, 5)


def make_data(rng, n):
    imgs = rng.normal(0, 0.3, (n, 1, IMG, IMG)).astype(np.float32)
    targets = np.zeros((n, GRID * GRID * A, 5), dtype=np.float32)  # obj, cx, cy, w, h (cell units)
    for k in range(n):
        for _ in range(rng.integers(1, 4)):
            s = int(rng.integers(4, 10))
            x0, y0 = int(rng.integers(0, IMG - s)), int(rng.integers(0, IMG - s))
            imgs[k, 0, y0:y0 + s, x0:x0 + s] += 1.5
            cx, cy = x0 + s / 2, y0 + s / 2
            gi, gj = int(cy // CELL), int(cx // CELL)
            a = 0 if s < 7 else 1
            idx = (gi * GRID + gj) * A + a
            targets[k, idx] = [1.0, cx / CELL - gj, cy / CELL - gi, s / CELL, s / CELL]
    return imgs, targets


def make(seed=0):
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    imgs, targets = make_data(rng, 128)
    model = TinyDetector()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gy, gx = np.meshgrid(np.arange(GRID), np.arange(GRID), indexing="ij")
    grid = np.repeat(np.stack([gx.ravel(), gy.ravel()], 1), A, axis=0).astype(np.float32)
    state = {"model": model, "opt": opt, "imgs": torch.from_numpy(imgs), "targets": torch.from_numpy(targets),
             "targets_np": targets, "grid": grid, "i": 0, "n_hard": []}
    return _common.register(state, {"model": model}, {"opt": opt})


def step(state):
    i = state["i"]
    n = state["imgs"].shape[0] // BATCH
    sl = slice((i % n) * BATCH, (i % n + 1) * BATCH)
    state["i"] = i + 1
    x, t = state["imgs"][sl], state["targets"][sl]
    pred = state["model"](x)  # (b, cells*A, 5)
    obj_logit = pred[..., 0]
    box = torch.sigmoid(pred[..., 1:3])
    wh = pred[..., 3:5]
    # --- NumPy post-processing: decode, NMS per image, find confident false positives ---
    p = pred.detach().numpy()
    t_np = state["targets_np"][sl]
    hard = np.zeros(p.shape[:2], dtype=np.float32)
    for k in range(p.shape[0]):
        scores = 1.0 / (1.0 + np.exp(-p[k, :, 0]))
        cxy = (state["grid"] + 1.0 / (1.0 + np.exp(-p[k, :, 1:3]))) * CELL
        half = np.exp(np.clip(p[k, :, 3:5], -4, 4)) * CELL / 2
        boxes = np.concatenate([cxy - half, cxy + half], 1)
        keep = nms_numpy(boxes, scores)
        fp = keep[(t_np[k, keep, 0] == 0) & (scores[keep] > 0.3)]
        hard[k, fp] = 1.0
    state["n_hard"].append(int(hard.sum()))
    hard_t = torch.from_numpy(hard)
    # --- loss: objectness, box regression on positives, extra penalty on NMS-surviving FPs ---
    pos = t[..., 0]
    obj_loss = F.binary_cross_entropy_with_logits(obj_logit, pos, weight=1.0 + 2.0 * hard_t)
    box_loss = ((F.mse_loss(box, t[..., 1:3], reduction="none").sum(-1)
                 + F.mse_loss(wh, torch.log(t[..., 3:5].clamp(min=1e-3)), reduction="none").sum(-1)) * pos).sum()
    loss = obj_loss + box_loss / pos.sum().clamp(min=1.0)
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    return loss


def train(state, steps):
    for _ in range(steps):
        step(state)


final_state = _common.final_state


def jit_targets(state):
    return {"model": (state["imgs"][:BATCH],)}
