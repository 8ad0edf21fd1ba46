"""Optimise per-robot decisions of a heterogeneous fleet through a calibrated model, and score
them on the packet level (L2-legacy), against black-box optimisers running on it directly.

The pieces, one concern a module: ``fleet`` (robot classes, :func:`make_fleet`, the decisions
:class:`FleetDecisions`), ``cost`` (the one cost definition, :func:`env_cost` / :func:`fleet_cost`,
and the paired bootstrap), ``gradient`` (the bounded parameters, the temperature schedule and the
Adam loop through a model), ``score`` (:class:`Scorer` on the packet level, :class:`Budget`, each
method's clock and trace), ``surrogate`` (a neural proxy fitted for a fleet, :func:`fit_proxy`),
``methods`` (gradient, gradient through a fitted proxy, CMA-ES, TPE, hybrid, random search,
uniform policy) and ``api`` (:func:`optimise_fleet`, :func:`summarise`). No plotting here.

Usage (examples/optimise_fleet.py)::

    from isaac_net.core.diff.calibrate import Calibration
    from isaac_net import optimise as opt
    fleet = opt.make_fleet(E=4, R=8, T=30, seed=0)
    cal = Calibration.load("benchmarks/diff/results/full/calibration.json", mode="QA", sends="relaxed")
    res = opt.optimise_fleet(fleet, calibration=cal, budget=opt.Budget(wall_s=10.0), T_eval=30,
                             warmup_eval=5)
    for row in opt.summarise(res, "uniform policy"):
        print(row)
"""

from isaac_net.optimise.api import DEFAULT_COST, METHODS, optimise_fleet, summarise
from isaac_net.optimise.cost import env_cost, env_kpis, fleet_cost, paired_diff
from isaac_net.optimise.fleet import DEFAULT_CLASSES, Fleet, FleetDecisions, RobotClass, make_fleet
from isaac_net.optimise.gradient import anneal, bounded, gradient_descent, unbounded
from isaac_net.optimise.methods import (
    Result,
    cmaes,
    gradient,
    hybrid,
    proxy_gradient,
    random_search,
    tpe,
    uniform_policy,
)
from isaac_net.optimise.score import Budget, Run, Scorer, solution_at
from isaac_net.optimise.surrogate import fit_proxy, proxy_ranges

__all__ = [
    "Budget", "DEFAULT_CLASSES", "DEFAULT_COST", "Fleet", "FleetDecisions", "METHODS", "Result",
    "RobotClass", "Run", "Scorer", "anneal", "solution_at",
    "bounded", "cmaes", "env_cost", "env_kpis", "fit_proxy", "fleet_cost", "proxy_ranges",
    "gradient", "gradient_descent", "hybrid", "make_fleet", "optimise_fleet", "paired_diff", "proxy_gradient",
    "random_search", "summarise", "tpe", "unbounded", "uniform_policy",
]
