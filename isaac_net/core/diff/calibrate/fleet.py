"""Calibrations across fleet sizes: one fit per fitted size, the constants for any size between
them interpolated in log R (:class:`FleetCalibration`).

What the constants stand for changes with the number of robots sharing a cell (PF's multi-user
diversity, SR/BSR and grant queues, HARQ under contention), so a fit at 8 robots loses half the
gradients' size at 32-64 (docs/design.md, "Calibration across fleet sizes"). :func:`fit_fleet`
fits each size on its own operating points, scaled so that every size is loaded alike
(:func:`scaled_points`: the same offered bytes per cell), starting at the reference size with the
full search and moving outwards one size at a time with the search narrowed around the
neighbour's choice (:func:`_neighbour_search`): a continuation that keeps the constants a smooth
function of R and costs a fraction of a full search per size. Between two fitted sizes the
constants are interpolated in log R (the capacity factor, the temperature and the time on air's
factor geometrically),
outside them the nearest size's are used and :meth:`Calibration.apply` warns once.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from isaac_net.core.config import CellConfig
from isaac_net.core.diff.calibrate import sizes as _sizes
from isaac_net.core.diff.calibrate.evaluate import model_kpis
from isaac_net.core.diff.calibrate.loss import SLOPE_WEIGHT, loss, neighbours
from isaac_net.core.diff.calibrate.search import SEARCH, fit
from isaac_net.core.diff.calibrate.store import Calibration, _check_model, _read_file, save_all
from isaac_net.core.diff.calibrate.targets import _one_fleet_size, fleet_sizes, problem
from isaac_net.core.diff.model import DiffFluid
from isaac_net.core.levels import L2LegacyConfig

#: Training points whose scaled send probability exceeds this are dropped (a cell of few robots
#: cannot carry the reference size's heaviest loads by p alone).
P_MAX = 0.95


def scaled_points(points, R: int, *, ref_R: int, p_max: float = P_MAX) -> tuple:
    """The operating points ``(p, msg_bytes, tx_dbm)`` of the reference fleet size ``ref_R`` at
    ``R`` robots per cell: ``p * ref_R / R``, the same offered bytes per cell (L2-legacy's knee sits
    at about the same ``R p``); points whose scaled ``p`` exceeds ``p_max`` are dropped."""
    R, ref_R = _one_fleet_size(R), _one_fleet_size(ref_R)
    out = tuple((float(p) * ref_R / R, float(b), float(tx)) for p, b, tx in points)
    return tuple(pt for pt in out if pt[0] <= p_max)


#: The fewest cells per point through a model with a load spread (``CellConfig.load_spread``): its
#: factors are drawn per cell, so one cell is one path of them, which a fit would fit as if it were
#: the load's shape.
SPREAD_MIN_ENVS = 4


def model_envs_for(R: int, model_robots: int, envs: int, load_spread: float = 0.0) -> int:
    """The cells per point through the model at ``R`` robots per cell: about ``model_robots``
    robots (at least one cell, at most ``envs``): the model's cost stays the same at every size.
    With a load spread at least :data:`SPREAD_MIN_ENVS` cells (at most ``envs``)."""
    n = max(1, math.ceil(int(model_robots) / int(R)))
    if load_spread > 0:
        n = max(n, SPREAD_MIN_ENVS)
    return min(int(envs), n)


def _same_or(form, values: list) -> float:
    """The value all ``values`` share, exactly, else ``form(values)``: a constant that the fits share
    stays that value where a line or a weighted mean of equal values would come out one rounding off
    (QA's grant width 1, which the mode checks test for equality: L1D's must be 1; a temperature at
    the closure's least, ``relax.CLOSURE_MIN_TAU``, which the model warns below)."""
    return values[0] if all(v == values[0] for v in values) else form(values)


def _log_linear(fits, R: int) -> Calibration:
    """The constants at ``R`` of a least-squares line in log R through every fit's (the capacity
    factor, the temperature and the time on air's factor in log; the latency floor rounded, the SNR
    requirement the nearest
    fit's): a global parametric form, two numbers per constant."""
    x = np.log([c.R[0] for c in fits])

    def fitted(values, log=False):
        y = np.log(values) if log else np.asarray(values, dtype=float)
        slope, icpt = np.polyfit(x, y, 1)
        v = icpt + slope * math.log(R)
        return float(math.exp(v) if log else v)

    def line(values, log=False):  # a constant every fit shares stays that value exactly
        return _same_or(lambda v: fitted(v, log), values)

    near = min(fits, key=lambda c: abs(math.log(c.R[0] / R)))
    return dataclasses.replace(
        near, rate_factor=line([c.rate_factor for c in fits], log=True),
        snr_offset_db=line([c.snr_offset_db for c in fits]),
        sr_slots=max(0, int(round(line([c.sr_slots for c in fits])))),
        tau=line([c.tau for c in fits], log=True),
        air_factor=line([c.air_factor for c in fits], log=True),
        air_crowd_exp=line([c.air_crowd_exp for c in fits]),
        load_spread=max(0.0, line([c.load_spread for c in fits])),
        qa_reshare=min(max(line([c.qa_reshare for c in fits]), 0.0), 1.0),
        qa_min_grant_subbands=max(line([c.qa_min_grant_subbands for c in fits]), 1.0),
        R=(R,), train_loss=None, heldout_loss=None, gradient_check=None)


def _interpolated(lo: Calibration, hi: Calibration, R: int) -> Calibration:
    """The constants at ``R`` between the fits ``lo`` and ``hi`` (``lo.R[0] < R < hi.R[0]``), linear
    in log R; the capacity factor, the temperature and the time on air's factor geometrically, the
    latency floor rounded. A constant both fits share stays that value exactly (:func:`_same_or`):
    two temperatures of 0.05 give 0.05, not one rounding below the closure's least temperature."""
    w = (math.log(R) - math.log(lo.R[0])) / (math.log(hi.R[0]) - math.log(lo.R[0]))

    def lin(a, b):
        return _same_or(lambda v: (1.0 - w) * v[0] + w * v[1], [a, b])

    def geo(a, b):
        return _same_or(lambda v: math.exp((1.0 - w) * math.log(v[0]) + w * math.log(v[1])), [a, b])

    req = None if lo.qa_snr_req_db is None or hi.qa_snr_req_db is None else lin(lo.qa_snr_req_db,
                                                                                 hi.qa_snr_req_db)
    return dataclasses.replace(
        lo, rate_factor=geo(lo.rate_factor, hi.rate_factor),
        snr_offset_db=lin(lo.snr_offset_db, hi.snr_offset_db),
        sr_slots=int(round(lin(lo.sr_slots, hi.sr_slots))), tau=geo(lo.tau, hi.tau), qa_snr_req_db=req,
        air_factor=geo(lo.air_factor, hi.air_factor), air_crowd_exp=lin(lo.air_crowd_exp, hi.air_crowd_exp),
        load_spread=lin(lo.load_spread, hi.load_spread), qa_reshare=lin(lo.qa_reshare, hi.qa_reshare),
        qa_min_grant_subbands=lin(lo.qa_min_grant_subbands, hi.qa_min_grant_subbands),
        R=(R,),
        train_loss=None, heldout_loss=None, gradient_check=None,
        provenance={**lo.provenance, "interpolated_between_R": [lo.R[0], hi.R[0]]})


@dataclasses.dataclass(frozen=True)
class FleetCalibration:
    """Calibrations of one model (``mode``, ``sends``) fitted at several fleet sizes, one
    :class:`Calibration` per size (``fits``, ascending ``R``); :meth:`at` gives the constants for any
    size. Build with :func:`fit_fleet` or ``Calibration.load`` of a file that holds several sizes.
    """

    mode: str
    sends: str
    fits: tuple

    def __post_init__(self):
        fits = tuple(sorted(self.fits, key=lambda c: c.R))
        if not fits or any(not isinstance(c, Calibration) for c in fits):
            raise TypeError("fits: expected a non-empty sequence of Calibration")
        if any((c.mode, c.sends) != (self.mode, self.sends) for c in fits):
            raise ValueError(f"fits: expected calibrations of ({self.mode}, {self.sends}) only, got "
                             f"{sorted({(c.mode, c.sends) for c in fits})}")
        if any(len(c.R) != 1 for c in fits) or len({c.R for c in fits}) != len(fits):
            raise ValueError(f"fits: expected one fit per fleet size, got sizes {[list(c.R) for c in fits]}")
        object.__setattr__(self, "fits", fits)

    @property
    def R(self) -> tuple:
        """The fitted fleet sizes, ascending."""
        return tuple(c.R[0] for c in self.fits)

    @property
    def tau(self):
        raise AttributeError("tau: a fleet calibration's temperature depends on the fleet size; "
                             "use .at(R).tau")

    def at(self, R: int) -> Calibration:
        """The calibration for ``R`` robots per cell: the fit of that size, the constants interpolated
        in log R between the two fitted sizes around it, or outside the fitted range the nearest
        size's fit (whose :meth:`Calibration.apply` with ``R=`` warns, once, that R is not its)."""
        R = _one_fleet_size(R)
        # outside the fitted range the nearest fit, whose apply(R=R) warns (once) of the size
        serving = [self.fits[self.R.index(r)] for r in _sizes.serving_sizes(self.R, R)]
        return serving[0] if len(serving) == 1 else _interpolated(*serving, R)

    def apply(self, cfg: CellConfig | None = None, *, R: int, area_m=None,
              l2_config: L2LegacyConfig | None = None) -> CellConfig:
        """``cfg`` with the constants for ``R`` robots per cell (:meth:`at`); run the model at
        ``self.at(R).tau``."""
        return self.at(R).apply(cfg, R=R, area_m=area_m, l2_config=l2_config)

    def model(self, E: int, R: int, device="cpu", **kwargs) -> DiffFluid:
        """The calibrated model for ``R`` robots per cell as fitted (:meth:`Calibration.model`)."""
        return self.at(R).model(E, R, device, **kwargs)

    def to_dicts(self) -> list:
        return [c.to_dict() for c in self.fits]

    def save(self, path) -> None:
        """Write every size's fit into the calibration file ``path`` (replacing those of the same
        ``(mode, sends)`` and keeping the others)."""
        path = Path(path)
        entries = _read_file(path) if path.exists() else []
        others = [e for e in entries if (e["mode"], e["sends"]) != (self.mode, self.sends)]
        save_all(path, others + self.to_dicts())


def _neighbour_search(search: dict, prev: Calibration, mode: str) -> dict:
    """``search`` narrowed to the choices next to ``prev``'s (the neighbouring size's fit): the
    latency floors, temperatures, capacity factors, SNR offsets and QAD's SNR requirements of the
    grid within one step of its, and the best choice refined (Nelder-Mead then moves the capacity
    factor and offset off the grid)."""
    def around(values, chosen):
        values = sorted(float(v) for v in values)
        i = min(range(len(values)), key=lambda k: abs(values[k] - chosen))
        return values[max(0, i - 1): i + 2]

    floors = search["sr_slots"][mode] if isinstance(search["sr_slots"], dict) else search["sr_slots"]
    out = {**search, "sr_slots": [int(v) for v in around(floors, prev.sr_slots)], "refine_top": 1,
           "rate_factor": around(search["rate_factor"], prev.rate_factor),
           "snr_offset_db": around(search["snr_offset_db"], prev.snr_offset_db)}
    if search.get("tau") is not None:
        out["tau"] = around(search["tau"], prev.tau)
    if search.get("qa_snr_req_db") is not None and prev.qa_snr_req_db is not None:
        out["qa_snr_req_db"] = around(search["qa_snr_req_db"], prev.qa_snr_req_db)
    return out


def continuation_order(sizes, ref_R: int) -> list:
    """``(R, neighbour)`` in the order :func:`fit_fleet` fits them: the reference size first (no
    neighbour), then outwards, each size after the fitted size next to it."""
    return _sizes.continuation_order(fleet_sizes(sizes), ref_R)


def fit_size(mode: str, sends: str, *, R: int, neighbour: Calibration | None, grid, heldout=(),
             model_robots: int = 32, envs: int = 16, targets: dict | None = None,
             heldout_targets: dict | None = None, search: dict | None = None,
             progress: bool | Callable[[str], None] = False, **kwargs) -> Calibration:
    """One size's fit of :func:`fit_fleet`: :func:`fit` at ``R`` with the whole ``search`` when
    ``neighbour`` is None (the reference size), else the search narrowed around the neighbouring
    size's fit (:func:`_neighbour_search`). The gradient check runs on the cells ``model_robots``
    alone gives a point (:func:`model_envs_for` without the spread). Its ``setup`` records the fit
    time (``wall_fit_s``, its targets measured apart: what a user pays for this size) and the size
    it continued from.

    :param grid, heldout: the size's operating points (e.g. :func:`scaled_points`).
    :param targets, heldout_targets: ``{kpi: [n_points]}`` at ``R`` (measured when None).
    :param kwargs: the rest of :func:`fit`'s (``area_m``, ``T``, ``warmup``, ``tau``, ...).
    """
    if neighbour is not None and not isinstance(neighbour, Calibration):
        raise TypeError(f"neighbour: expected a Calibration or None, got {type(neighbour).__name__}")
    full = {**SEARCH, **(search or {})}
    sp = full if neighbour is None else _neighbour_search(full, neighbour, mode)
    report = progress if not callable(progress) else (lambda line: progress(f"R = {R}: {line}"))
    t0 = time.perf_counter()
    cal = fit(mode, sends, grid=grid, heldout=heldout, R=R, envs=envs,
              model_envs=model_envs_for(R, model_robots, envs, kwargs.get("load_spread", 0.0)),
              # the gradient check on the plain rule's cells: a spread's extra cells average the loss
              check_envs=model_envs_for(R, model_robots, envs),
              targets=targets,
              heldout_targets=heldout_targets, search={k: v for k, v in sp.items() if k in SEARCH},
              progress=report, **kwargs)
    return dataclasses.replace(cal, setup={**cal.setup, "wall_fit_s": time.perf_counter() - t0,
                                           "continued_from_R": None if neighbour is None else neighbour.R[0]})


def fit_fleet(mode: str, sends: str, *, sizes, ref_R: int, grids: dict, heldouts: dict | None = None,
              model_robots: int = 32, envs: int = 16, targets: dict | None = None,
              heldout_targets: dict | None = None, search: dict | None = None,
              progress: bool | Callable[[str], None] = False, **kwargs) -> FleetCalibration:
    """Fit ``(mode, sends)`` at every fleet size of ``sizes`` (:func:`fit` per size), by continuation
    from ``ref_R`` (:func:`continuation_order`): the reference size with the whole search, each other
    size with it narrowed around its fitted neighbour's choice (:func:`_neighbour_search`). Each
    size's ``setup`` records its fit time (``wall_fit_s``) and the size it continued from.

    :param grids, heldouts: ``{R: points}`` per size (e.g. :func:`scaled_points`).
    :param model_robots: about this many robots per point through the model
        (:func:`model_envs_for`).
    :param targets, heldout_targets: ``{R: {kpi: [n_points]}}``, the discrete level's KPIs
        (:func:`fit`'s; measured when None).
    :param kwargs: the rest of :func:`fit`'s (``area_m``, ``T``, ``warmup``, ``tau``, ``lam``,
        ``seed``, ``cfg``, ``l2_cfg``, ``slope_weight``, ``provenance``, ...).
    """
    _check_model(mode, sends)
    order = continuation_order(sizes, ref_R)
    want = sorted(r for r, _ in order)
    for name, per_size in (("grids", grids), ("heldouts", heldouts), ("targets", targets),
                           ("heldout_targets", heldout_targets)):
        if per_size is not None and (not isinstance(per_size, dict) or sorted(per_size) != want):
            got = sorted(per_size) if isinstance(per_size, dict) else type(per_size).__name__
            raise ValueError(f"{name}: expected a dict with one entry per fleet size {want}, got {got}")
    fitted: dict = {}
    for R, neighbour in order:
        fitted[R] = fit_size(mode, sends, R=R, neighbour=None if neighbour is None else fitted[neighbour],
                             grid=grids[R], heldout=(heldouts or {}).get(R, ()), model_robots=model_robots,
                             envs=envs, targets=None if targets is None else targets[R],
                             heldout_targets=None if heldout_targets is None else heldout_targets[R],
                             search=search, progress=progress, **kwargs)
    return FleetCalibration(mode, sends, tuple(fitted.values()))



def size_losses(fc: FleetCalibration, *, ref_R: int, grids: dict, targets: dict, model_robots: int = 32,
                envs: int = 16, area_m=(40.0, 140.0), T: int = 60, warmup: int = 10, seed: int = 0,
                lam: float = 0.1, slope_weight: float = SLOPE_WEIGHT, cfg: CellConfig | None = None,
                compile: bool = False) -> list:
    """The training loss at each fitted size of the ways to serve it (the forms compared in
    docs/design.md): ``own``, the size's own fit; ``ref``, the reference size's constants (one
    calibration for every size); ``line``, a least-squares line in log R through every size's
    constants (a parametric form, :func:`_log_linear`); ``between``, for a size with fitted sizes
    on both sides, the constants interpolated between those two (how well interpolation serves a
    size it has not seen; None at the ends). ``grids``/``targets`` as :func:`fit_fleet`'s;
    ``compile`` as :func:`fit`'s.

    :output: ``[{"R", "own", "ref", "line", "between"}]`` in ascending ``R``.
    """
    cfg = CellConfig() if cfg is None else cfg
    sizes, rows = fc.R, []
    for i, R in enumerate(sizes):
        n = model_envs_for(R, model_robots, envs, fc.fits[i].load_spread)
        part = problem(grids[R], R=R, area_m=area_m, envs=envs, T=T, warmup=warmup, seed=seed).first(n)
        pairs = neighbours(grids[R])

        def loss_of(c: Calibration, part=part, pairs=pairs, R=R) -> float:
            cell = dataclasses.replace(cfg, **c.constants)
            k = model_kpis(fc.mode, fc.sends, part, cell, tau=c.tau, lam=lam, compile=compile)
            return float(loss(k, targets[R], pairs, slope_weight)[0])

        between = (loss_of(_interpolated(fc.fits[i - 1], fc.fits[i + 1], R))
                   if 0 < i < len(sizes) - 1 else None)
        line = loss_of(_log_linear(fc.fits, R)) if len(sizes) > 2 else None
        rows.append({"R": R, "own": loss_of(fc.fits[i]), "ref": loss_of(fc.at(ref_R)), "line": line,
                     "between": between})
    return rows
