"""Training-loop patterns from notebooks, each run eagerly and under Terra and compared value for
value (bitwise): state the program reads back mid-loop (EMA copies, state_dict bytes, running
statistics, buffers, optimizer state), in-place indexing and views, hooks, train/eval switches,
autocast, generators, data-dependent shapes, shape ops, packed RNNs, freezing, exceptions, Python
generators feeding batches, reseeding, spectral and weight norm, gradient penalties, gradient
accumulation, NumPy memory changed from Python. Written in session 43, where they found six engine
bugs (batch_norm's running statistics, indexing beside full slices, NumPy memory saved for the
backward, torch.func transforms, sparse gradients, complex scalars in recorded blocks). Session 44
added gradients cleared (`.grad = None`) between two backwards, by hand for a varying set, and
around a retained graph: those writes run outside the replayed blocks since then. Session 52 added
compilers inside the loop (TorchScript scripting and tracing, torch.compile, torch.fx), an
optimizer stepped in post-accumulate-grad hooks, anomaly mode, forward-mode AD and
parametrizations: scripting raised and a scripted module's backward failed until then."""
import copy
import io
import random
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import terra


def prog_ema(steps=14):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    ema = copy.deepcopy(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(16, 6); y = torch.randn(16, 2)
    out = []
    for i in range(steps):
        loss = F.mse_loss(m(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), m.parameters()):
                pe.data.mul_(0.9).add_(p.data, alpha=0.1)
            for be, b in zip(ema.buffers(), m.buffers()):
                be.copy_(b)
        out.append([t.clone() for t in ema.state_dict().values()] + [loss.detach().clone()])
    return out


def prog_state_dict(steps=12):
    torch.manual_seed(1)
    m = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    x = torch.randn(8, 1, 8, 8); y = torch.randint(0, 3, (8,))
    out = []
    for i in range(steps):
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        buf = io.BytesIO(); torch.save(m.state_dict(), buf)
        out.append(buf.getvalue())
        out.append(m[1].num_batches_tracked.item())
        out.append(opt.state_dict()["state"][0]["exp_avg"].sum().item())
    return out


def prog_norms(steps=12):
    torch.manual_seed(2)
    inorm = nn.InstanceNorm1d(5, affine=True, track_running_stats=True)
    gn = nn.GroupNorm(2, 4)
    bn = nn.BatchNorm1d(5, momentum=None)
    x = torch.randn(3, 5, 7)
    out = []
    for i in range(steps):
        a = inorm(x * (i + 1))
        b = bn(x + i)
        c = gn(torch.randn(2, 4, 3))
        out.append((a.sum().item(), inorm.running_mean.clone(), bn.running_var.numpy().copy(), b.mean().item(), c.sum().item(), bn.num_batches_tracked.item()))
    return out


def prog_rnn(steps=10):
    torch.manual_seed(3)
    lstm = nn.LSTM(4, 6, batch_first=True); emb = nn.Embedding(10, 4, max_norm=1.0)
    opt = torch.optim.RMSprop(list(lstm.parameters()) + list(emb.parameters()), lr=1e-2)
    idx = torch.randint(0, 10, (3, 5))
    out = []
    for i in range(steps):
        h, (hn, cn) = lstm(emb(idx))
        loss = h.pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        out.append((emb.weight.detach().clone(), hn.detach().clone(), emb.weight.norm(dim=1).max().item()))
    return out


class RunningAvg(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)
        self.register_buffer("avg", torch.zeros(5))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
    def forward(self, x):
        y = self.lin(x)
        with torch.no_grad():
            self.avg.mul_(0.9).add_(y.mean(0), alpha=0.1)
            self.count += 1
        return y


def prog_buffers(steps=12):
    torch.manual_seed(4)
    m = RunningAvg(); x = torch.randn(7, 5)
    out = []
    for i in range(steps):
        y = m(x)
        y.sum().backward()
        with torch.no_grad():
            for p in m.parameters():
                p -= 0.01 * p.grad
                p.grad = None
        out.append((m.avg.tolist(), int(m.count), float(m.avg[2]), m.lin.weight.detach()[0, :2].numpy().copy()))
    return out


def prog_inplace_index(steps=12):
    torch.manual_seed(5)
    w = torch.randn(6, 4, requires_grad=True)
    table = torch.zeros(10, 4)
    hist = torch.zeros(10, dtype=torch.long)
    out = []
    for i in range(steps):
        idx = torch.tensor([i % 10, (i * 3) % 10])
        h = (w * 2).tanh()
        table.index_add_(0, idx, h[:2].detach())
        hist.scatter_add_(0, idx, torch.ones(2, dtype=torch.long))
        t = table.clone(); t[t.abs() > 0.5] = 0.0
        loss = (h.sum(1) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w.add_(w.grad, alpha=-0.1); w.grad.zero_()
        out.append((t, hist.tolist(), table[idx].sum().item(), w.detach().clone()))
    return out


def prog_hooks(steps=10):
    torch.manual_seed(6)
    lin = nn.Linear(3, 3)
    seen = []
    lin.weight.register_hook(lambda g: seen.append(g.norm().item()))
    lin.register_forward_hook(lambda mod, i, o: seen.append(o.detach().sum().item()))
    x = torch.randn(4, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    out = []
    for i in range(steps):
        loss = lin(x).pow(2).sum()
        opt.zero_grad(); loss.backward()
        torch.nn.utils.clip_grad_value_(lin.parameters(), 0.5)
        opt.step()
        out.append(lin.weight.detach().clone())
    return out + [seen]


def prog_views(steps=12):
    torch.manual_seed(7)
    p = nn.Parameter(torch.randn(4, 6))
    acc = torch.zeros(4, 6)
    out = []
    for i in range(steps):
        v = p.view(6, 4)
        col = acc[:, 1]
        col.add_(p.detach()[:, 1])
        acc.t()[2].mul_(0.5)
        loss = (v.t() @ v).trace() + p.narrow(1, 0, 3).pow(2).sum()
        loss.backward()
        with torch.no_grad():
            p.sub_(0.01 * p.grad); p.grad = None
        out.append((acc.clone(), col.clone(), p.detach().clone(), acc._version))
    return out


def prog_train_eval(steps=14):
    torch.manual_seed(8)
    m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.2), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x = torch.randn(10, 4); y = torch.randn(10, 1); xv = torch.randn(5, 4)
    out = []
    for i in range(steps):
        m.train()
        loss = F.mse_loss(m(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if i % 3 == 2:
            m[1].reset_running_stats()
        m.eval()
        with torch.no_grad():
            v = m(xv)
        out.append((loss.item(), v.clone(), m[1].running_mean.clone(), m[1].num_batches_tracked.item()))
    return out


def prog_autocast(steps=10):
    torch.manual_seed(9)
    lin = nn.Linear(8, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=0.05)
    x = torch.randn(4, 8)
    out = []
    for i in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = lin(x)
            loss = h.float().pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        out.append((h.detach().clone(), lin.weight.detach().clone()))
    return out


def prog_generator(steps=12):
    g = torch.Generator().manual_seed(10)
    torch.manual_seed(11)
    w = torch.randn(5, 5, requires_grad=True)
    out = []
    for i in range(steps):
        noise = torch.randn(5, 5, generator=g)
        d = F.dropout(w + noise, 0.3)
        idx = torch.multinomial(d.abs().sum(0) + 1e-3, 2)
        loss = d[:, idx].sum()
        loss.backward()
        with torch.no_grad():
            w -= 0.01 * w.grad; w.grad = None
        out.append((idx.tolist(), w.detach().clone(), g.get_state().clone(), torch.get_rng_state().clone()))
    return out


def prog_data_dep(steps=10):
    torch.manual_seed(12)
    w = torch.randn(6, 6, requires_grad=True)
    out = []
    for i in range(steps):
        x = w * (i % 3 + 1) - 0.5
        pos = x[x > 0]
        nz = torch.nonzero(x > 1.0)
        vals, ind = torch.topk(x.flatten(), 3)
        s, order = torch.sort(x[0])
        u = torch.unique((x * 2).round())
        am = x.argmax().item()
        y = torch.where(x > 0, x, 0.1 * x).cumsum(1)
        z = torch.einsum("ij,jk->ik", y, x.t()).clamp(min=-1.0).minimum(x.abs().mean())
        loss = pos.sum() + vals.sum() + z.sum() + y[am // 6].sum()
        loss.backward()
        with torch.no_grad():
            w -= 0.01 * w.grad; w.grad = None
        out.append((pos.detach().clone(), nz, ind, order, u, am, w.detach().clone()))
    return out


def prog_shapes(steps=10):
    torch.manual_seed(13)
    lin = nn.Linear(8, 12)
    opt = torch.optim.Adagrad(lin.parameters(), lr=0.1)
    x = torch.randn(3, 4, 8)
    out = []
    for i in range(steps):
        h = lin(x)
        a, b, c = h.chunk(3, dim=-1)
        parts = h.split([2, 4, 6], dim=-1)
        rows = list(h.unbind(1))
        st = torch.stack(rows[::2], dim=0)
        g = torch.gather(h, 2, torch.arange(4).view(1, 4, 1).expand(3, 4, 1))
        p = F.pad(a, (1, 2), value=0.5)
        att = F.scaled_dot_product_attention(a, b, c, is_causal=True)
        up = F.interpolate(h.transpose(1, 2), scale_factor=2, mode="linear")
        bm = torch.bmm(a, b.mT)
        nz = h.new_zeros(2, 3) + torch.full_like(a[0], 2.0).sum()
        loss = st.sum() + g.sum() + p.pow(2).sum() + att.sum() + up.mean() + bm.sum() + parts[1].sum() + nz.sum()
        opt.zero_grad(); loss.backward(); opt.step()
        out.append((loss.detach().clone(), lin.weight.detach().clone(), opt.state_dict()["state"][0]["sum"].clone()))
    return out


def prog_rnn_packed(steps=8):
    torch.manual_seed(14)
    gru = nn.GRU(3, 5, batch_first=True)
    opt = torch.optim.SGD(gru.parameters(), lr=0.1, nesterov=True, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(4, 6, 3); lengths = torch.tensor([6, 5, 3, 2])
    out = []
    for i in range(steps):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
        o, h = gru(packed)
        o, _ = nn.utils.rnn.pad_packed_sequence(o, batch_first=True)
        loss = o.pow(2).sum() + h.sum()
        opt.zero_grad(); loss.backward()
        nn.utils.clip_grad_norm_(gru.parameters(), 0.5)
        opt.step()
        out.append((loss.detach().clone(), [p.detach().clone() for p in gru.parameters()]))
    return out


def prog_freeze(steps=14):
    torch.manual_seed(15)
    m = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.5)
    x = torch.randn(5, 4); y = torch.randn(5, 2)
    out = []
    for i in range(steps):
        if i == 5:
            for p in m[0].parameters(): p.requires_grad_(False)
        if i == 9:
            for p in m[0].parameters(): p.requires_grad_(True)
        loss = F.smooth_l1_loss(m(x), y)
        opt.zero_grad(); loss.backward(); opt.step(); sched.step()
        out.append((loss.item(), [p.detach().clone() for p in m.parameters()], sched.get_last_lr()[0]))
    return out


def prog_exceptions(steps=10):
    torch.manual_seed(16)
    w = torch.randn(3, 3, requires_grad=True)
    out = []
    for i in range(steps):
        h = w @ w
        try:
            if i % 4 == 3:
                bad = h @ torch.ones(2, 2)   # shape error
            r = h.sum()
        except RuntimeError as e:
            r = h.mean()
            out.append(str(e)[:40])
        r.backward()
        with torch.no_grad():
            w -= 0.01 * w.grad; w.grad = None
        out.append(w.detach().clone())
        if i == 8:
            break
    return out


def gen_batches(n):
    g = torch.Generator().manual_seed(17)
    for i in range(n):
        yield torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g)


def prog_generator_loop(steps=10):
    torch.manual_seed(18)
    m = nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    out = []
    for xb, yb in gen_batches(steps):
        logits = m(xb)
        loss = F.cross_entropy(logits, yb, reduction="sum") / len(yb)
        acc = (logits.argmax(1) == yb).float().mean()
        opt.zero_grad(); loss.backward(); opt.step()
        out.append((loss.detach().clone(), acc.item(), [p.detach().clone() for p in m.parameters()]))
        snapshot = copy.deepcopy(m.state_dict())
        out.append(list(snapshot.values()))
    return out


def prog_reseed(steps=8):
    out = []
    w = torch.zeros(4, requires_grad=True)
    for i in range(steps):
        torch.manual_seed(i % 3)
        noise = torch.randn(4)
        d = F.dropout(w + noise, 0.5)
        d.sum().backward()
        with torch.no_grad():
            w.add_(w.grad, alpha=-0.1); w.grad = None
        out.append((noise, d.detach().clone(), w.detach().clone()))
    return out


def prog_spectral(steps=10):
    torch.manual_seed(19)
    lin = nn.utils.spectral_norm(nn.Linear(5, 4))
    lin2 = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3))
    opt = torch.optim.SGD(list(lin.parameters()) + list(lin2.parameters()), lr=0.05)
    x = torch.randn(6, 5)
    out = []
    for i in range(steps):
        loss = lin2(F.relu(lin(x))).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        out.append((loss.detach().clone(), lin.weight_u.clone(), lin.weight_orig.detach().clone(), lin2.weight.detach().clone()))
    return out


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def prog_gp(steps=8):
    torch.manual_seed(20)
    D = nn.Sequential(nn.Linear(3, 8), nn.Softplus(), nn.Linear(8, 1))
    G = nn.Linear(2, 3)
    od = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.9))
    og = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.9))
    real = torch.randn(6, 3)
    out = []
    for i in range(steps):
        z = torch.randn(6, 2)
        fake = G(z)
        eps = torch.rand(6, 1)
        mix = (eps * real + (1 - eps) * fake.detach()).requires_grad_(True)
        grad, = torch.autograd.grad(D(mix).sum(), mix, create_graph=True)
        gp = ((grad.norm(2, dim=1) - 1) ** 2).mean()
        ld = D(fake.detach()).mean() - D(real).mean() + 10 * gp
        od.zero_grad(); ld.backward(); od.step()
        lg = -D(Square.apply(G(z))).mean()
        og.zero_grad(); lg.backward(retain_graph=True); og.step()
        out.append((ld.detach().clone(), lg.detach().clone(), [p.detach().clone() for p in G.parameters()]))
    return out


def prog_war(steps=12):
    torch.manual_seed(21)
    lin = nn.Linear(4, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    data = torch.randn(8, 4)
    scale = torch.tensor([1.0, 2.0, 3.0])
    correct = torch.zeros(())
    hist = torch.zeros(3)
    arr = np.ones(3, dtype=np.float32)
    shared = torch.from_numpy(arr)
    out = []
    for i in range(steps):
        y = lin(data) * scale.clone()
        z = data.sum(1) * scale[1]     # reads scale (own-made), no autograd
        scale.add_(0.5)                # then writes it
        w = y * shared                 # reads numpy-shared memory
        arr[:] = i                     # then Python changes it without ops
        loss = w.pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        pred = y.argmax(1)
        correct += (pred == 0).sum()
        hist.index_add_(0, pred, torch.ones(8))
        c = hist.clone(); c[0] = -1
        out.append((z, loss.item(), correct.item(), hist.tolist(), c, scale.clone(), float(shared.sum())))
    return out


def prog_accum(steps=16):
    torch.manual_seed(22)
    m = nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.GELU(), nn.Linear(7, 1))
    opt = torch.optim.Adam(m.parameters(), lr=3e-3, amsgrad=True)
    x = torch.randn(16, 5); y = torch.randn(16, 1)
    out = []
    m.zero_grad(set_to_none=False)
    for i in range(steps):
        xb, yb = x[(i % 4) * 4:(i % 4 + 1) * 4], y[(i % 4) * 4:(i % 4 + 1) * 4]
        loss = F.huber_loss(m(xb), yb) / 4
        loss.backward()
        if i % 4 == 3:
            gn = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, norm_type=2.0)
            opt.step(); m.zero_grad(set_to_none=False)
            out.append(gn.clone())
        out.append((loss.detach().clone(), m[0].weight.grad.clone()))
    return out + [[p.detach().clone() for p in m.parameters()]]


def prog_tensor_hooks(steps=10):
    torch.manual_seed(23)
    w = torch.randn(4, 4, requires_grad=True)
    grads = []
    out = []
    for i in range(steps):
        h = w.tanh()
        h.register_hook(lambda g: grads.append(g.sum().item()))
        h.retain_grad()
        loss = (h @ h).trace()
        loss.backward()
        out.append((h.grad.clone(), w.grad.clone()))
        with torch.no_grad():
            w.data.add_(w.grad, alpha=-0.05)
        w.grad = None
    return out + [grads]


def prog_sparse_ops(steps=10):
    torch.manual_seed(24)
    emb = nn.EmbeddingBag(20, 4, mode="mean")
    opt = torch.optim.SGD(emb.parameters(), lr=0.5)
    out = []
    for i in range(steps):
        inp = torch.tensor([i % 20, (i * 7) % 20, (i * 3) % 20, 1])
        offsets = torch.tensor([0, 2])
        e = emb(inp, offsets)
        loss = F.cosine_similarity(e[0:1], e[1:2]).sum() + F.kl_div(F.log_softmax(e, 1), F.softmax(e.detach() * 2, 1), reduction="batchmean")
        opt.zero_grad(); loss.backward(); opt.step()
        out.append((loss.detach().clone(), emb.weight.detach().clone()))
    return out


def prog_func_transforms(steps=8):
    """torch.func transforms in the loop: they run eagerly in the program's thread (an op issued
    from inside a vmap to the GraphRunner raised)."""
    torch.manual_seed(32)
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(5, 3)
    out = []
    for i in range(steps):
        per = torch.func.vmap(lambda r: (r @ w).tanh().sum())(x)
        g = torch.func.grad(lambda v: (v @ w.detach()).pow(2).sum())(x[0])
        jac = torch.func.jacrev(lambda v: (v * w.detach()[0]).sin())(x[1])
        _, tangent = torch.func.jvp(lambda v: v.exp(), (x[2],), (torch.ones(3),))
        loss = per.sum() + g.sum() * 0.1 + jac.sum() * 0.01 + tangent.sum() * 0.0
        loss.backward()
        with torch.no_grad():
            w -= 0.05 * w.grad
            w.grad = None
        out.append((per.detach().clone(), g.clone(), jac.clone(), tangent.clone(), w.detach().clone()))
    return out



def prog_optims(steps=8):
    torch.manual_seed(35)
    ms = [nn.Linear(4, 4) for _ in range(5)]
    opts = [torch.optim.Adam(ms[0].parameters(), lr=1e-2, fused=True),
            torch.optim.AdamW(ms[1].parameters(), lr=1e-2, foreach=True, amsgrad=True),
            torch.optim.SGD(ms[2].parameters(), lr=1e-2, foreach=True, momentum=0.9),
            torch.optim.Adamax(ms[3].parameters(), lr=1e-2),
            torch.optim.NAdam(ms[4].parameters(), lr=1e-2, decoupled_weight_decay=True, weight_decay=0.01)]
    x = torch.randn(6, 4)
    out = []
    for i in range(steps):
        for m, o in zip(ms, opts):
            loss = m(x).pow(2).mean()
            o.zero_grad(); loss.backward(); o.step()
            out.append(loss.detach().clone())
    return out + [p.detach().clone() for m in ms for p in m.parameters()]


def prog_scaler(steps=8):
    torch.manual_seed(36)
    m = nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4, growth_interval=2)
    x = torch.randn(5, 4)
    out = []
    for i in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(x * (1e30 if i == 3 else 1.0)).float().pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        scaler.step(opt); scaler.update()
        out.append((scaler.get_scale(), m.weight.detach().clone()))
    return out


def prog_sparse(steps=8):
    torch.manual_seed(37)
    emb = nn.Embedding(12, 3, sparse=True)
    opt = torch.optim.SparseAdam(emb.parameters(), lr=0.05)
    out = []
    for i in range(steps):
        idx = torch.tensor([i % 12, (i * 5) % 12, 3])
        loss = emb(idx).pow(2).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        out.append((loss.detach().clone(), emb.weight.detach().clone()))
    return out



def prog_complex(steps=8):
    torch.manual_seed(42)
    w = torch.randn(8, requires_grad=True)
    target = torch.randn(5)
    out = []
    for i in range(steps):
        spec = torch.fft.rfft(w * (1 + 0.1 * i))
        z = spec * torch.exp(1j * torch.arange(5.0))
        mag = z.abs()
        ph = torch.angle(z.conj())
        loss = F.mse_loss(mag, target) + ph.pow(2).mean() * 0.01 + torch.view_as_real(spec).sum() * 0.001
        loss.backward()
        with torch.no_grad():
            w -= 0.05 * w.grad; w.grad = None
        out.append((loss.detach().clone(), mag.detach().clone(), w.detach().clone()))
    return out


def prog_out_args(steps=8):
    torch.manual_seed(43)
    a = torch.randn(4, 4); b = torch.randn(4, 4)
    c = torch.empty(4, 4); acc = torch.zeros(4)
    out = []
    for i in range(steps):
        torch.mul(a, b + i, out=c)
        torch.add(acc, c.sum(0), out=acc)
        acc.add_(acc)
        d = torch.zeros(4, 4)
        d.index_put_((torch.tensor([0, 1, 1]), torch.tensor([2, 3, 3])), torch.tensor([1.0, 2.0, 3.0]), accumulate=True)
        e = torch.zeros(3).scatter_reduce(0, torch.tensor([0, 1, 0, 2]), torch.tensor([1.0, 2.0, 5.0, 3.0]), reduce="amax")
        out.append((c.clone(), acc.clone(), d, e))
    return out


def prog_strided_params(steps=8):
    torch.manual_seed(44)
    base = nn.Parameter(torch.randn(6, 4))
    opt = torch.optim.Adam([base], lr=1e-2)
    x = torch.randn(3, 6)
    out = []
    for i in range(steps):
        w = base.t()[:, ::2]                # non-contiguous view of a param
        s = base.as_strided((3, 2), (4, 1), 2)
        loss = (x @ base).pow(2).mean() + w.sum() + s.pow(2).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        out.append((loss.detach().clone(), base.detach().clone()))
    return out


def prog_grad_hooks(steps=8):
    torch.manual_seed(45)
    lin = nn.Linear(3, 3)
    lin.weight.register_hook(lambda g: g * 0.5)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 3)
    out = []
    for i in range(steps):
        loss = lin(x).pow(2).sum()
        opt.zero_grad(set_to_none=False); loss.backward()
        lin.bias.grad.data.mul_(2)
        opt.step()
        out.append((lin.weight.grad.clone(), lin.bias.detach().clone()))
    return out



def prog_distributions(steps=10):
    torch.manual_seed(25)
    mu = nn.Linear(3, 2); logstd = nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam(list(mu.parameters()) + [logstd], lr=1e-2)
    x = torch.randn(5, 3)
    out = []
    for i in range(steps):
        dist = torch.distributions.Normal(mu(x), logstd.exp())
        a = dist.rsample()
        cat = torch.distributions.Categorical(logits=mu(x))
        c = cat.sample()
        loss = -(dist.log_prob(a).sum() + cat.log_prob(c).sum()) - 0.01 * dist.entropy().mean() + (a ** 2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        out.append((a.detach().clone(), c.clone(), loss.detach().clone(), logstd.detach().clone()))
    return out


def prog_mha(steps=8):
    torch.manual_seed(26)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.1, batch_first=True)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    x = torch.randn(3, 5, 8)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    out = []
    for i in range(steps):
        y = layer(x, src_key_padding_mask=mask)
        loss = y[~mask].pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        out.append((loss.detach().clone(), layer.linear1.weight.detach().clone()))
    return out


def prog_vision(steps=8):
    torch.manual_seed(27)
    net = nn.Sequential(nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1), nn.GroupNorm(1, 3),
                        nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False), nn.Conv2d(3, 2, 3, padding=1))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(2, 2, 4, 4)
    theta = torch.tensor([[[1.0, 0.1, 0.0], [0.0, 0.9, 0.1]]]).repeat(2, 1, 1)
    out = []
    for i in range(steps):
        y = net(x)
        grid = F.affine_grid(theta, y.shape, align_corners=False)
        s = F.grid_sample(y, grid, align_corners=False)
        patches = F.unfold(s, 3, padding=1)
        oh = F.one_hot(torch.tensor([i % 4, 1]), 4).float()
        loss = patches.pow(2).mean() + (oh @ torch.ones(4)).sum() * 0 + s.std()
        opt.zero_grad(); loss.backward(); opt.step()
        out.append((loss.detach().clone(), torch.bincount(torch.tensor([i % 3, 2, 2])), net[0].weight.detach().clone()))
    return out


def prog_leaf_edits(steps=10):
    torch.manual_seed(29)
    w = nn.Parameter(torch.randn(4, 4))
    opt = torch.optim.SGD([w], lr=0.1)
    out = []
    for i in range(steps):
        loss = (w.sin() * torch.arange(4.0)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        with torch.no_grad():
            w[i % 4].zero_()
            w.data[:, 0] = float(i)
            w.clamp_(-1, 1)
        out.append((w.detach().clone(), w._version))
    return out



def prog_inference(steps=10):
    torch.manual_seed(38)
    m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(6, 4); y = torch.randn(6, 2)
    out = []
    for i in range(steps):
        m.train()
        with torch.set_grad_enabled(True):
            loss = F.mse_loss(m(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if i % 2:
            m.eval()
            with torch.inference_mode():
                ev = m(x).sum()
            out.append(ev.item())
        out.append(loss.item())
    return out + [p.detach().clone() for p in m.parameters()]


def prog_dtype_switch(steps=10):
    torch.manual_seed(39)
    m = nn.Linear(3, 3).double()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(4, 3, dtype=torch.float64)
    out = []
    for i in range(steps):
        loss = m(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        h = m(x.float().double())
        out.append((loss.detach().clone(), h.detach().clone(), m.weight.detach().float().clone()))
    return out


def prog_module_swap(steps=10):
    torch.manual_seed(40)
    layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])
    opt = torch.optim.Adam(layers.parameters(), lr=1e-2)
    x = torch.randn(2, 3)
    out = []
    for i in range(steps):
        h = x
        for j, l in enumerate(layers):
            if (i + j) % 3 == 0:
                continue            # a data-independent but varying path
            h = torch.tanh(l(h))
        loss = h.sum()
        opt.zero_grad(); loss.backward(); opt.step()
        out.append((loss.detach().clone(), [p.detach().clone() for p in layers.parameters()]))
    return out



def prog_linalg(steps=8):
    torch.manual_seed(46)
    w = torch.randn(5, 5, requires_grad=True)
    out = []
    for i in range(steps):
        a = w @ w.t() + torch.eye(5) * (2 + 0.1 * i)
        L = torch.linalg.cholesky(a)
        sign, logdet = torch.linalg.slogdet(a)
        q, r = torch.linalg.qr(w)
        u, s, vh = torch.linalg.svd(w)
        sol = torch.linalg.solve(a, torch.ones(5))
        inv = torch.inverse(a)
        vals, idx = torch.max(w, dim=1)
        kv = torch.kthvalue(w, 2, dim=0).values
        md = torch.median(w, dim=1).values
        loss = L.sum() + logdet + r.diagonal().abs().sum() + s.sum() + sol.sum() + inv.trace() + vals.sum() + kv.sum() + md.sum()
        loss.backward()
        with torch.no_grad():
            w -= 0.001 * w.grad; w.grad = None
        out.append((loss.detach().clone(), idx, w.detach().clone()))
    return out


def prog_misc_ops(steps=8):
    torch.manual_seed(47)
    x = torch.randn(6, 4, requires_grad=True)
    bins = torch.tensor([-1.0, 0.0, 1.0])
    out = []
    for i in range(steps):
        d = torch.cdist(x, x * 0.5)
        n = F.normalize(x, dim=1)
        lse = torch.logsumexp(x, dim=0)
        nn_ = torch.nan_to_num(x.log(), nan=0.0, neginf=-5.0)
        b = torch.bucketize(x.detach(), bins)
        ss = torch.searchsorted(bins, x.detach().flatten().sort().values)
        h = torch.histc(x.detach(), bins=4, min=-2, max=2)
        bits = (b << 2) ^ (b & 1) | (b >> 1)
        loss = d.mean() + n.sum() + lse.sum() + nn_.sum()
        loss.backward()
        with torch.no_grad():
            x -= 0.01 * x.grad; x.grad = None
        out.append((loss.detach().clone(), b, ss, h, bits, x.detach().clone()))
    return out



def prog_replay_buffer(steps=14):
    torch.manual_seed(48); rng = random.Random(0)
    q = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    tgt = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)); tgt.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    buf = []
    s = torch.randn(4)
    out = []
    for i in range(steps):
        with torch.no_grad():
            a = q(s).argmax().item() if rng.random() > 0.3 else rng.randrange(2)
        s2 = s * 0.9 + torch.randn(4) * 0.1
        r = float(s2.sum() > 0)
        buf.append((s, a, r, s2))
        s = s2
        if len(buf) >= 4:
            batch = rng.sample(buf, 4)
            S = torch.stack([b[0] for b in batch]); A = torch.tensor([b[1] for b in batch])
            R = torch.tensor([b[2] for b in batch]); S2 = torch.stack([b[3] for b in batch])
            with torch.no_grad():
                y = R + 0.9 * tgt(S2).max(1).values
            qa = q(S).gather(1, A[:, None]).squeeze(1)
            loss = F.smooth_l1_loss(qa, y)
            opt.zero_grad(); loss.backward(); opt.step()
            out.append(loss.detach().clone())
        if i % 5 == 4:
            tgt.load_state_dict(q.state_dict())
    return out + [p.detach().clone() for p in q.parameters()]


W = torch.zeros(3)


def helper(x, scale):
    return (x * scale).tanh()


def prog_globals_closures(steps=10):
    global W
    torch.manual_seed(49)
    W = torch.zeros(3)
    p = torch.randn(3, requires_grad=True)
    mult = [1.0]
    def closure(x):
        return helper(x, mult[0]) + W
    out = []
    for i in range(steps):
        y = closure(p) if i % 2 else helper(p, 2.0)
        loss = y.pow(2).sum()
        loss.backward()
        with torch.no_grad():
            p -= 0.1 * p.grad; p.grad = None
        W = W + 0.01 * i
        mult[0] *= 1.1
        out.append((loss.detach().clone(), W.clone(), p.detach().clone()))
    return out



def prog_ckpt_roundtrip(steps=10):
    torch.manual_seed(50)
    m = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5), nn.Linear(5, 1))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    x = torch.randn(8, 3); y = torch.randn(8, 1)
    arr = np.zeros((5, 3), dtype=np.float32)
    out = []
    for i in range(steps):
        loss = F.mse_loss(m(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if i % 3 == 2:
            buf = io.BytesIO(); torch.save({"m": m.state_dict(), "o": opt.state_dict()}, buf); buf.seek(0)
            ck = torch.load(buf)
            m.load_state_dict(ck["m"]); opt.load_state_dict(ck["o"])
        if i == 6:
            arr[:] = 0.01
            with torch.no_grad():
                m[0].weight.copy_(torch.from_numpy(arr))
            arr[:] = 5.0
        out.append((loss.detach().clone(), [t.clone() for t in m.state_dict().values()]))
    return out


def prog_gan_clears(steps=30):
    # Two models, each step clearing one's gradients between the two backwards (set_to_none),
    # the generator's backward making the discriminator's gradients again.
    torch.manual_seed(5)
    g = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 4))
    d = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
    og = torch.optim.Adam(g.parameters(), lr=1e-3); od = torch.optim.SGD(d.parameters(), lr=1e-2, momentum=0.5)
    real = torch.randn(16, 4)
    out = []
    for i in range(steps):
        fake = g(torch.randn(16, 3))
        od.zero_grad()
        ld = F.softplus(-d(real)).mean() + F.softplus(d(fake.detach())).mean()
        ld.backward(); od.step()
        og.zero_grad()
        lg = F.softplus(-d(fake)).mean()
        lg.backward(); og.step()
        out.append((ld.detach().clone(), lg.detach().clone(), [p.grad is None for p in d.parameters()]))
        if i % 4 == 3:
            d.zero_grad()  # cleared at the step's end, some steps only
    out.append([p.detach().clone() for p in list(g.parameters()) + list(d.parameters())])
    return out


def prog_clears_by_step(steps=30):
    # `.grad = None` written by hand for a step-dependent set of parameters between the backward
    # and the update (the optimizer then skips them), and gradients read for logging.
    torch.manual_seed(6)
    m = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    rng = random.Random(6)
    x, y = torch.randn(12, 5), torch.randn(12, 1)
    params = list(m.parameters())
    out = []
    for i in range(steps):
        if i % 5 != 4:
            opt.zero_grad()  # else the gradients accumulate over two steps
        loss = F.mse_loss(m(x), y)
        loss.backward()
        for j, p in enumerate(params):
            if rng.random() < 0.3:
                p.grad = None
        norms = [p.grad.norm().item() if p.grad is not None else None for p in params]
        opt.step()
        out.append((loss.detach().clone(), norms))
    out.append([p.detach().clone() for p in params])
    return out


def prog_retain_clear(steps=20):
    # Two backwards over one graph (retain_graph), the gradients cleared between them.
    torch.manual_seed(7)
    m = nn.Linear(4, 3)
    opt = torch.optim.Adagrad(m.parameters(), lr=0.1)
    x = torch.randn(6, 4)
    out = []
    for i in range(steps):
        h = m(x).tanh()
        a, b = h.pow(2).sum(), h.sum()
        opt.zero_grad()
        a.backward(retain_graph=True)
        first = m.weight.grad.clone()
        opt.zero_grad(set_to_none=(i % 2 == 0))
        b.backward()
        opt.step()
        out.append((first, m.weight.grad.clone(), m.bias.detach().clone()))
    return out


def prog_checkpointing(steps=12):
    # Activation checkpointing, both kinds: the reentrant one's backward reads `.grad` and calls
    # backward again inside the step's backward (it raised "TraceGraph::add: key ... is in the
    # graph already" until session 51); the other recomputes through saved-tensor hooks.
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(8)
    block1 = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 6))
    block2 = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 6))
    head = nn.Linear(6, 1)
    params = [*block1.parameters(), *block2.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=0.01)
    x, y = torch.randn(10, 6), torch.randn(10, 1)
    out = []
    for i in range(steps):
        h = checkpoint(block1, x.requires_grad_(), use_reentrant=True)
        h = checkpoint(block2, h, use_reentrant=False)
        loss = F.mse_loss(head(h), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append((loss.detach(), x.grad.clone(), head.weight.detach().clone()))
        x.grad = None
    return out


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.l(x)) * 2


def prog_torchscript(steps=10):
    # A module scripted inside the session (its F.linear and torch.relu are looked up by identity
    # in TorchScript's builtin table) and trained: from its third call the graph executor makes a
    # backward node of its own holding saved values (DifferentiableGraphBackward). Scripting
    # raised "Python builtin <built-in function linear> is currently not supported" until session
    # 52, and the backward "Cannot access data pointer of Tensor that doesn't have storage".
    torch.manual_seed(6)
    m = torch.jit.script(_Scaled())

    @torch.jit.script
    def swish(a):
        return a * torch.sigmoid(a)

    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    out = []
    for i in range(steps):
        loss = swish(m(x)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append((loss.detach(), m.l.weight.detach().clone()))
    return out


def _swapped_mid_loop(swap, seed, steps=8, at=3):
    # The model trained for `at` steps, then replaced by what `swap(model, x)` makes of it,
    # (module, something to compare), and that trained on (its parameters are the model's).
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    out, m = [], model
    for i in range(steps):
        if i == at:
            m, seen = swap(model, x)
            out.append(seen)
        loss = m(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.detach())
    return out


def prog_jit_trace(steps=8):
    # torch.jit.trace of the model mid-loop, then training the traced module (the tracer records
    # the ops the program's thread runs: none may go to the GraphRunner).
    def trace(model, x):
        traced = torch.jit.trace(model, x)
        return traced, traced.graph.str().count("aten::linear")
    return _swapped_mid_loop(trace, seed=12, steps=steps)


class _Mlp(nn.Sequential):
    def forward(self, x):  # the program's own forward: Dynamo compiles no torch.nn frame
        return self[2](self[1](self[0](x)))


def prog_compiled_module(steps=6, backend="eager", form="module"):
    # torch.compile'd model (TorchDynamo knows torch functions by identity) trained in the loop;
    # `form`: the module compiled (torch.compile(model)), compiled in place (model.compile()), or
    # a plain function that calls it compiled (session 53: that one recompiled at each call).
    torch.manual_seed(10)
    model = _Mlp(nn.Linear(5, 16), nn.GELU(), nn.Linear(16, 1))
    if form == "module":
        compiled = torch.compile(model, backend=backend)
        loss_of = lambda x, y: F.mse_loss(compiled(x), y)  # noqa: E731
    elif form == "method":
        model.compile(backend=backend)
        loss_of = lambda x, y: F.mse_loss(model(x), y)  # noqa: E731
    else:
        @torch.compile(backend=backend)
        def loss_of(x, y):
            return F.mse_loss(model(x), y)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    x, y = torch.randn(8, 5), torch.randn(8, 1)
    out = []
    for i in range(steps):
        loss = loss_of(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append((loss.detach(), model[0].weight.detach().clone()))
    return out + [p.detach().clone() for p in model.parameters()]


def prog_tbptt(steps=14):
    # Truncated backpropagation through time: an LSTM language model whose carried hidden state
    # is detached each step (its last states the loss leaves: replayed since session 53), dropout
    # between its layers, clipping, AdamW.
    torch.manual_seed(11)
    rnn = nn.LSTM(8, 12, num_layers=2, batch_first=True, dropout=0.3)
    emb, head = nn.Embedding(30, 8), nn.Linear(12, 30)
    params = [*rnn.parameters(), *emb.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-3)
    data = torch.randint(0, 30, (4, 16 * 6 + 1))
    hidden = None
    out = []
    for i in range(steps):
        j = (i % 6) * 16
        x, y = data[:, j:j + 16], data[:, j + 1:j + 17]
        if hidden is not None:
            hidden = tuple(h.detach() for h in hidden)
        o, hidden = rnn(emb(x), hidden)
        loss = F.cross_entropy(head(o).reshape(-1, 30), y.reshape(-1))
        opt.zero_grad(); loss.backward()
        nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        out.append((loss.detach(), hidden[0].detach().clone()))
    return out + [p.detach().clone() for p in params]


def prog_pinn(steps=10):
    # A physics-informed loss: derivatives of the network's output by its input through
    # torch.autograd.grad with create_graph=True, the residual's backward through them.
    torch.manual_seed(12)
    net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    out = []
    for i in range(steps):
        xt = torch.rand(32, 2, requires_grad=True)
        u = net(xt)
        g, = torch.autograd.grad(u.sum(), xt, create_graph=True)
        u_xx = torch.autograd.grad(g[:, :1].sum(), xt, create_graph=True)[0][:, :1]
        loss = (g[:, 1:] + u * g[:, :1] - 0.01 * u_xx).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        out.append(loss.detach())
    return out + [p.detach().clone() for p in net.parameters()]


def prog_compiled_function(steps=6):
    return prog_compiled_module(steps, form="function")


def prog_fx_traced(steps=8):
    def fx(model, x):
        gm = torch.fx.symbolic_trace(model)
        return gm, len(gm.graph.nodes)
    return _swapped_mid_loop(fx, seed=14, steps=steps, at=2)


def prog_optimizer_in_backward(steps=12):
    # Each parameter stepped by its own optimizer in a post-accumulate-grad hook.
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1))
    opts = {p: torch.optim.SGD([p], lr=0.05, momentum=0.9) for p in model.parameters()}

    def step(p):
        opts[p].step()
        opts[p].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(step)
    x, y = torch.randn(8, 5), torch.randn(8, 1)
    out = []
    for i in range(steps):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        out.append((loss.detach(), model[0].weight.detach().clone()))
    return out


def prog_anomaly_mode(steps=10):
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 5), torch.randn(8, 1)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Anomaly Detection has been enabled"
        with torch.autograd.detect_anomaly():
            for i in range(steps):
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                out.append(loss.detach())
    return out


def prog_forward_ad(steps=10):
    import torch.autograd.forward_ad as fwAD
    torch.manual_seed(3)
    w = torch.randn(5, 5, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.01)
    x = torch.randn(4, 5)
    out = []
    for i in range(steps):
        with fwAD.dual_level():
            dual = fwAD.make_dual(x, torch.ones_like(x))
            jvp = fwAD.unpack_dual(torch.tanh(dual @ w.detach())).tangent
        loss = (torch.tanh(x @ w) ** 2).sum() + jvp.sum() * 0.01
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append((loss.detach(), jvp.clone()))
    return out


def prog_parametrizations(steps=10):
    from torch.nn.utils.parametrizations import orthogonal, weight_norm
    torch.manual_seed(9)
    l1, l2 = weight_norm(nn.Linear(5, 8)), orthogonal(nn.Linear(8, 8))
    opt = torch.optim.Adam([*l1.parameters(), *l2.parameters()], lr=0.01, fused=True)
    x = torch.randn(4, 5)
    out = []
    for i in range(steps):
        loss = l2(torch.tanh(l1(x))).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append((loss.detach(), l2.weight.detach().clone()))
    return out


def flat(o):
    if isinstance(o, torch.Tensor):
        return [o]
    if isinstance(o, (list, tuple)):
        return [t for v in o for t in flat(v)]
    if isinstance(o, np.ndarray):
        return [torch.from_numpy(o)]
    return [o]


def same(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


PROGRAMS = [prog_torchscript, prog_jit_trace, prog_compiled_module, prog_compiled_function, prog_tbptt, prog_pinn, prog_fx_traced, prog_optimizer_in_backward,
            prog_anomaly_mode, prog_forward_ad, prog_parametrizations, prog_gan_clears, prog_clears_by_step, prog_retain_clear, prog_ckpt_roundtrip, prog_replay_buffer, prog_globals_closures, prog_distributions, prog_mha, prog_vision, prog_leaf_edits, prog_inference, prog_dtype_switch, prog_module_swap, prog_linalg, prog_misc_ops, prog_complex, prog_out_args, prog_strided_params, prog_grad_hooks, prog_func_transforms, prog_optims, prog_scaler, prog_sparse, prog_ema, prog_state_dict, prog_norms, prog_rnn, prog_buffers, prog_inplace_index, prog_hooks, prog_views, prog_train_eval, prog_autocast, prog_generator, prog_data_dep, prog_shapes, prog_rnn_packed, prog_freeze, prog_exceptions, prog_generator_loop, prog_reseed, prog_spectral, prog_gp, prog_war, prog_accum, prog_tensor_hooks, prog_sparse_ops, prog_checkpointing]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)


def test_a_notebook_pattern_runs_as_in_eager(program, fresh_graphs):
    eager = flat(program())
    coexecuted = flat(terra.run(program))
    assert len(eager) == len(coexecuted)
    bad = [i for i, (a, b) in enumerate(zip(eager, coexecuted)) if not same(a, b)]
    assert not bad, bad[:10]
    stats = terra.stats(program.__name__)
    assert stats["iterations_coexecuted"] + stats["iterations_fallback"] >= 3, stats


def test_functorch_levels_are_restored_after_the_session(fresh_graphs):
    import torch._functorch.eager_transforms as eager_transforms
    import torch._functorch.vmap as vmap_module
    names = [(vmap_module, "_vmap_increment_nesting"), (vmap_module, "_vmap_decrement_nesting"),
             (eager_transforms, "_grad_increment_nesting"), (eager_transforms, "_jvp_decrement_nesting")]
    before = [getattr(m, n) for m, n in names]
    inside = terra.run(lambda: [getattr(m, n) for m, n in names])
    assert all(a is not b for a, b in zip(inside, before))
    assert [getattr(m, n) for m, n in names] == before


def test_compilers_inside_a_session_see_torch_functions(fresh_graphs):
    # torch.jit.script raised "Python builtin <built-in function linear> is currently not
    # supported in Torchscript" in a session, and TorchDynamo broke its graph at F.linear.
    import torch._dynamo
    from torch._dynamo.utils import counters

    def prog(steps=4):
        torch.manual_seed(0)
        scripted, compiled = torch.jit.script(_Scaled()), torch.compile(_Scaled(), backend="eager")
        x = torch.rand(3, 4)
        return [(scripted(x), compiled(x)) for _ in range(steps)]

    eager = prog()
    torch._dynamo.reset()
    counters.clear()
    out = flat(terra.run(prog))
    assert len(out) == len(flat(eager)) and all(same(a, b) for a, b in zip(out, flat(eager)))
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("form", ["module", "method", "function"])
def test_a_model_compiled_by_inductor_in_a_session_trains_as_without_terra(form, fresh_graphs):
    # Inductor's first compile inside a session (no cache) traced the model with fake tensors,
    # forward and backward together, through the engine ("TraceGraph::add: key ... is in the graph
    # already"), then a half-made FakeTensor was asked for its writes in flight; and once it
    # compiled, every call failed its guards (the thread's dispatch keys) and recompiled, up to
    # Dynamo's limit of 8, after which the model ran uncompiled, with other bits (session 52; a
    # compiled plain function and model.compile() until session 53). 12 steps: past that limit.
    import torch._dynamo
    import torch._inductor.config
    from torch._dynamo.utils import counters

    with torch._inductor.config.patch(force_disable_caches=True):
        torch._dynamo.reset()
        without = flat(prog_compiled_module(12, "inductor", form))
        torch._dynamo.reset()
        counters.clear()
        with_terra = flat(terra.run(prog_compiled_module, 12, "inductor", form))
    assert len(with_terra) == len(without) and all(same(a, b) for a, b in zip(with_terra, without))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert sum(counters["graph_break"].values()) == 0
