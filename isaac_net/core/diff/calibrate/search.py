"""The fit: a coarse grid over the constants, Nelder-Mead refinement of the best choices, and the
gradient check that the chosen constants must pass (the method: the package's docstring).

:func:`fit` runs the steps in order: :func:`_checked_choices` (what to search),
:func:`_fit_targets` (the training and held-out cells and their targets), :func:`_coarse_grid`,
:func:`_choose_usable` (:func:`_refine` and :func:`_check` until a choice passes) and
:func:`_calibration` (the losses and the record).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import math
import sys
import typing
import warnings
from collections.abc import Callable

import numpy as np
import torch

from isaac_net.core.config import CellConfig
from isaac_net.core.diff.calibrate.evaluate import (
    GRADIENT_H,
    GRADIENT_MAX_ERROR,
    AirBasis,
    check_gradients,
    model_kpis,
)
from isaac_net.core.diff.calibrate.loss import (
    DELIVERY_UNIT,
    LOSS_WEIGHTS,
    SLOPE_WEIGHT,
    _check_targets,
    loss,
    neighbours,
)
from isaac_net.core.diff.calibrate.store import (
    Calibration,
    _check_model,
    _jsonable,
    check_backlog_closure,
    check_grant,
    check_load_spread,
    check_reshare,
)
from isaac_net.core.diff.calibrate.targets import (
    _check_points,
    _is_integer,
    _is_number,
    concat_points,
    fleet_sizes,
    measure,
    problem,
)
from isaac_net.core.diff.model import MODES, mode_spec
from isaac_net.core.levels import L2LegacyConfig

# The coarse search grid: capacity factors, SNR offsets (dB) and latency floors (slots) per mode.
SEARCH = {
    "rate_factor": (0.3, 0.45, 0.6, 0.8, 1.0),
    "snr_offset_db": (-12.0, -8.0, -4.0, 0.0, 4.0),
    "sr_slots": {mode: (0, 8, 16, 24, 32) for mode in MODES},
    "tau": None,  # relaxation temperatures to choose from (None: the fit's ``tau`` only)
    "qa_snr_req_db": None,  # QAD's headroom requirements to choose from, dB (None: the cell's only)
    "refine_top": 2,  # (latency floor, temperature) choices refined by Nelder-Mead per requirement
    "refine_evals": 30,  # loss evaluations per refinement
    # The time on air's crowd exponent: the bounds it is fitted in after the other constants
    # (:func:`_fit_air`; None: not fitted, the plain rule).
    "air_crowd_exp": (-0.5, 1.5),
    "air_evals": 200,  # loss evaluations of that fit (each on the recorded energy: no rollout)
    # The gradient check of the fitted constants (``check_gradients``): its half step in p and the
    # largest error that still counts as usable.
    "gradient_h": GRADIENT_H,
    "gradient_max_error": GRADIENT_MAX_ERROR,
}
# Nelder-Mead works on log(rate factor), clipped to this range.
_LOG_RATE_FACTOR = (math.log(0.05), math.log(2.0))
# The time on air's factor, clipped to this range (CellConfig.air_factor's is 1e-3 .. 100).
_LOG_AIR_FACTOR = (math.log(0.05), math.log(20.0))


def fit(
    mode: str,
    sends: str,
    *,
    level: str = "L2-legacy",
    grid,
    heldout=(),
    R: int | typing.Sequence[int] = 8,
    area_m=(40.0, 140.0),
    envs: int = 16,
    model_envs: int = 4,
    check_envs: int | None = None,
    T: int = 60,
    warmup: int = 10,
    tau: float = 0.05,
    lam: float = 0.1,
    seed: int = 0,
    cfg: CellConfig | None = None,
    l2_cfg: L2LegacyConfig | None = None,
    search: dict | None = None,
    targets: dict | None = None,
    heldout_targets: dict | None = None,
    slope_weight: float = SLOPE_WEIGHT,
    load_spread: float = 0.0,
    mf_backlog_closure: bool = False,
    qa_reshare: float = 0.0,
    qa_min_grant_subbands: float = 1.0,
    compile: bool = False,
    progress: bool | Callable[[str], None] = False,
    provenance: dict | None = None,
) -> Calibration:
    """Fit the constants of ``(mode, sends)`` to ``level``'s KPIs on the operating points ``grid``.

    :param grid: training points ``(p, msg_bytes, tx_dbm)``; :param heldout: points never used
        by the fit, where the held-out loss is measured (none: ``heldout_loss`` is None).
    :param R: robots per cell, or several fleet sizes: every point is measured and fitted at each
        (the loss is the mean over fleet sizes and points).
    :param envs: cells per point on ``level`` (``envs`` seeds of positions and sends);
        :param model_envs: the first ``model_envs`` of them run through the model.
    :param check_envs: the first ``check_envs`` of the model's cells per point in the gradient
        check (None: all ``model_envs``): a backpropagation's stability is the state map's, which
        cells that only average the loss (a load spread's) do not change, at a fraction of the cost.
    :param targets, heldout_targets: ``level``'s KPIs from :func:`measure` on
        ``problem(grid, R=r, ...)`` / ``problem(heldout, R=r, ...)`` with the same settings, one
        fleet size after the other (:func:`concat_points`; ``[len(R) * n_points]`` per KPI);
        computed here when None; pass them to fit several models against one measurement.
    :param tau: the relaxation temperature of the plain model (its loss, ``uncalibrated_*``) and of
        the fit when ``search["tau"]`` is None; ``search["tau"]``: the temperatures the fit
        chooses from (``Calibration.tau``).
    :param search: overrides of ``SEARCH``.
    :param slope_weight: weight of the slope term of the :func:`loss` (>= 0; 0 fits the levels
        alone): the errors of the KPIs' changes between neighbouring training points and fleet
        sizes (:func:`neighbours`).
    :param load_spread: mean-field sends only: the scale of the cell's load spread per step the
        calibrated model runs with (``CellConfig.load_spread``, ``relax.spread_sends``; 1: binary
        sends' binomial spread), fixed, not searched; the plain model's loss keeps none.
    :param mf_backlog_closure: QAD with mean-field sends only: the calibrated model serves a robot as
        whole messages (``CellConfig.mf_backlog_closure``), fixed, not searched; the plain model's
        loss keeps QAD's own backlog weight.
    :param qa_reshare: QAD only: the share of an idle robot's time its interval gives the robots being
        served (``CellConfig.qa_reshare``), fixed, not searched; the plain model's loss keeps none.
    :param qa_min_grant_subbands: QAD only: the fewest subbands a robot's power is spread over
        (``CellConfig.qa_min_grant_subbands``), fixed, not searched; the plain model's loss keeps QA's 1.
    :param compile: run the model's compiled step (``DiffFluid(compile=True)``) for every loss
        evaluation: the same losses to float rounding, some 2x (L1D) to 7x (QAD) faster on the
        fit's batches after a first call that compiles or loads the kept kernels. The gradient check
        stays eager: it backpropagates each KPI through one graph, which a compiled backward (its
        buffers donated) cannot be run through twice.
    :param progress: False: silent; True: a tqdm bar over the coarse grid and a line per
        refinement and gradient check; a callable: given each of those lines and one per grid
        choice (a log that shows progress without a bar).
    """
    cfg, l2_cfg, choices = _checked_choices(
        mode, sends, level=level, cfg=cfg, l2_cfg=l2_cfg, envs=envs, model_envs=model_envs,
        check_envs=check_envs, grid=grid, heldout=heldout, search=search, tau=tau, slope_weight=slope_weight,
        compile=compile, load_spread=load_spread, mf_backlog_closure=mf_backlog_closure,
        qa_reshare=qa_reshare, qa_min_grant_subbands=qa_min_grant_subbands)
    sizes = fleet_sizes(R)
    cells = _fit_targets(grid, heldout, sizes, dict(area_m=area_m, envs=envs, T=T, warmup=warmup),
                         seed=seed, level=level, cfg=cfg, l2_cfg=l2_cfg, targets=targets,
                         heldout_targets=heldout_targets)
    obj = _Objective(mode, sends, cfg, lam, float(slope_weight), [t.first(model_envs) for t in cells.train],
                     cells.targets, neighbours(grid, len(sizes)), compile, float(load_spread),
                     model_envs if check_envs is None else check_envs, mf_backlog_closure, float(qa_reshare),
                     float(qa_min_grant_subbands))
    report = _Progress(progress, f"calibrate {mode_spec(mode).label} {sends}")
    coarse = _coarse_grid(obj, choices, report)
    best, checks, refined, tried = _choose_usable(obj, coarse, choices.search, sizes, report)
    air_fit = None
    if choices.search.get("air_crowd_exp") is not None:  # the time on air, fitted last
        start = best if best is not None else min(refined, key=lambda c: c.loss)
        with_air, air_fit = _fit_air(obj, start, choices.search["air_crowd_exp"], choices.search["air_evals"],
                                     report)
        check = _check(obj, with_air, choices.search, sizes, report)
        # kept where it lowers the loss and its gradients are as usable as without it; then it takes
        # the place of the choice it refines (which was not rejected: the record lists it nowhere)
        air_fit.update(kept=with_air.loss < start.loss and (check["stable"] or not checks[start]["stable"]),
                       gradient_check_stable=check["stable"])
        if air_fit["kept"]:
            del checks[start]
            checks[with_air] = check
            refined = [with_air if c == start else c for c in refined]
            best = with_air if best is not None else None
    if best is None:  # no choice gives usable gradients: the best fit, flagged
        best = min(refined, key=lambda c: c.loss)
        with_reqs = "" if choices.reqs == (None,) else f" and SNR requirement of {list(choices.reqs)} dB"
        warnings.warn(f"{report.name}: no latency floor of {list(choices.floors)} at a temperature of "
                      f"{list(choices.taus)}{with_reqs} passes the gradient check; the calibration is "
                      "flagged (gradient_check.stable is False)", stacklevel=2)
    setup = {"level": level, "T": T, "warmup": warmup, "tau": tau, "lam": lam, "envs": envs,
             "model_envs": model_envs, "check_envs": obj.check_envs, "seed": seed, "compile": compile,
             "air_fit": air_fit}
    return _calibration(obj, cells, best, checks, choices, setup, evaluations=len(coarse) + len(tried),
                        sizes=sizes, area_m=area_m, l2_cfg=l2_cfg, model_envs=model_envs, heldout=heldout,
                        provenance=provenance)


@dataclasses.dataclass(frozen=True)
class _Choices:
    """What the fit searches: the settings (``SEARCH`` with the overrides) and the latency floors,
    temperatures and SNR requirements (``(None,)``: the cell's own) the coarse grid batches over."""

    search: dict
    floors: typing.Sequence[int]
    taus: tuple
    reqs: tuple


def _checked_choices(mode: str, sends: str, *, level: str, cfg, l2_cfg, envs: int, model_envs: int,
                     check_envs, grid, heldout, search, tau: float, slope_weight, compile,
                     load_spread, mf_backlog_closure=False, qa_reshare=0.0,
                     qa_min_grant_subbands=1.0) -> tuple:
    """The arguments of :func:`fit` checked once: ``(cfg, l2_cfg, _Choices)`` with the defaults filled."""
    _check_model(mode, sends)
    check_load_spread(load_spread, sends)  # before the fit's minutes, not after
    check_backlog_closure(mf_backlog_closure, mode, sends)
    check_reshare(qa_reshare, mode, mf_backlog_closure)
    if level != "L2-legacy":
        raise ValueError(f"level: calibrations are fitted to 'L2-legacy', got {level!r}")
    cfg = CellConfig() if cfg is None else cfg
    if cfg.is_calibrated:
        raise ValueError("cfg: expected the plain cell (no calibration constants) to fit on")
    check_grant(qa_min_grant_subbands, mode, cfg.num_subbands)
    l2_cfg = L2LegacyConfig() if l2_cfg is None else l2_cfg
    if not (isinstance(model_envs, int) and 1 <= model_envs <= envs):
        raise ValueError(f"model_envs: expected an integer in [1, envs={envs}], got {model_envs!r}")
    if check_envs is not None and not (_is_integer(check_envs) and 1 <= check_envs <= model_envs):
        raise ValueError(f"check_envs: expected None or an integer in [1, model_envs={model_envs}], "
                         f"got {check_envs!r}")
    _check_points(grid, "grid", allow_empty=False)
    _check_points(heldout, "heldout", allow_empty=True)
    sp = _check_search(search, mode)
    floors = sp["sr_slots"][mode] if isinstance(sp["sr_slots"], dict) else sp["sr_slots"]
    if any(not (0 <= int(L) <= cfg.num_slots) for L in floors):
        raise ValueError(
            f"search: latency floors must lie in [0, num_slots={cfg.num_slots}], got {list(floors)}"
        )
    taus = tuple(float(t) for t in (sp["tau"] if sp.get("tau") is not None else (tau,)))
    if not taus or any(not (math.isfinite(t) and t > 0) for t in taus):
        raise ValueError(f"search: temperatures (tau) must be finite and > 0, got {list(taus)}")
    # The headroom requirement: None keeps the cell's (and records nothing); a mode without the rule has none.
    reqs = (None,) if mode_spec(mode).snr_req_field is None or sp.get("qa_snr_req_db") is None else tuple(
        float(r) for r in sp["qa_snr_req_db"])
    if not reqs or any(r is not None and not math.isfinite(r) for r in reqs):
        raise ValueError(f"search: SNR requirements (qa_snr_req_db) must be finite dB, got {list(reqs)}")
    if isinstance(slope_weight, bool) or not isinstance(slope_weight, (int, float)) or not (
            math.isfinite(slope_weight) and slope_weight >= 0):
        raise ValueError(f"slope_weight: expected a finite number >= 0, got {slope_weight!r}")
    if not isinstance(compile, bool):
        raise TypeError(f"compile: expected True or False, got {compile!r}")
    return cfg, l2_cfg, _Choices(sp, floors, taus, reqs)


class _Cells(typing.NamedTuple):
    """The discrete level's cells of the fit, one problem per fleet size, and their targets
    (``{kpi: [n_sizes * n_points]}``, one size after the other); ``held*``: None without held-out points."""

    train: list
    targets: dict
    held: list | None
    held_targets: dict | None


def _fit_targets(grid, heldout, sizes: tuple, kw: dict, *, seed: int, level: str, cfg: CellConfig,
                 l2_cfg: L2LegacyConfig, targets, heldout_targets) -> _Cells:
    """The training (seed ``seed``) and held-out (``seed + 1``) problems of every fleet size and their
    targets: ``targets`` / ``heldout_targets`` checked, or measured on ``level`` when None."""
    # One problem per fleet size; its points in order, the sizes one after the other.
    train = [problem(grid, R=r, seed=seed, **kw) for r in sizes]
    if targets is None:
        targets = concat_points(measure(t, level=level, cfg=cfg, l2_cfg=l2_cfg, seed=seed) for t in train)
    _check_targets(targets, "targets", len(sizes) * len(train[0].points))
    held = [problem(heldout, R=r, seed=seed + 1, **kw) for r in sizes] if heldout else None
    if held is not None:
        if heldout_targets is None:
            heldout_targets = concat_points(measure(h, level=level, cfg=cfg, l2_cfg=l2_cfg, seed=seed + 1)
                                            for h in held)
        _check_targets(heldout_targets, "heldout_targets", len(sizes) * len(held[0].points))
    return _Cells(train, targets, held, heldout_targets)


class _Fitted(typing.NamedTuple):
    """One evaluated set of constants of :func:`fit`: its training loss and the constants."""

    loss: float
    rate_factor: float
    snr_offset_db: float
    sr_slots: int
    tau: float
    qa_snr_req_db: float | None
    air_factor: float = 1.0
    air_crowd_exp: float = 0.0

    @property
    def choice(self) -> tuple:
        """What the coarse grid batches over: (latency floor, temperature, SNR requirement)."""
        return self.sr_slots, self.tau, self.qa_snr_req_db


@dataclasses.dataclass(frozen=True)
class _Objective:
    """The fit's loss: the model ``(mode, sends)`` with constants on top of the plain cell ``cfg``, on
    the model's share of every fleet size's training cells (``parts``), against ``targets``."""

    mode: str
    sends: str
    cfg: CellConfig
    lam: float
    slope_weight: float
    parts: list
    targets: dict
    pairs: torch.Tensor  # [n_pairs, 2] neighbouring training points (the slope term)
    compile: bool  # the model's compiled step
    load_spread: float = 0.0  # the calibrated model's (CellConfig.load_spread), not searched
    check_envs: int = 1  # the first cells per point of each part the gradient check runs on
    mf_backlog_closure: bool = False  # the calibrated model's (CellConfig.mf_backlog_closure), not searched
    qa_reshare: float = 0.0  # the calibrated model's (CellConfig.qa_reshare), not searched
    qa_min_grant_subbands: float = 1.0  # the calibrated model's (CellConfig's), not searched

    def kpis(self, parts: list, c: CellConfig, t: float, candidates=None) -> dict:
        """The model's KPIs on every fleet size's problem in ``parts``, as one set of points."""
        return concat_points(model_kpis(self.mode, self.sends, part, c, tau=t, lam=self.lam,
                                        candidates=candidates, compile=self.compile) for part in parts)

    def loss(self, kpis: dict, targets: dict, pairs: torch.Tensor | None = None) -> torch.Tensor:
        return loss(kpis, targets, self.pairs if pairs is None else pairs, self.slope_weight)

    def constants(self, eta, off, L, req=None) -> CellConfig:
        """The plain cell with a capacity factor, SNR offset, latency floor and SNR requirement (and
        the fit's load spread)."""
        spec = mode_spec(self.mode)
        extra = {} if req is None else {spec.snr_req_field: float(req)}
        return dataclasses.replace(
            self.cfg, rate_factor=float(eta), snr_offset_db=float(off), **{spec.sr_field: int(L)}, **extra,
            load_spread=self.load_spread, mf_backlog_closure=self.mf_backlog_closure,
            qa_reshare=self.qa_reshare, qa_min_grant_subbands=self.qa_min_grant_subbands,
        )

    def cell(self, f: _Fitted) -> CellConfig:
        c = self.constants(f.rate_factor, f.snr_offset_db, f.sr_slots, f.qa_snr_req_db)
        return dataclasses.replace(c, air_factor=f.air_factor, air_crowd_exp=f.air_crowd_exp)

    def train_loss(self, f_cfg: CellConfig, t: float) -> float:
        return float(self.loss(self.kpis(self.parts, f_cfg, t), self.targets)[0])

    def air_bases(self, c: CellConfig, t: float) -> list:
        """:class:`~.evaluate.AirBasis` of every fleet size's problem in ``parts``."""
        return [AirBasis.record(self.mode, self.sends, part, c, tau=t, lam=self.lam, compile=self.compile)
                for part in self.parts]


class _Progress:
    """Where the fit's progress goes (:func:`fit`'s ``progress``): nowhere, a tqdm bar and lines
    written past it, or a callable given each line."""

    def __init__(self, progress, name: str):
        if not (progress is None or isinstance(progress, bool) or callable(progress)):
            raise TypeError(f"progress: expected True, False or a callable taking a line, got {progress!r}")
        self.show, self.name = bool(progress) if progress is None else progress, name

    def grid(self, items: list) -> typing.Iterable:
        if self.show is not True:
            return items
        from tqdm import tqdm

        return tqdm(items, desc=f"{self.name}: grid", mininterval=2.0)

    def line(self, text: str, *, grid_step: bool = False) -> None:
        """``text`` to a callable; past the bar with ``progress=True`` unless a grid step (the bar's)."""
        if callable(self.show):
            self.show(f"{self.name}: {text}")
        elif self.show is True and not grid_step:
            from tqdm import tqdm

            tqdm.write(f"{self.name}: {text}", file=sys.stdout)
            sys.stdout.flush()


def _coarse_grid(obj: _Objective, choices: _Choices, report: _Progress) -> list:
    """Every grid candidate's training loss, lowest first (``[_Fitted]``): one batched rollout per
    (latency floor, temperature, SNR requirement), the capacity factors and SNR offsets through the inputs."""
    sp = choices.search
    cands = list(itertools.product(sp["rate_factor"], sp["snr_offset_db"]))
    coarse: list[_Fitted] = []
    grid = list(itertools.product(choices.floors, choices.taus, choices.reqs))
    for i, (L, t, req) in enumerate(report.grid(grid)):
        kpis = obj.kpis(obj.parts, obj.constants(1.0, 0.0, L, req), t, candidates=cands)
        losses = obj.loss(kpis, obj.targets)
        found = [_Fitted(float(v), eta, off, int(L), t, req)
                 for v, (eta, off) in zip(losses.tolist(), cands, strict=True)]
        coarse += found
        report.line(f"grid {i + 1}/{len(grid)}: floor {L} slots, tau {t:g}{_req_text(req)} -> best loss "
                    f"{min(f.loss for f in found):.4g}", grid_step=True)
    coarse.sort(key=lambda r: r.loss)
    return coarse


def _refine(obj: _Objective, start: _Fitted, evals: int, tried: list, report: _Progress) -> _Fitted:
    """Nelder-Mead on (log rate factor, offset) at ``start``'s floor, temperature and requirement,
    from its constants; every evaluation is appended to ``tried``."""
    L, t, req = start.choice
    lo, hi = _LOG_RATE_FACTOR

    def objective(z):
        eta = float(np.exp(np.clip(z[0], lo, hi)))
        value = obj.train_loss(obj.constants(eta, z[1], L, req), t)
        tried.append(_Fitted(value, eta, float(z[1]), L, t, req))
        return value if math.isfinite(value) else 1e12

    from scipy.optimize import minimize

    x0 = [math.log(start.rate_factor), start.snr_offset_db]
    res = minimize(objective, x0=x0, method="Nelder-Mead", options={
        "maxfev": int(evals), "xatol": 1e-3, "fatol": 1e-4,
        "initial_simplex": [x0, [x0[0] + 0.15, x0[1]], [x0[0], x0[1] + 1.5]],
    })
    cand = _Fitted(float(res.fun), float(np.exp(np.clip(res.x[0], lo, hi))), float(res.x[1]), L, t, req)
    report.line(f"floor {L} slots, tau {t:g}{_req_text(req)} -> loss {cand.loss:.4g} (rate factor "
                f"{cand.rate_factor:.3f}, offset {cand.snr_offset_db:.2f} dB; {res.nfev} evaluations)")
    return cand


def _check(obj: _Objective, cand: _Fitted, sp: dict, sizes: tuple, report: _Progress) -> dict:
    """:func:`~.evaluate.check_gradients` of ``cand``'s constants at every fleet size: the worst."""
    c = _worst_check([
        {**check_gradients(obj.mode, obj.sends, part.first(obj.check_envs), obj.cell(cand), tau=cand.tau,
                           lam=obj.lam, h=sp["gradient_h"], max_error=sp["gradient_max_error"]), "R": r}
        for r, part in zip(sizes, obj.parts, strict=True)])
    report.line(f"floor {cand.sr_slots} slots, tau {cand.tau:g}{_req_text(cand.qa_snr_req_db)}, "
                f"gradient check {'passed' if c['stable'] else 'FAILED'} "
                f"(worst error {c['worst_error']:.3g}: d {c['kpi']} / d p {c['autograd']:.4g} "
                f"against FD {c['fd']:.4g} at {c['point']}, R = {c['R']})")
    return c


def _choose_usable(obj: _Objective, coarse: list, sp: dict, sizes: tuple, report: _Progress) -> tuple:
    """The refined constants with the lowest loss whose gradients are usable: the best
    ``sp["refine_top"]`` choices of the grid's ranking for each SNR requirement refined (the grid's
    ranking of the requirements need not be the refined one); while every refined choice fails the
    gradient check, the next choice is refined.

    :output: ``(best, checks, refined, tried)``: ``best`` None when no choice passes; ``checks``
        ``{_Fitted: check}``; the refined candidates; every refinement evaluation.
    """
    tried: list = []
    ranking = list(dict.fromkeys(r.choice for r in coarse))

    def refine(choice: tuple) -> _Fitted:
        start = next(r for r in coarse if r.choice == choice)
        return _refine(obj, start, sp["refine_evals"], tried, report)

    top = {choice for req in {c[2] for c in ranking}
           for choice in [c for c in ranking if c[2] == req][: int(sp["refine_top"])]}
    refined = [refine(choice) for choice in ranking if choice in top]
    pending = [choice for choice in ranking if choice not in top]
    checks: dict = {}
    while True:
        for cand in sorted(refined, key=lambda c: c.loss):
            if cand not in checks:
                checks[cand] = _check(obj, cand, sp, sizes, report)
            if checks[cand]["stable"]:
                return cand, checks, refined, tried
        if not pending:
            return None, checks, refined, tried
        refined.append(refine(pending.pop(0)))


def _fit_air(obj: _Objective, start: _Fitted, bounds, evals: int, report: _Progress) -> tuple[_Fitted, dict]:
    """The time on air's constants fitted after the others (``start``'s): Nelder-Mead on (log factor,
    crowd exponent), the exponent clipped to ``bounds``, at most ``evals`` loss evaluations, from the
    plain exponent 0 and the factor that brings the model's energy to the targets' there (the
    geometric mean of target / model over the points with an energy: what minimises the energy's
    level term). Energy does not feed back into the queues, so every other KPI stays as ``start`` had
    it: each evaluation is the energy of :class:`~.evaluate.AirBasis` (two rollouts per fleet size,
    recorded once); the constants found are then evaluated once by the model itself, and that loss,
    the exact one, is what the fit keeps.

    :output: ``(fitted, record)``: ``start`` with the two constants and their loss; the record
        ``{"bounds", "evaluations", "air_factor", "air_crowd_exp", "loss_without", "basis_loss",
        "loss"}`` (``evaluations``: the basis's; ``basis_loss``: the search's minimum).
    """
    from scipy.optimize import minimize

    lo, hi = (float(b) for b in bounds)
    bases = obj.air_bases(obj.cell(start), start.tau)
    target = obj.targets["mean_energy_j"]
    tried: list = []

    def constants(z) -> tuple[float, float]:
        return float(np.exp(np.clip(z[0], *_LOG_AIR_FACTOR))), float(np.clip(z[1], lo, hi))

    def objective(z) -> float:
        f, a = constants(z)
        value = float(obj.loss(concat_points(b.at(f, a) for b in bases), obj.targets)[0])
        tried.append((value, f, a))
        return value if math.isfinite(value) else 1e12

    e = concat_points(b.kpis for b in bases)["mean_energy_j"][0]
    defined = (target > 0) & (e > 0)
    log_f0 = 0.0
    if bool(defined.any()):
        log_f0 = float((torch.log(target[defined]) - torch.log(e[defined])).mean())
    x0 = [float(np.clip(log_f0, *_LOG_AIR_FACTOR)), float(np.clip(0.0, lo, hi))]
    minimize(objective, x0=x0, method="Nelder-Mead", options={
        "maxfev": int(evals), "xatol": 1e-4, "fatol": 1e-7,
        "initial_simplex": [x0, [x0[0] + 0.3, x0[1]], [x0[0] - 0.15, x0[1] + 0.3]]})
    basis_loss, factor, exp = min(tried)
    fitted = start._replace(air_factor=factor, air_crowd_exp=exp)
    fitted = fitted._replace(loss=obj.train_loss(obj.cell(fitted), start.tau))
    report.line(f"time on air: exponent {exp:.3f}, factor {factor:.3f} -> loss {fitted.loss:.4g} "
                f"(without {start.loss:.4g}; {len(tried)} evaluations on the recorded energy, its loss "
                f"{basis_loss:.4g})")
    return fitted, {"bounds": [lo, hi], "evaluations": len(tried), "air_factor": factor, "air_crowd_exp": exp,
                    "loss_without": start.loss, "basis_loss": basis_loss, "loss": fitted.loss}


def _gradient_record(best: _Fitted, checks: dict) -> dict:
    """``Calibration.gradient_check``: the chosen constants' check and the checked choices rejected."""
    return {**checks[best], "rejected": [
        {"sr_slots": c.sr_slots, "tau": c.tau, "qa_snr_req_db": c.qa_snr_req_db, "rate_factor": c.rate_factor,
         "snr_offset_db": c.snr_offset_db, "train_loss": c.loss,
         "worst_error": checks[c]["worst_error"], "kpi": checks[c]["kpi"], "point": checks[c]["point"],
         "R": checks[c]["R"]}
        for c in sorted(checks, key=lambda c: c.loss) if c != best and not checks[c]["stable"]]}


def _calibration(obj: _Objective, cells: _Cells, best: _Fitted, checks: dict, choices: _Choices, setup: dict,
                 *, evaluations: int, sizes: tuple, area_m, l2_cfg: L2LegacyConfig, model_envs: int, heldout,
                 provenance: dict | None) -> Calibration:
    """The :class:`Calibration` of ``best``: its losses against the plain model's on the training and
    held-out cells, the fit's settings (``setup`` completed with the search, the loss and the
    counts of loss ``evaluations`` and gradient checks) and provenance."""
    plain_tau = setup["tau"]
    uncal_train = obj.train_loss(obj.cfg, plain_tau)
    heldout_loss = uncal_heldout = None
    if cells.held is not None:
        m_held, held_pairs = [h.first(model_envs) for h in cells.held], neighbours(heldout, len(sizes))

        def held_loss(c: CellConfig, t: float) -> float:
            return float(obj.loss(obj.kpis(m_held, c, t), cells.held_targets, held_pairs)[0])

        heldout_loss = held_loss(obj.cell(best), best.tau)
        uncal_heldout = held_loss(obj.cfg, plain_tau)
    sp, reqs = choices.search, choices.reqs
    setup = {**setup,
             "search": {**sp, "sr_slots": list(choices.floors), "tau": list(choices.taus),
                        "qa_snr_req_db": None if reqs == (None,) else list(reqs)},
             "loss_weights": LOSS_WEIGHTS, "delivery_unit": DELIVERY_UNIT, "slope_weight": obj.slope_weight,
             "slope_pairs": len(obj.pairs), "evaluations": evaluations, "gradient_checks": len(checks)}
    fitted_utc = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    prov = {"torch": torch.__version__, "fitted_utc": fitted_utc, **(provenance or {})}
    return Calibration(
        mode=obj.mode, sends=obj.sends, rate_factor=best.rate_factor, snr_offset_db=best.snr_offset_db,
        sr_slots=int(best.sr_slots), train_loss=best.loss, heldout_loss=heldout_loss,
        uncalibrated_train_loss=uncal_train, uncalibrated_heldout_loss=uncal_heldout,
        air_factor=best.air_factor, air_crowd_exp=best.air_crowd_exp, load_spread=obj.load_spread,
        mf_backlog_closure=obj.mf_backlog_closure, qa_reshare=obj.qa_reshare,
        qa_min_grant_subbands=obj.qa_min_grant_subbands, grid=cells.train[0].points,
        heldout_grid=cells.held[0].points if cells.held is not None else (),
        R=sizes, area_m=tuple(float(a) for a in area_m), cell=_jsonable(dataclasses.asdict(obj.cfg)),
        l2_config=_jsonable(dataclasses.asdict(l2_cfg)), setup=_jsonable(setup),
        gradient_check=_jsonable(_gradient_record(best, checks)), tau=best.tau,
        qa_snr_req_db=best.qa_snr_req_db, provenance=prov,
    )


def _check_search(search, mode: str) -> dict:
    """``SEARCH`` with the overrides ``search``, each list non-empty and of the right kind (the error
    names ``search[key]``); the value checks that depend on the cell follow in :func:`fit`."""
    if search is not None and not isinstance(search, dict):
        raise TypeError(f"search: expected a dict of overrides of calibrate.SEARCH, "
                        f"got {type(search).__name__}")
    unknown = sorted(set(search or {}) - set(SEARCH))
    if unknown:
        raise ValueError(f"search: unknown keys {unknown}; expected some of {sorted(SEARCH)}")
    sp = {**SEARCH, **(search or {})}

    def values(where, v, *, optional=False, integer=False):
        if v is None and optional:
            return
        if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__len__"):
            raise TypeError(f"{where}: expected a non-empty list of {'integers' if integer else 'numbers'}"
                            f"{' or None' if optional else ''}, got {v!r}")
        if len(v) == 0:
            raise ValueError(f"{where}: expected a non-empty list{' or None' if optional else ''}, got an "
                             "empty one (nothing to search)")
        ok = _is_integer if integer else _is_number
        if not all(ok(x) for x in v):
            raise TypeError(f"{where}: expected {'integers' if integer else 'numbers'}, got {list(v)!r}")

    etas, offsets = sp["rate_factor"], sp["snr_offset_db"]
    values("search['rate_factor']", etas)
    if not all(math.isfinite(x) and x > 0 for x in etas):
        raise ValueError(f"search['rate_factor']: expected finite capacity factors > 0, got {list(etas)}")
    values("search['snr_offset_db']", offsets)
    if not all(math.isfinite(x) for x in offsets):
        raise ValueError(f"search['snr_offset_db']: expected finite offsets (dB), got {list(offsets)}")
    floors = sp["sr_slots"]
    if isinstance(floors, dict):
        if mode not in floors:
            raise ValueError(f"search['sr_slots']: expected latency floors for mode {mode!r}, got keys "
                             f"{sorted(floors)}")
        values(f"search['sr_slots'][{mode!r}]", floors[mode], integer=True)
    else:
        values("search['sr_slots']", floors, integer=True)
    values("search['tau']", sp["tau"], optional=True)
    air = sp.get("air_crowd_exp")
    is_pair = not isinstance(air, (str, bytes, dict)) and hasattr(air, "__len__") and len(air) == 2
    if air is not None and not (is_pair and all(_is_number(b) and math.isfinite(b) for b in air)
                                and air[0] < air[1]):
        raise ValueError(f"search['air_crowd_exp']: expected None or bounds [lo, hi] with lo < hi, "
                         f"got {air!r}")
    values("search['qa_snr_req_db']", sp["qa_snr_req_db"], optional=True)
    for key in ("refine_top", "refine_evals", "air_evals"):
        v = sp[key]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"search[{key!r}]: expected an integer >= 1, got {v!r}")
    for key in ("gradient_h", "gradient_max_error"):
        v = sp[key]
        if not (_is_number(v) and math.isfinite(v) and v > 0):
            raise ValueError(f"search[{key!r}]: expected a finite number > 0, got {v!r}")
    return sp



def _worst_check(checks: list) -> dict:
    """One gradient check of several fleet sizes: the worst of them, stable only if all are."""
    worst = max(checks, key=lambda c: c["worst_error"])
    return {**worst, "stable": all(c["stable"] for c in checks)}


def _req_text(req) -> str:
    return "" if req is None else f", SNR requirement {req:g} dB"
