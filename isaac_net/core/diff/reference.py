"""Discrete reference rollouts: a real engine level with binary sends ``u < p``."""

from __future__ import annotations

import torch

from isaac_net.core import _validate
from isaac_net.core.kpi import KpiAccumulator, rollout_dims, send_uniforms
from isaac_net.core.levels import make_engine


def discrete_rollout(level: str, T: int, p, B, *, pos=None, tx_dbm=None, snr_db=None, deadline=None,
                     warmup: int = 0, u=None, generator: torch.Generator | None = None, cfg=None,
                     dtype: torch.dtype = torch.float64, device="cpu", seed: int | None = None,
                     engine=None, **engine_kwargs) -> dict:
    """Run the engine level ``level`` for ``T`` steps with binary sends ``u_t < p``.

    Same inputs and returned keys as :func:`isaac_net.core.diff.rollout`; with the same
    ``u`` both see identical sends. ``seed`` seeds the level's own randomness
    (L2-legacy). Pass ``engine`` to reuse a built engine (it is reset first): an engine of
    level ``level`` and of the inputs' ``[E, R]``, built with the ``cfg`` passed (if any).

    KPIs as :func:`isaac_net.core.diff.rollout`: the engine starts empty, the messages queued
    at the start of step ``warmup`` count as offered (``0 <= delivery_ratio <= 1``); the batch
    ``mean_delay`` is 0 when nothing was delivered, ``delivery_ratio`` 0 when nothing was
    offered; per robot ``delay`` / ``delivery`` are NaN there.
    """
    E, R = rollout_dims(T, warmup, p=p, B=B, tx_dbm=tx_dbm, snr_db=snr_db, deadline=deadline,
                        pos=pos[..., 0] if isinstance(pos, torch.Tensor) else None)
    if engine is None:
        engine = make_engine(level, E, R, device, cfg=cfg, dtype=dtype, seed=seed, **engine_kwargs)
    else:
        _check_engine(engine, level, E, R, cfg)
        engine.reset()
    dt, dev = engine.dtype, engine.device
    p = _validate.per_robot(p, "p", E, R, dt, dev)
    _validate.check_range(p, "p", 0.0, 1.0, "probabilities in [0, 1]")
    u = send_uniforms(u, T, E, R, dt, dev, generator)
    if deadline is not None:
        deadline = _validate.per_robot(deadline, "deadline", E, R, dt, dev)
    acc = KpiAccumulator(warmup)
    with torch.no_grad():
        for t in range(T):
            send = (u[t] < p).to(dt)
            acc.add(engine.step(send, B, snr_db=snr_db, pos=pos, tx_dbm=tx_dbm, deadline=deadline))
    return acc.result()


def _check_engine(engine, level: str, E: int, R: int, cfg) -> None:
    """A reused engine must be the level and size the call asks for: never run one level as another."""
    name = getattr(engine, "name", None)
    if name != level:
        raise ValueError(f"engine: expected an engine of level {level!r}, got {name!r} "
                         f"({type(engine).__name__})")
    if (engine.E, engine.R) != (E, R):
        raise ValueError(f"engine: expected an engine of E={E}, R={R} (the inputs' [E, R]), got "
                         f"E={engine.E}, R={engine.R}")
    if cfg is not None and engine.cfg != cfg:
        raise ValueError("engine: built with another CellConfig than the cfg passed")
