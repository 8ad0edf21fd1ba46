"""Gradient descent on bounded decisions through a differentiable model.

The decisions are a small object (``init() -> theta``, ``__call__(theta) -> dec``,
``extra_cost(dec) -> [E]``): Adam runs on the unconstrained parameters ``theta`` and each decision
is ``lo + (hi - lo) sigmoid(theta)`` (:func:`bounded`). The model's temperature ``tau`` is annealed
geometrically (:func:`anneal`), a calibrated model's not below its fitted ``Calibration.tau``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def anneal(tau_start: float, tau_end: float, i: int, n: int, tau_min: float = 0.0) -> float:
    """Geometric schedule from ``tau_start`` (i = 0) to ``tau_end`` (i = n - 1), not below ``tau_min``."""
    if n <= 1:
        return max(tau_end, tau_min)
    return max(tau_start * (tau_end / tau_start) ** (i / (n - 1)), tau_min)


def bounded(theta: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """``lo + (hi - lo) sigmoid(theta)``: a decision in ``(lo, hi)`` from an unconstrained parameter."""
    return lo + (hi - lo) * torch.sigmoid(theta)


def unbounded(x: float, lo: float, hi: float) -> float:
    """The inverse of :func:`bounded`: the parameter whose decision is ``x`` (``lo < x < hi``)."""
    z = (x - lo) / (hi - lo)
    return math.log(z / (1.0 - z))


def fluid_cost(cost: Callable, *, mode: str, cfg, sends: str, T: int, warmup: int, lam: float,
               generator: torch.Generator, compile: bool = False) -> Callable:
    """A model cost ``(dec, tau) -> [E]``: a rollout of ``DiffFluid(mode, tau, cfg)`` (L1D or QAD)
    for ``T`` steps (``warmup`` not counted) with the decisions ``dec`` (``p, B, pos, tx_dbm``) and
    ``cost(res) -> [E]`` of its result. Relaxed or binary sends draw fresh uniforms ``[T, E, R]``
    from ``generator`` each call (on the CPU, then moved); mean-field sends draw none."""
    from isaac_net.core.diff import DiffFluid, rollout

    def model_cost(dec: dict, tau: float) -> torch.Tensor:
        E, R = dec["B"].shape
        dtype, dev = dec["B"].dtype, dec["B"].device
        net = DiffFluid(E, R, dev, mode=mode, tau=tau, cfg=cfg, dtype=dtype, compile=compile)
        u = None
        if sends != "mean_field":
            u = torch.rand(T, E, R, generator=generator, dtype=dtype).to(dev)
        res = rollout(net, T, dec["p"], dec["B"], pos=dec["pos"], tx_dbm=dec["tx_dbm"], warmup=warmup,
                      sends=sends, u=u, lam=lam)
        return cost(res)

    return model_cost


def proxy_cost(cost: Callable, proxy, cfg) -> Callable:
    """A model cost ``(dec, tau) -> [E]`` through a neural proxy (``isaac_net.core.diff.proxy``):
    its per-robot KPIs of the decisions ``dec`` (``p, B, pos, tx_dbm``; the SNR from position and
    power through :func:`isaac_net.core.radio.snr_db` in ``cfg``) as expected totals per robot,
    and ``cost(totals) -> [E]`` of them (e.g. ``fleet_cost`` with ``kpis=kpi.PROXY_KPIS``). The
    proxy predicts expectations: no sends are drawn, and ``tau`` is not used."""
    from isaac_net.core import kpi, radio

    def model_cost(dec: dict, tau: float) -> torch.Tensor:
        k = proxy.predict(dec["p"], dec["B"], radio.snr_db(dec["pos"], dec["tx_dbm"], cfg))
        return cost(kpi.expected_totals(dec["p"], k, kpi.PROXY_KPIS))

    return model_cost


def gradient_descent(decisions, model_cost: Callable, *, iters: int, lr: float, tau_start: float,
                     tau_end: float, tau_min: float = 0.0, score: Callable | None = None,
                     score_every: int = 0, stop: Callable | None = None, progress=None
                     ) -> tuple[dict, list]:
    """Adam (learning rate ``lr``) on ``decisions``' parameters for ``iters`` iterations of
    ``model_cost(dec, tau) + decisions.extra_cost(dec)`` summed over cells.

    :param score: ``score(dec) -> [E]`` held-out cost of the iterate (detached), every
        ``score_every`` iterations and at the last; its mean is the row's ``level_cost_heldout``.
    :param stop: ``stop(i) -> bool`` asked before iteration ``i`` (a budget); True ends the run.
    :param progress: an iterable wrapper (e.g. ``tqdm``) or None.
    :returns: the final decisions (detached) and one row per iteration: ``iter``, ``tau``,
        ``model_cost`` (mean over cells after the iteration's step), ``level_cost_heldout`` where scored.
    """
    theta = decisions.init()
    opt = torch.optim.Adam(theta.values(), lr=lr)
    hist = []
    for i in (range(iters) if progress is None else progress(range(iters))):
        if stop is not None and stop(i):
            break
        tau = anneal(tau_start, tau_end, i, iters, tau_min)
        dec = decisions(theta)
        cost = model_cost(dec, tau) + decisions.extra_cost(dec)
        opt.zero_grad()
        cost.sum().backward()
        opt.step()
        row = {"iter": i, "tau": tau, "model_cost": float(cost.detach().mean())}
        if score is not None and score_every and (i % score_every == 0 or i == iters - 1):
            with torch.no_grad():
                d = {k: v.detach() for k, v in decisions(theta).items()}
            row["level_cost_heldout"] = float(score(d).mean())
        hist.append(row)
    with torch.no_grad():
        return {k: v.detach() for k, v in decisions(theta).items()}, hist
