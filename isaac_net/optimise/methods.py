"""The optimisers of a fleet's decisions, each under a :class:`~isaac_net.optimise.score.Budget`
and each returning a :class:`Result` whose solution is scored held out on the packet level.

* :func:`gradient`: Adam through a (calibrated) L1D / QAD model; no packet-level rollouts.
* :func:`proxy_gradient`: a neural proxy fitted on the packet level for the fleet, then Adam through it.
* :func:`cmaes`: pycma's CMA-ES on the packet level, one ``cma.CMAEvolutionStrategy`` per cell
  (library defaults, default population), every cell's candidates in one rollout a generation.
* :func:`tpe`: Optuna's TPE sampler (ask/tell), one study per cell, every cell's trials of a round
  in one rollout. Why TPE for the second family: a model-based method unlike CMA-ES and the
  gradient, run with the library's defaults; it batches across cells as CMA-ES does (one study
  per cell, the cells of a round in one rollout); SPSA batches as well but has no library
  implementation and its gains would be ours to tune (a baseline we could weaken).
* :func:`hybrid`: the gradient's solution as the start of a short CMA-ES with a small step.
* :func:`random_search` and :func:`uniform_policy`: the baselines, on the same scoring.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from isaac_net.optimise.score import Budget, Run, Scorer

#: The uniform policies :func:`uniform_policy` searches by default: p x tx_dbm.
UNIFORM_GRID = {"p": (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
                "tx_dbm": (23.0, 20.0, 17.0, 14.0, 11.0, 8.0, 5.0)}


@dataclasses.dataclass
class Result:
    """One method's outcome.

    :attr decisions: ``p``, ``tx_dbm`` ``[E, R]`` (and ``B``, ``pos``) of the solution.
    :attr heldout_cost: ``[E]`` its held-out cost on the packet level.
    :attr wall_s: wall time spent (s, held-out scoring excluded); :attr rollouts: training
        cell-rollouts on the packet level; :attr trace: see :meth:`Run.record`; :attr info: extras.
    """

    name: str
    decisions: dict
    heldout_cost: torch.Tensor
    wall_s: float
    rollouts: int
    trace: list
    info: dict = dataclasses.field(default_factory=dict)


def _finish(name: str, run: Run, dec: dict, **info) -> Result:
    wall, rollouts = run.wall_s, run.rollouts
    cost = run.record(dec)
    return Result(name, {k: v.detach() for k, v in dec.items()}, cost, wall, rollouts, run.trace, info)


def gradient(decisions, scorer: Scorer, budget: Budget, *, calibration=None, mode: str = "QA",
             sends: str = "relaxed", cfg=None, iters: int = 100, lr: float = 0.1, T: int = 20,
             warmup: int = 4, tau_start: float = 0.2, tau_end: float = 0.02, lam: float = 0.1,
             score_every: int = 10, seed: int = 0, name: str | None = None, compile: bool = False,
             proxy=None) -> Result:
    """Adam through L1D / QAD (``mode``, ``sends``; with ``calibration``, a
    :class:`~isaac_net.core.diff.calibrate.Calibration`, its model, cell constants and temperature
    floor) for ``iters`` iterations of ``T``-step rollouts, or until ``budget``'s wall time.
    ``compile``: the model's compiled step (``DiffFluid(compile=True)``; its first call compiles,
    within the wall time). With ``proxy`` (a fitted :class:`~isaac_net.core.diff.proxy.Proxy` of
    the fleet's ``R``, e.g. :func:`~isaac_net.optimise.surrogate.fit_proxy`; fitted and run in one:
    :func:`proxy_gradient`), Adam runs through its predictions instead (``calibration``, ``mode``,
    ``sends`` and the temperatures unused)."""
    from isaac_net.core import CellConfig, kpi
    from isaac_net.optimise.cost import fleet_cost
    from isaac_net.optimise.gradient import fluid_cost, proxy_cost

    fleet = decisions.fleet
    cfg = CellConfig() if cfg is None else cfg
    if proxy is not None:
        if calibration is not None:
            raise ValueError("proxy: expected either a proxy or a calibration, got both")
        model_cost = proxy_cost(lambda tot: fleet_cost(tot, fleet, scorer.cost, kpi.PROXY_KPIS), proxy, cfg)
        return _descend(decisions, scorer, budget, model_cost, name or "gradient, neural proxy", iters=iters,
                        lr=lr, tau_start=tau_start, tau_end=tau_end, tau_min=0.0, score_every=score_every)
    tau_min = 0.0
    if calibration is not None:
        calibration = calibration.at(fleet.R)  # a FleetCalibration: the constants for this fleet size
        mode, sends, tau_min = calibration.mode, calibration.sends, calibration.tau
        cfg = calibration.apply(cfg, R=fleet.R)
    name = name or f"gradient, {mode}D {sends.replace('_', '-')}" + (", calibrated" if calibration else "")
    model_cost = fluid_cost(lambda res: fleet_cost(res, fleet, scorer.cost), mode=mode, cfg=cfg, sends=sends,
                            T=T, warmup=warmup, lam=lam, generator=torch.Generator().manual_seed(seed + 1),
                            compile=compile)
    return _descend(decisions, scorer, budget, model_cost, name, iters=iters, lr=lr, tau_start=tau_start,
                    tau_end=tau_end, tau_min=tau_min, score_every=score_every, mode=mode, sends=sends)


#: Arguments of :func:`~isaac_net.optimise.surrogate.fit_proxy` that :func:`proxy_gradient` takes from
#: its scorer and seed, not from ``fit``.
_FIT_FROM_SCORER = ("decisions", "level", "cfg", "seed")


def proxy_gradient(decisions, scorer: Scorer, budget: Budget, *, seed: int = 0, iters: int = 100,
                   lr: float = 0.1, score_every: int = 10, fit: dict | None = None) -> Result:
    """A neural proxy fitted for ``decisions``' fleet on the scorer's level and cell
    (:func:`~isaac_net.optimise.surrogate.fit_proxy`), then Adam through it (:func:`gradient` with
    ``proxy=``) within ``budget``.

    :param scorer: the :class:`~isaac_net.optimise.score.Scorer`; the fit's rollouts run on its
        ``level`` with its ``cfg``, the descent's iterates are scored by it.
    :param seed: the fit's (its rollouts and training) and the descent's.
    :param iters, lr, score_every: Adam's iterations, step size and held-out scoring interval
        (as :func:`gradient`'s).
    :param fit: the other arguments of ``fit_proxy`` (``robots``, ``test_share``, ``T``, ``warmup``,
        ``load_max``, ``hidden``, ``epochs``, ``lr``: the fit's learning rate, not Adam's,
        ``batch_size``, ``batch_cells``); None: its defaults. ``level``, ``cfg`` and ``seed`` are the
        scorer's and ``seed``.
    :returns: the :class:`Result` ``"gradient, neural proxy"``: its ``wall_s`` and ``rollouts`` are
        the descent's alone; ``info["fit"]`` is the fit's whole info (``cells``, ``test_cells``,
        ``rollouts``, ``wall_collect_s``, ``wall_fit_s``, ``wall_s``, ``ranges``, ``heldout``: see
        ``fit_proxy``), what a user pays once per cell configuration, as for a calibration.
    """
    import inspect

    from isaac_net.optimise.surrogate import fit_proxy

    if not isinstance(scorer, Scorer):
        raise TypeError(f"scorer: expected a Scorer (its level and cfg fit the proxy), "
                        f"got {type(scorer).__name__}")
    if not isinstance(budget, Budget):
        raise TypeError(f"budget: expected a Budget, got {type(budget).__name__}")
    if fit is not None and not isinstance(fit, dict):
        raise TypeError(f"fit: expected a dict of fit_proxy's arguments, got {type(fit).__name__}")
    fit = fit or {}
    known = [k for k in inspect.signature(fit_proxy).parameters if k not in _FIT_FROM_SCORER]
    bad = sorted(k for k in fit if k not in known)
    if bad:
        raise ValueError(f"fit: unknown settings {bad} (level, cfg and seed are the scorer's and seed); "
                         f"expected some of: {', '.join(known)}")
    proxy, info = fit_proxy(decisions, level=scorer.level, cfg=scorer.cfg, seed=seed, **fit)
    res = gradient(decisions, scorer, budget, proxy=proxy, cfg=scorer.cfg, iters=iters, lr=lr,
                   score_every=score_every, seed=seed)
    res.info["fit"] = info
    return res


def _descend(decisions, scorer: Scorer, budget: Budget, model_cost, name: str, *, iters: int, lr: float,
             tau_start: float, tau_end: float, tau_min: float, score_every: int, **info) -> Result:
    """Adam on ``model_cost`` within ``budget``, the iterates scored held out every ``score_every``."""
    from isaac_net.optimise.gradient import gradient_descent

    run = Run(scorer, budget)
    with torch.no_grad():
        run.record(decisions(decisions.init()))
    dec, hist = gradient_descent(decisions, model_cost, iters=iters, lr=lr, tau_start=tau_start,
                                 tau_end=tau_end, tau_min=tau_min, score=run.record, score_every=score_every,
                                 stop=lambda i: run.exhausted())
    return _finish(name, run, dec, iters=len(hist), **info)


def _cma_options(seed: int, cell: int) -> dict:
    rng = np.random.default_rng([seed, cell])
    # pycma draws from the global numpy state unless given ``randn``: one stream per cell keeps the
    # cells independent of each other and of the order they are asked in.
    return {"bounds": [0.0, 1.0], "randn": lambda *shape: rng.standard_normal(shape), "seed": np.nan,
            "verbose": -9, "verb_log": 0, "verb_disp": 0}


def cmaes(decisions, scorer: Scorer, budget: Budget, *, x0=None, sigma0: float = 0.25, seed: int = 0,
          score_every: int = 5, name: str = "CMA-ES", offset_s: float = 0.0, offset_rollouts: int = 0,
          objective=None) -> Result:
    """CMA-ES per cell on the unit cube (pycma defaults, ``bounds [0, 1]``), from ``x0`` ``[E, 2 R]``
    (default the decisions' start) with step ``sigma0``; each generation asks every cell, scores
    the candidates of all cells in one training rollout (candidate-major) and tells each cell its
    column, until ``budget``. The solution is each cell's ``result.xfavorite``. The clock starts
    after pycma is imported; ``offset_s`` and ``offset_rollouts`` are charged up front (:class:`Run`).

    :param objective: ``x [n E, 2 R] -> cost [n, E]`` (torch) instead of the scorer's training
        cost, its ``n E`` counted as rollouts (a stand-in for the level in tests).
    """
    import cma

    E = decisions.fleet.E
    x0 = decisions.to_unit(decisions(decisions.init())) if x0 is None else torch.as_tensor(x0).double()
    if tuple(x0.shape) != (E, 2 * decisions.fleet.R):
        raise ValueError(f"x0: expected [{E}, {2 * decisions.fleet.R}], got {list(x0.shape)}")
    if not (isinstance(sigma0, (int, float)) and 0 < sigma0 <= 1):
        raise ValueError(f"sigma0: expected a step in (0, 1] of the unit cube, got {sigma0!r}")
    custom = objective is not None
    objective = objective or (lambda x: scorer.train(decisions.from_unit(x)))
    ess = [cma.CMAEvolutionStrategy(x0[e].tolist(), float(sigma0), _cma_options(seed, e)) for e in range(E)]
    run = Run(scorer, budget, offset_s=offset_s, offset_rollouts=offset_rollouts)
    run.record(decisions.from_unit(x0))
    favorite = lambda: np.stack([es.result.xfavorite for es in ess])  # noqa: E731
    gens = 0
    while not run.exhausted(next_rollouts=ess[0].popsize * E):
        cands = [np.asarray(es.ask()) for es in ess]  # E x [n, d]
        costs = objective(np.stack(cands, 1).reshape(-1, x0.shape[1])).numpy()  # [n, E]
        if custom:
            run.charge(costs.size)
        for e, es in enumerate(ess):
            es.tell(list(cands[e]), costs[:, e].tolist())
        gens += 1
        if score_every and gens % score_every == 0:
            run.record(decisions.from_unit(favorite()))
    return _finish(name, run, decisions.from_unit(favorite()), generations=gens, popsize=ess[0].popsize,
                   sigma0=float(sigma0))


def hybrid(decisions, scorer: Scorer, budget: Budget, start: Result, *, sigma0: float = 0.05,
           seed: int = 0, score_every: int = 5) -> Result:
    """CMA-ES (:func:`cmaes`) from the solution of ``start`` (a gradient :class:`Result`) with the
    small step ``sigma0``; ``start``'s wall time and rollouts are charged to the budget and trace."""
    x0 = decisions.to_unit(start.decisions)
    res = cmaes(decisions, scorer, budget, x0=x0, sigma0=sigma0, seed=seed, score_every=score_every,
                name=f"hybrid ({start.name} + CMA-ES)", offset_s=start.wall_s, offset_rollouts=start.rollouts)
    res.info["start"] = start.name
    return res


def tpe(decisions, scorer: Scorer, budget: Budget, *, trials_per_round: int = 1, seed: int = 0,
        score_every: int = 10, name: str = "TPE (Optuna)") -> Result:
    """Optuna's TPE sampler (defaults) per cell, with ask/tell on the unit cube: the decisions'
    start is each study's first trial; each round asks ``trials_per_round`` trials of every cell
    and scores them in one training rollout, until ``budget``. The solution is each cell's best
    trial (training cost)."""
    import optuna

    fleet = decisions.fleet
    E, d = fleet.E, 2 * fleet.R
    keys = [f"x{i:03d}" for i in range(d)]
    dist = {k: optuna.distributions.FloatDistribution(0.0, 1.0) for k in keys}
    x0 = decisions.to_unit(decisions(decisions.init()))
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        studies = [optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed * 100_003 + e))
                   for e in range(E)]
        for e, st in enumerate(studies):
            st.enqueue_trial(dict(zip(keys, x0[e].tolist(), strict=True)))
        run = Run(scorer, budget)
        run.record(decisions.from_unit(x0))
        best = lambda: torch.tensor([[st.best_params[k] for k in keys] for st in studies])  # noqa: E731
        rounds = 0
        while not run.exhausted(next_rollouts=trials_per_round * E):
            trials = [[st.ask(dist) for _ in range(trials_per_round)] for st in studies]
            x = torch.tensor([[[t.params[k] for k in keys] for t in ts] for ts in trials])  # [E, n, d]
            costs = scorer.train(decisions.from_unit(x.transpose(0, 1).reshape(-1, d)))  # [n, E]
            for e, st in enumerate(studies):
                for j, t in enumerate(trials[e]):
                    st.tell(t, float(costs[j, e]))
            rounds += 1
            if score_every and rounds % score_every == 0:
                run.record(decisions.from_unit(best()))
        return _finish(name, run, decisions.from_unit(best()), rounds=rounds,
                       trials_per_round=trials_per_round)
    finally:
        optuna.logging.set_verbosity(level)


def random_search(decisions, scorer: Scorer, budget: Budget, *, per_round: int = 16, seed: int = 0,
                  score_every: int = 1, name: str = "random search") -> Result:
    """Candidates uniform on the decisions' unit cube (so p log-uniform with ``p_scale="log"``),
    ``per_round`` per cell per training rollout, the best per cell (training cost) kept, until
    ``budget``. The start is the first candidate (scored first, kept unless beaten), as TPE's."""
    E = decisions.fleet.E
    gen = torch.Generator().manual_seed(seed + 2)
    run = Run(scorer, budget)
    best = decisions.to_unit(decisions(decisions.init()))
    run.record(decisions.from_unit(best))
    best_cost = scorer.train(decisions.from_unit(best))[0]
    rounds = 0
    while not run.exhausted(next_rollouts=per_round * E):
        x = torch.rand(per_round * E, best.shape[1], generator=gen, dtype=torch.float64)
        c = scorer.train(decisions.from_unit(x))  # [n, E]
        cmin, arg = c.min(0)
        better = cmin < best_cost
        pick = x.reshape(per_round, E, -1)[arg, torch.arange(E)]
        best = torch.where(better[:, None], pick, best)
        best_cost = torch.where(better, cmin, best_cost)
        rounds += 1
        if score_every and rounds % score_every == 0:
            run.record(decisions.from_unit(best))
    return _finish(name, run, decisions.from_unit(best), candidates=rounds * per_round)


def uniform_policy(decisions, scorer: Scorer, *, grid: dict | None = None, chunk_policies: int = 16,
                   name: str = "uniform policy") -> Result:
    """The best uniform policy: every ``(p, tx_dbm)`` of ``grid`` (default :data:`UNIFORM_GRID`)
    for all robots of all cells, scored with the training sends; the lowest mean cost is kept."""
    grid = UNIFORM_GRID if grid is None else grid
    if not isinstance(grid, dict) or set(grid) != {"p", "tx_dbm"}:
        raise ValueError(f"grid: expected a dict with keys p and tx_dbm, got {grid!r}")
    policies = [(float(p), float(t)) for p in grid["p"] for t in grid["tx_dbm"]]
    run = Run(scorer, Budget(rollouts=len(policies) * decisions.fleet.E))
    costs = []
    for s in range(0, len(policies), chunk_policies):
        costs += scorer.train(decisions.uniform(policies[s:s + chunk_policies])).mean(1).tolist()
    i = min(range(len(policies)), key=costs.__getitem__)
    return _finish(name, run, decisions.uniform([policies[i]]), p=policies[i][0], tx_dbm=policies[i][1],
                   train_cost=costs[i], policies=len(policies))
