"""Rollouts of DiffFluid with mean-field, relaxed-Bernoulli or binary sends."""

from __future__ import annotations

from collections.abc import Callable

import torch

from isaac_net.core import _validate
from isaac_net.core.diff import relax
from isaac_net.core.diff.model import DiffFluid
from isaac_net.core.kpi import KpiAccumulator, check_horizon, send_uniforms

#: The send models a rollout can use (its ``sends`` argument).
SEND_MODELS = ("mean_field", "relaxed", "binary")


def rollout(net: DiffFluid, T: int, p, B, *, pos=None, tx_dbm=None, snr_db=None, deadline=None,
            warmup: int = 0, sends: str = "mean_field", u=None, lam: float | None = None,
            generator: torch.Generator | None = None, step_by_step: bool = False,
            on_step: Callable[[dict], None] | None = None) -> dict:
    """Run ``net`` for ``T`` control steps with constant decisions and return its KPIs.

    :input p: ``[E, R]`` send probability per control step, in [0, 1].
    :input B: ``[E, R]`` message size, bytes.
    :input pos: ``[E, R, 2]`` m, with :input tx_dbm: ``[E, R]`` dBm; or :input snr_db: ``[E, R]`` dB.
    :input deadline: ``[E, R]`` control steps (continuous), default the timeout.
    :param sends: ``"mean_field"`` (the send weight is ``p``; in a cell with ``load_spread > 0``
        scaled per step by the cell's load factor, ``relax.spread_sends``), ``"relaxed"``
        (``relaxed_bernoulli(p, u_t, lam)``, pathwise gradient) or ``"binary"`` (``u_t < p``,
        no gradient in ``p``, the discrete levels' sends).
    :input u: ``[T, E, R]`` fixed uniforms (drawn from ``generator`` when None); relaxed and
        binary sends only (with ``"mean_field"`` a given ``u`` is a ValueError, not ignored).
    :param lam: relaxed-Bernoulli temperature, finite and >= 0 (default 0.1).
    :param warmup: steps ``t < warmup`` are run but not counted. The messages queued at the
        start of step ``warmup`` (at ``warmup = 0``: those in ``net``'s state, 0 after a reset)
        count as offered, so ``0 <= delivery_ratio <= 1``.
    Each call starts a graph of its own: the state ``net`` holds when it starts (the previous
    rollout's end, unless :meth:`DiffFluid.reset`) is taken as a constant, as after
    :meth:`DiffFluid.detach`, so a second rollout backpropagates without the first one's graph.
    Backpropagation through time across calls: ``net.step`` / ``net.advance`` in a loop.
    :param step_by_step: run ``net.advance`` step by step even where the model runs a rollout as one
        node (:attr:`DiffFluid.fused_rollout`: QAD); the same KPIs (to time or check the step).
    :param on_step: called with each step's KPIs ``{name: [E, R]}`` as :meth:`DiffFluid.advance`
        returns them (the warm-up's steps too; e.g. ``energy_j``, the transmit energy of the step);
        the rollout then runs step by step.

    :output: per robot ``[E, R]``: ``delay, delivery, aoi, energy_j`` and the totals
        ``offered, delivered, delay_sum, timeouts, overflow, queued_msgs``; batch means
        ``mean_delay, delivery_ratio, mean_aoi, mean_energy_j`` (0-dim). Per robot, ``delay``
        is NaN where nothing was delivered and ``delivery`` NaN where nothing was offered;
        the batch ``mean_delay`` is 0 when nothing was delivered and ``delivery_ratio`` 0
        when nothing was offered (finite, with finite gradients): see
        :class:`isaac_net.core.kpi.KpiAccumulator`.
    """
    if not isinstance(net, DiffFluid):
        raise TypeError(f"net: expected a DiffFluid, got {type(net).__name__}")
    if sends not in SEND_MODELS:
        raise ValueError(f"unknown sends {sends!r}; expected one of: {', '.join(SEND_MODELS)}")
    if not isinstance(step_by_step, bool):
        raise TypeError(f"step_by_step: expected a bool, got {type(step_by_step).__name__}")
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step: expected None or a callable taking a step's KPIs, got {on_step!r}")
    E, R, dt, dev = net.E, net.R, net.dtype, net.device
    check_horizon(T, warmup)
    p = _validate.per_robot(p, "p", E, R, dt, dev)
    _validate.check_range(p, "p", 0.0, 1.0, "probabilities in [0, 1]")
    lam = 0.1 if lam is None else _validate.temperature(lam, "lam")
    if sends != "mean_field" and net.cfg.mf_backlog_closure:
        raise ValueError(f"sends: the cell's mf_backlog_closure is mean-field sends' (a sampled robot holds "
                         f"whole messages already); expected sends='mean_field', got {sends!r}")
    if sends != "mean_field":
        u = send_uniforms(u, T, E, R, dt, dev, generator)
    elif u is not None:
        raise ValueError("u: mean-field sends use no uniforms; pass sends='relaxed' or 'binary' with u, "
                         "or u=None")
    step_inputs = net.inputs(B, snr_db=snr_db, pos=pos, tx_dbm=tx_dbm, deadline=deadline)
    net.detach()  # the previous rollout's graph may be freed already (its backward ran)
    acc = KpiAccumulator(warmup, queued_start=net.state.w.sum(-1) if warmup == 0 else None)
    if sends == "mean_field":
        spread = net.cfg.load_spread
        send = relax.spread_sends(p, T, spread) if spread > 0 else p
    elif sends == "relaxed":
        send = relax.relaxed_bernoulli(p, u[:T], lam)  # [T, E, R], as T draws from u[t]
    else:
        send = (u[:T] < p).to(dt)
    # QAD: the whole rollout as one node (the same steps)
    if net.fused_rollout and not step_by_step and on_step is None:
        acc.set_totals(*net.advance_rollout(send, step_inputs, T, warmup), num_seen=T)
        return acc.result()
    for t in range(T):
        out = net.advance(send if send.dim() == 2 else send[t], step_inputs)
        if on_step is not None:
            on_step(out)
        acc.add(out)
    return acc.result()
