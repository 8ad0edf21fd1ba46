"""The cost of a rollout and its scoring on a discrete level: the one definition the studies and
the fleet optimisers share.

Cost per cell (lower is better), on any model or level (the rollouts return the same keys)::

    cost = w_delay * mean_delay + w_aoi * mean_aoi + w_energy * mean_energy_j
           + penalty * max(delivery_min - delivery_ratio, 0)

(delay and AoI in control steps, energy in J per robot per step; the KPIs of the cell's robots:
delay and delivery totals over totals, AoI and energy means, as the KPI registry reduces them).
A heterogeneous fleet (:class:`~isaac_net.optimise.fleet.Fleet`) sums this cost per robot class,
each with its own weight and delivery floor (:func:`fleet_cost`).
"""

from __future__ import annotations

import numpy as np
import torch

from isaac_net.core import kpi

#: The per-cell KPI means, in the registry's order.
KPIS = kpi.BATCH_KEYS


def env_kpis(res: dict, kpis: tuple = kpi.KPIS) -> dict:
    """Per-cell KPIs ``{batch_key: [E]}`` from a rollout's per-robot totals ``res`` (``[E, R]``; the
    KPI registry's batch reductions of the entries ``kpis``, default all)."""
    return kpi.grouped_batch_kpis(res, res["offered"].shape[0], kpis=kpis)


def env_cost(k: dict, c: dict) -> torch.Tensor:
    """The cost ``[E]`` of per-cell KPIs ``k`` (``{batch_key: [E]}``) under the cost config ``c``
    (``weights``: ``{mean_delay, mean_aoi, mean_energy_j}``, ``delivery_min``, ``penalty``)."""
    w = c["weights"]
    shortfall = torch.clamp(float(c["delivery_min"]) - k["delivery_ratio"], min=0.0)
    return (w["mean_delay"] * k["mean_delay"] + w["mean_aoi"] * k["mean_aoi"]
            + w["mean_energy_j"] * k["mean_energy_j"] + float(c["penalty"]) * shortfall)


def fleet_cost(res: dict, fleet, cost: dict, kpis: tuple = kpi.KPIS) -> torch.Tensor:
    """The cost ``[E]`` of a heterogeneous fleet: the sum over robot classes of the class weight
    times :func:`env_cost` of the class's robots with the class's ``delivery_min``.

    :input res: a rollout's per-robot result, ``[E, R]`` per key, robots in ``fleet``'s order.
    :param fleet: the :class:`~isaac_net.optimise.fleet.Fleet` (its ``class_slices``).
    :param cost: ``weights`` and ``penalty`` as :func:`env_cost` (``delivery_min`` is per class).
    :param kpis: the registry entries ``res`` holds totals of (the proxy's: ``kpi.PROXY_KPIS``).
    With one class of weight 1 this is :func:`env_cost` of :func:`env_kpis`, bit for bit.
    """
    total = None
    for cls, sl in zip(fleet.classes, fleet.class_slices, strict=True):
        part = {n: v[:, sl] for n, v in res.items() if isinstance(v, torch.Tensor) and v.ndim == 2}
        c = {"weights": cost["weights"], "penalty": cost["penalty"], "delivery_min": cls.delivery_min}
        term = cls.weight * env_cost(env_kpis(part, kpis), c)
        total = term if total is None else total + term
    return total


def chunked_rollouts(level, T, warmup, dec, u, reduce, *, cfg, seed, dtype, chunk=None,
                     **engine_kwargs) -> list:
    """``reduce(result)`` of rollouts of decisions ``dec`` (``p, B, pos, tx_dbm``, each ``[E, R]`` or
    ``[E, R, 2]``) on a discrete level with send uniforms ``u`` ``[>= T, E, R]``, the cells in chunks
    of ``chunk`` (default all in one rollout): one entry per chunk, in cell order."""
    from isaac_net.core.diff.reference import discrete_rollout

    E = dec["p"].shape[0]
    chunk = E if chunk is None else int(chunk)
    parts = []
    for s in range(0, E, chunk):
        sl = slice(s, s + chunk)
        res = discrete_rollout(level, T, dec["p"][sl], dec["B"][sl], pos=dec["pos"][sl],
                               tx_dbm=dec["tx_dbm"][sl], warmup=warmup, u=u[:T, sl], cfg=cfg, dtype=dtype,
                               seed=seed, device=dec["p"].device, **engine_kwargs)
        parts.append(reduce(res))
    return parts


def discrete_score(level, T, warmup, dec, u, *, cfg, seed, dtype, chunk=None) -> dict:
    """Per-cell KPIs ``{batch_key: [E]}`` (on the CPU, float64) of decisions ``dec`` (``p, B, pos,
    tx_dbm``, each ``[E, R]`` or ``[E, R, 2]``) on a discrete level with send uniforms ``u``
    ``[T, E, R]``; cells in chunks of ``chunk`` (default all in one rollout)."""
    parts = chunked_rollouts(level, T, warmup, dec, u, env_kpis, cfg=cfg, seed=seed, dtype=dtype, chunk=chunk)
    return {k: torch.cat([p[k] for p in parts]).cpu().double() for k in KPIS}


def paired_diff(a: torch.Tensor, b: torch.Tensor, n_boot: int, seed: int) -> tuple[float, float, float]:
    """Mean of ``a - b`` (``[E]`` each, paired by cell) and its percentile bootstrap 95 % interval
    (``n_boot`` resamples, seeded)."""
    import scipy.stats  # here, not at the top: it takes longer to import than the rest of the package

    d = (a - b).numpy()
    if len(d) < 2 or float(np.ptp(d)) == 0.0:
        return float(d.mean()), float(d.mean()), float(d.mean())
    res = scipy.stats.bootstrap((d,), np.mean, n_resamples=n_boot, confidence_level=0.95, method="percentile",
                                random_state=np.random.default_rng(seed))
    return float(d.mean()), float(res.confidence_interval.low), float(res.confidence_interval.high)
