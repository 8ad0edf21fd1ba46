"""The entry point: optimise a fleet's decisions by several methods and compare them held out."""

from __future__ import annotations

import torch

from isaac_net.optimise import methods as m
from isaac_net.optimise.cost import paired_diff
from isaac_net.optimise.fleet import FleetDecisions
from isaac_net.optimise.score import Budget, Scorer

#: The methods :func:`optimise_fleet` runs, by name.
METHODS = ("uniform", "random", "gradient", "proxy", "cmaes", "tpe", "hybrid")
#: The default cost: weights of the KPIs and the penalty per unit of delivery shortfall.
DEFAULT_COST = {"weights": {"mean_delay": 1.0, "mean_aoi": 0.5, "mean_energy_j": 50.0}, "penalty": 100.0}


def optimise_fleet(fleet, *, calibration=None, methods=("uniform", "gradient", "cmaes"), cost=None,
                   budget: Budget, T_eval: int = 60, warmup_eval: int = 10, gradient_kwargs=None,
                   seed: int = 0, level_kwargs=None, proxy_kwargs=None) -> dict:
    """Run ``methods`` (of :data:`METHODS`) on ``fleet`` and return ``{name: Result}``.

    :param calibration: the :class:`~isaac_net.core.diff.calibrate.Calibration` the gradient runs
        through (None: the uncalibrated model of ``gradient_kwargs``' ``mode``/``sends``).
    :param budget: every black-box method's budget; the gradient runs its ``gradient_kwargs``
        (``iters`` etc., :func:`~isaac_net.optimise.methods.gradient`) within ``budget.wall_s``.
        The hybrid spends the same budget, the gradient's share included.
    :param T_eval, warmup_eval: steps of every packet-level rollout (training and held out).
    :param level_kwargs: more arguments of the level's engine (e.g. ``cfg``, ``backend``).
    :param proxy_kwargs: arguments of :func:`~isaac_net.optimise.fit_proxy` for ``"proxy"``
        (:func:`~isaac_net.optimise.methods.proxy_gradient`'s ``fit``): a neural proxy fitted on the
        level for this fleet (the fit's info, its wall time and rollouts among it, in the result's
        ``info["fit"]``, not in its ``wall_s``), then Adam through it (``gradient_kwargs``' ``iters``,
        ``lr`` and ``score_every``).
    """
    unknown = [x for x in methods if x not in METHODS]
    if unknown:
        raise ValueError(f"methods: unknown {unknown}; expected some of: {', '.join(METHODS)}")
    if not isinstance(budget, Budget):
        raise TypeError(f"budget: expected a Budget, got {type(budget).__name__}")
    torch.manual_seed(seed)
    decisions = FleetDecisions(fleet)
    scorer = Scorer(fleet, cost or DEFAULT_COST, T=T_eval, warmup=warmup_eval, seed=seed,
                    **(level_kwargs or {}))
    out, grad = {}, None
    for name in methods:
        if name == "uniform":
            r = m.uniform_policy(decisions, scorer)
        elif name == "random":
            r = m.random_search(decisions, scorer, budget, seed=seed)
        elif name == "gradient" or (name == "hybrid" and grad is None):
            grad = m.gradient(decisions, scorer, budget, calibration=calibration, seed=seed,
                              **(gradient_kwargs or {}))
            r = grad
        elif name == "proxy":
            adam = {k: v for k, v in (gradient_kwargs or {}).items() if k in ("iters", "lr", "score_every")}
            r = m.proxy_gradient(decisions, scorer, budget, seed=seed, fit=proxy_kwargs, **adam)
        if name == "cmaes":
            r = m.cmaes(decisions, scorer, budget, seed=seed)
        elif name == "tpe":
            r = m.tpe(decisions, scorer, budget, seed=seed)
        elif name == "hybrid":
            r = m.hybrid(decisions, scorer, budget, grad, seed=seed)
        out[r.name] = r
    return out


def summarise(results: dict, baseline: str, *, n_boot: int = 2000, seed: int = 0) -> list[dict]:
    """One row per result: held-out mean cost, wall time, rollouts, and against ``baseline`` the
    paired difference of the per-cell costs with its bootstrap 95 % interval and the share of
    cells better."""
    if baseline not in results:
        raise ValueError(f"baseline: {baseline!r} is not one of the results {sorted(results)}")
    base = results[baseline].heldout_cost
    rows = []
    for name, r in results.items():
        diff, lo, hi = paired_diff(r.heldout_cost, base, n_boot, seed)
        rows.append({"method": name, "cost": float(r.heldout_cost.mean()), "wall_s": r.wall_s,
                     "rollouts": r.rollouts, "diff": diff, "diff_lo": lo, "diff_hi": hi,
                     "better_cells": float((r.heldout_cost < base).double().mean())})
    return rows
