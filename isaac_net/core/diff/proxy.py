"""Neural proxy: an MLP fitted to per-robot KPIs of engine rollouts (the seed's recipe).

The proxy maps a robot's own decisions and channel, plus the load context of its cell
(what the other robots of the cell offer, which a robot cannot see alone), to its
per-robot KPIs over a stationary rollout. It is differentiable in the send probability,
the message size and the SNR, so gradients reach transmit power and position through
:mod:`isaac_net.core.radio`.

Its gradients are those of a regression fit: only as good as the training distribution
(stationary Bernoulli sends, the level's default constants, one cell, ``RANGES``).

Recipe::

    data = collect("L2-legacy", num_cells=512, R=8, T=100, warmup=20, seed=0)
    proxy, report = fit(data["x"], data["y"], seed=0)
    kpi = proxy.predict(p, msg_bytes, snr_db)   # dict of [E, R], differentiable
    proxy.save("proxy.pt"); proxy = Proxy.load("proxy.pt")
"""

from __future__ import annotations

import math

import torch
from torch import nn

from isaac_net.core import _validate
from isaac_net.core.diff.reference import discrete_rollout

#: Sampling ranges of the per-robot inputs. ``p`` and ``snr_db`` uniform, ``msg_bytes``
#: log-uniform.
RANGES = {
    "p": (0.05, 0.95),  # send probability per control step
    "msg_bytes": (2_000.0, 40_000.0),  # message size, bytes
    "snr_db": (5.0, 35.0),  # SNR with full power in one subband, dB
}

#: Raw inputs of one sample: the robot's own (``p, msg_bytes, snr_db``) and the context of
#: its cell, from the other robots: sum of their send probabilities, sum of their offered
#: bytes per step ``p * msg_bytes`` (kB) and their mean SNR (dB).
INPUTS = ("p", "msg_bytes", "snr_db", "ctx_rate", "ctx_load_kb", "ctx_snr_db")

#: Per-robot KPIs the proxy predicts (the keys of the engine's per-robot rollout result):
#: delay (control steps), delivery ratio, mean AoI (control steps), energy per step (J).
TARGETS = ("delay", "delivery", "aoi", "energy_j")


def context(p: torch.Tensor, msg_bytes: torch.Tensor, snr_db: torch.Tensor) -> torch.Tensor:
    """Raw proxy inputs of every robot from the decisions of its cell.

    :input p, msg_bytes, snr_db: ``[E, R]``.
    :output: ``[E, R, len(INPUTS)]``; the context columns sum over the other robots
        (``R = 1`` gives zero load and the robot's own SNR).
    """
    R = p.shape[-1]
    load_kb = p * msg_bytes / 1000.0
    ctx_rate = p.sum(-1, keepdim=True) - p
    ctx_load = load_kb.sum(-1, keepdim=True) - load_kb
    if R > 1:
        ctx_snr = (snr_db.sum(-1, keepdim=True) - snr_db) / (R - 1)
    else:
        ctx_snr = snr_db
    return torch.stack([p, msg_bytes, snr_db, ctx_rate, ctx_load, ctx_snr], dim=-1)


def _features(raw: torch.Tensor) -> torch.Tensor:
    """Raw inputs ``[..., len(INPUTS)]`` to network features: message size in log kB."""
    return torch.cat([raw[..., :1], torch.log(raw[..., 1:2] / 1000.0), raw[..., 2:]], dim=-1)


def sample_inputs(num_cells: int, R: int, generator: torch.Generator, ranges: dict | None = None,
                  dtype: torch.dtype = torch.float64, device="cpu") -> dict:
    """Per-robot inputs drawn from ``ranges`` (default ``RANGES``). Each ``[num_cells, R]``."""
    rg = RANGES if ranges is None else ranges
    _check_ranges(rg)

    def uni(lo, hi):
        return lo + (hi - lo) * torch.rand(num_cells, R, generator=generator, dtype=dtype, device=device)

    lb_lo, lb_hi = (math.log(v) for v in rg["msg_bytes"])
    return {
        "p": uni(*rg["p"]),
        "msg_bytes": torch.exp(uni(lb_lo, lb_hi)),
        "snr_db": uni(*rg["snr_db"]),
    }


def collect(level: str, num_cells: int, R: int, T: int, *, warmup: int, seed: int,
            ranges: dict | None = None, cfg=None, dtype: torch.dtype = torch.float64,
            device="cpu", batch_cells: int | None = None, progress=None, **engine_kwargs) -> dict:
    """Per-robot KPIs of ``level`` rollouts with random stationary decisions per robot.

    Cells are run ``batch_cells`` at a time (all at once by default), each batch one
    engine with seed ``seed + batch index``. Inputs are drawn on the CPU (the same samples
    on every device); the returned tensors are on the CPU.

    :output: ``x`` ``[N, len(INPUTS)]`` raw inputs, ``y`` ``[N, len(TARGETS)]`` per-robot
        KPIs (``delay`` NaN where nothing was delivered), ``cell`` ``[N]`` cell index;
        ``N = num_cells * R``.
    """
    _validate.check_dims(num_cells, R)
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    batch = num_cells if batch_cells is None else int(batch_cells)
    xs, ys = [], []
    starts = list(range(0, num_cells, batch))
    it = starts if progress is None else progress(starts)
    for i, start in enumerate(it):
        n = min(batch, num_cells - start)
        inp = sample_inputs(n, R, gen, ranges, dtype=dtype)
        u = torch.rand(T, n, R, generator=gen, dtype=dtype)
        on_dev = {k: v.to(device) for k, v in inp.items()}
        res = discrete_rollout(level, T, on_dev["p"], on_dev["msg_bytes"], snr_db=on_dev["snr_db"],
                               warmup=warmup, u=u.to(device), cfg=cfg, dtype=dtype, device=device,
                               seed=int(seed) + i, **engine_kwargs)
        xs.append(context(inp["p"], inp["msg_bytes"], inp["snr_db"]).reshape(n * R, -1))
        ys.append(torch.stack([res[k].detach().cpu() for k in TARGETS], dim=-1).reshape(n * R, -1))
    x, y = torch.cat(xs), torch.cat(ys)
    cell = torch.arange(num_cells).repeat_interleave(R)
    return {"x": x, "y": y, "cell": cell}


def _check_ranges(ranges: dict) -> None:
    missing = [k for k in RANGES if k not in ranges]
    if missing:
        raise ValueError(f"ranges: expected keys {list(RANGES)}, missing {missing}")
    for k in RANGES:
        lo, hi = ranges[k]
        if not lo < hi:
            raise ValueError(f"ranges[{k!r}]: expected low < high, got {ranges[k]}")
    if not (0.0 <= ranges["p"][0] and ranges["p"][1] <= 1.0):
        raise ValueError(f"ranges['p']: expected probabilities in [0, 1], got {ranges['p']}")
    if ranges["msg_bytes"][0] <= 0:
        raise ValueError(f"ranges['msg_bytes']: expected sizes > 0 bytes, got {ranges['msg_bytes']}")


class Proxy(nn.Module):
    """MLP from standardised features to standardised per-robot KPIs.

    :param hidden: widths of the hidden layers (SiLU, smooth so that gradients are).
    Normalisation constants are buffers, so ``state_dict`` carries everything.
    """

    def __init__(self, hidden=(64, 64), ranges: dict | None = None):
        super().__init__()
        self.hidden = tuple(int(h) for h in hidden)
        self.ranges = {k: tuple(float(v) for v in (RANGES if ranges is None else ranges)[k]) for k in RANGES}
        layers, width = [], len(INPUTS)
        for h in self.hidden:
            layers += [nn.Linear(width, h), nn.SiLU()]
            width = h
        layers.append(nn.Linear(width, len(TARGETS)))
        self.net = nn.Sequential(*layers)
        self.register_buffer("x_mean", torch.zeros(len(INPUTS)))
        self.register_buffer("x_std", torch.ones(len(INPUTS)))
        self.register_buffer("y_mean", torch.zeros(len(TARGETS)))
        self.register_buffer("y_std", torch.ones(len(TARGETS)))

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        """:input raw: ``[..., len(INPUTS)]`` raw inputs. :output: ``[..., len(TARGETS)]`` KPIs."""
        z = (_features(raw.to(self.x_mean.dtype)) - self.x_mean) / self.x_std
        return self.net(z) * self.y_std + self.y_mean

    def predict(self, p, msg_bytes, snr_db) -> dict:
        """Per-robot KPIs of a cell configuration, differentiable in every input.

        :input p: ``[E, R]`` send probability; :input msg_bytes: ``[E, R]`` bytes;
        :input snr_db: ``[E, R]`` dB (e.g. :func:`isaac_net.core.radio.snr_db` of positions
            and transmit power).
        :output: dict ``TARGETS`` -> ``[E, R]``.
        """
        tensors = [t for t in (p, msg_bytes, snr_db) if isinstance(t, torch.Tensor)]
        if not tensors:
            raise ValueError("p, msg_bytes, snr_db: expected at least one [E, R] tensor")
        try:
            shape = torch.broadcast_shapes(*(t.shape for t in tensors))
        except RuntimeError:
            shape = None
        if shape is None or len(shape) != 2:
            raise ValueError("p, msg_bytes, snr_db: expected [E, R] inputs, got shapes "
                             f"{[list(t.shape) for t in tensors]}")
        E, R = shape
        dt, dev = self.x_mean.dtype, self.x_mean.device
        p = _validate.per_robot(p, "p", E, R, dt, dev)
        msg_bytes = _validate.per_robot(msg_bytes, "msg_bytes", E, R, dt, dev)
        snr_db = _validate.per_robot(snr_db, "snr_db", E, R, dt, dev)
        _validate.check_range(p, "p", 0.0, 1.0, "probabilities in [0, 1]")
        if bool((msg_bytes <= 0).any()):
            raise ValueError("msg_bytes: expected sizes > 0 bytes")
        out = self(context(p, msg_bytes, snr_db))
        return {k: out[..., i] for i, k in enumerate(TARGETS)}

    def save(self, path) -> None:
        """Write the weights and the architecture to ``path`` (``torch.save``)."""
        torch.save({"hidden": list(self.hidden), "ranges": {k: list(v) for k, v in self.ranges.items()},
                    "inputs": list(INPUTS), "targets": list(TARGETS),
                    "dtype": str(self.x_mean.dtype).removeprefix("torch."),
                    "state_dict": self.state_dict()}, path)

    @classmethod
    def load(cls, path, map_location="cpu") -> "Proxy":
        """Rebuild a proxy written by :meth:`save`."""
        blob = torch.load(path, map_location=map_location, weights_only=True)
        if blob.get("inputs") != list(INPUTS) or blob.get("targets") != list(TARGETS):
            raise ValueError(f"{path}: expected a proxy with inputs {list(INPUTS)} and targets "
                             f"{list(TARGETS)}, got {blob.get('inputs')} and {blob.get('targets')}")
        proxy = cls(hidden=blob["hidden"], ranges=blob["ranges"]).to(getattr(torch, blob["dtype"]))
        proxy.load_state_dict(blob["state_dict"])
        return proxy.eval()


def fit(x: torch.Tensor, y: torch.Tensor, *, hidden=(64, 64), epochs: int = 300, lr: float = 3e-3,
        batch_size: int = 512, weight_decay: float = 0.0, seed: int = 0, ranges: dict | None = None,
        dtype: torch.dtype = torch.float32, progress=None) -> tuple[Proxy, dict]:
    """Fit a :class:`Proxy` to samples by Adam on the standardised squared error.

    NaN targets (a robot that delivered nothing has no delay) are left out of the loss.
    The learning rate follows a cosine schedule to ``lr / 20``.

    :input x: ``[N, len(INPUTS)]`` raw inputs; :input y: ``[N, len(TARGETS)]``.
    :output: the proxy (eval mode) and ``{"loss": final training loss}``.
    """
    if x.ndim != 2 or x.shape[-1] != len(INPUTS):
        raise ValueError(f"x: expected [N, {len(INPUTS)}] raw inputs, got {list(x.shape)}")
    if y.ndim != 2 or y.shape != (x.shape[0], len(TARGETS)):
        raise ValueError(f"y: expected [{x.shape[0]}, {len(TARGETS)}] KPIs, got {list(y.shape)}")
    torch.manual_seed(int(seed))
    gen = torch.Generator().manual_seed(int(seed))
    proxy = Proxy(hidden, ranges).to(dtype)
    x, y = x.to(dtype), y.to(dtype)
    f = _features(x)
    finite = torch.isfinite(y)
    y0 = torch.where(finite, y, torch.zeros_like(y))
    cnt = finite.sum(0).clamp(min=1)
    y_mean = y0.sum(0) / cnt
    dev = torch.where(finite, y - y_mean, torch.zeros_like(y))
    y_std = torch.sqrt((dev ** 2).sum(0) / cnt).clamp(min=1e-12)
    proxy.x_mean.copy_(f.mean(0))
    proxy.x_std.copy_(f.std(0).clamp(min=1e-12))
    proxy.y_mean.copy_(y_mean)
    proxy.y_std.copy_(y_std)
    z = (f - proxy.x_mean) / proxy.x_std
    t = (y0 - y_mean) / y_std
    opt = torch.optim.Adam(proxy.net.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs, 1), eta_min=lr / 20)
    N = x.shape[0]
    epochs_it = range(epochs) if progress is None else progress(range(epochs))
    loss_val = float("nan")
    proxy.train()
    for _ in epochs_it:
        perm = torch.randperm(N, generator=gen)
        total, seen = 0.0, 0
        for i in range(0, N, batch_size):
            idx = perm[i:i + batch_size]
            m = finite[idx]
            err = torch.where(m, proxy.net(z[idx]) - t[idx], torch.zeros_like(t[idx]))
            loss = (err ** 2).sum() / m.sum().clamp(min=1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            seen += len(idx)
        sched.step()
        loss_val = total / max(seen, 1)
    return proxy.eval(), {"loss": loss_val}


def evaluate(proxy: Proxy, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Fit quality per KPI on samples ``(x, y)``, NaN targets left out.

    :output: ``{kpi: {"r2", "mean_rel_err", "n"}}``; ``r2 = 1 - SSE / SST`` about the
        samples' own mean, ``mean_rel_err`` the mean of ``|pred - y| / |y|`` over samples
        with ``y != 0``.
    """
    with torch.no_grad():
        pred = proxy(x).to(torch.float64)
    y = y.to(torch.float64)
    out = {}
    for i, k in enumerate(TARGETS):
        m = torch.isfinite(y[:, i])
        yi, pi = y[m, i], pred[m, i]
        sst = ((yi - yi.mean()) ** 2).sum()
        r2 = float(1.0 - ((pi - yi) ** 2).sum() / sst) if float(sst) > 0 else float("nan")
        nz = yi != 0
        mre = float(((pi[nz] - yi[nz]).abs() / yi[nz].abs()).mean()) if bool(nz.any()) else float("nan")
        out[k] = {"r2": r2, "mean_rel_err": mre, "n": int(m.sum())}
    return out


__all__ = ["INPUTS", "RANGES", "TARGETS", "Proxy", "collect", "context", "evaluate", "fit", "sample_inputs"]
