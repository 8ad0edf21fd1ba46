"""Calibration of the fluid models (L1D, QAD) to the packet level (L2-legacy).

L1D and QAD share L2-legacy's physics but not its effective capacity or latency: HARQ,
BLER, OLLA, MCS quantisation, per-subband PF and fading cost L2-legacy capacity, and the
SR/BSR timeline and grant delays give it a latency floor. Their gradients are then
gradients of another operating point. A calibration fits effective constants of
:class:`~isaac_net.core.config.CellConfig` per model (``mode``) and send relaxation (``sends``):

* ``rate_factor``: a capacity factor on the bytes a backlogged robot is served;
* ``snr_offset_db``: added to the SNR that sets the spectral efficiency (and QA's headroom
  cap); the transmit energy keeps the true power;
* the latency floor, ``l1_sr_slots`` for L1D and ``qa_sr_slots`` for QAD (``sr_slots`` here);
* for QAD, its power-headroom rule's per-subband SNR requirement ``qa_snr_req_db`` (from
  ``search["qa_snr_req_db"]``): L2-legacy splits the power over as many subbands as its buffer
  needs down to the lowest MCS's threshold, where QA's default of 15 dB keeps a calibrated QAD
  (SNR offset below 0) on one subband in the log regime of the spectral efficiency, with an
  energy that falls too little with power;

and, beside them, the relaxation temperature ``tau`` the model runs at (``Calibration.tau``,
chosen from ``search["tau"]``). The fluid has no variance: below saturation it delivers every
message, so its delivery and AoI slopes to size, power and distance are ~0 where L2-legacy's
(fading, HARQ, queue fluctuations) are not. A larger temperature smooths the completion, buffer
and deadline steps as a spread of service times would; its level is fitted like the constants,
on the training points' KPIs, never on the points the gradients are evaluated at.

The fit is forward-only and robust: with mean-field sends near critical load the KPI
gradients with respect to the constants reach 1e9, so a gradient-only fit diverges.
A coarse grid over the constants is evaluated in a few batched rollouts (the
candidates' capacity factor and SNR offset enter exactly through the inputs: bytes
``B / rate_factor`` and SNR ``snr_db + offset`` give the same service as the constants),
one grid per (latency floor, temperature[, SNR requirement]); then the best of them are refined
with Nelder-Mead on (log rate_factor, offset) with the constants themselves. The fitted
constants must give usable gradients: at every training point the rollout's autograd derivative
in p is checked against the model's own finite difference (:func:`gradient_check`); a choice whose
backpropagation through time explodes (measured: L1D with mean-field sends and a floor of 24-32
slots at ``tau = 0.05``) is set aside and the next choice is refined. The loss (:func:`loss`)
has a level term, the mean over the points of the squared log error of delay, AoI and energy
(energy weighted by ``LOSS_WEIGHTS``) plus the delivery-ratio error in units of 0.1, and a slope
term, the same weighted squares of the errors' changes between neighbouring points (along p,
message size, power and fleet size; :func:`neighbours`), times ``SLOPE_WEIGHT``: the users of a
calibration follow its slopes. It is fitted on a training grid and reported on held-out points.

A calibration can be fitted on cells of several fleet sizes at once (``R=(8, 12)``): the loss is
the mean over every (fleet size, point). The effective constants depend on the load a cell
carries, and fitted at one size they lose their fit at another (measured on the full profile's
training grid, fitted at R = 8: QAD mean-field's loss 0.27 there, 3.2 at R = 12 and 6.1 at R = 16);
a fit that sees two sizes is the one that must hold between and beyond them.

Usage::

    from isaac_net.core.diff import calibrate
    cal = calibrate.fit("L1", "relaxed", grid=calibrate.product_grid([0.1, 0.4, 0.8], [6e3, 30e3], [23.0]),
                        R=8)
    net = DiffFluid(E, R, "cpu", mode="L1", tau=cal.tau, cfg=cal.apply(CellConfig()))  # as fitted
    cal.save("calibration.json")
    cal = calibrate.Calibration.load("calibration.json", mode="L1", sends="relaxed")
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import math
import typing
import warnings
from pathlib import Path

import numpy as np
import torch

from isaac_net.core import radio
from isaac_net.core.config import CellConfig
from isaac_net.core.diff.model import MODES, DiffFluid
from isaac_net.core.diff.reference import discrete_rollout
from isaac_net.core.diff.rollout import rollout
from isaac_net.core.kpi import MIN_COUNT_MSGS
from isaac_net.core.levels import L2LegacyConfig

FORMAT = "isaac_net.calibration"
VERSION = 1
SENDS = ("mean_field", "relaxed")
KPIS = ("mean_delay", "delivery_ratio", "mean_aoi", "mean_energy_j")
# Weights of the loss terms: squared log errors of delay, AoI, energy; delivery error in units of 0.1.
LOSS_WEIGHTS = {"mean_delay": 1.0, "mean_aoi": 1.0, "mean_energy_j": 0.5, "delivery_ratio": 1.0}
DELIVERY_UNIT = 0.1
# Weight of the slope term of the loss (the same errors on the change between neighbouring points,
# :func:`loss`) against the level term's 1: the calibration exists for its gradients.
SLOPE_WEIGHT = 1.0
# The coarse search grid: capacity factors, SNR offsets (dB) and latency floors (slots) per mode.
SEARCH = {
    "rate_factor": (0.3, 0.45, 0.6, 0.8, 1.0),
    "snr_offset_db": (-12.0, -8.0, -4.0, 0.0, 4.0),
    "sr_slots": {"L1": (0, 8, 16, 24, 32), "QA": (0, 8, 16, 24, 32)},
    "tau": None,  # relaxation temperatures to choose from (None: the fit's ``tau`` only)
    "qa_snr_req_db": None,  # QAD's headroom requirements to choose from, dB (None: the cell's only)
    "refine_top": 2,  # (latency floor, temperature, requirement) choices refined by Nelder-Mead
    "refine_evals": 30,  # loss evaluations per refinement
    # The gradient check of the fitted constants (``gradient_check``): the half step in p of the
    # model's own finite difference, and the largest error of autograd against it (in units of
    # |FD| + 0.1 |KPI|) that still counts as usable; a backpropagation through time that explodes
    # gives errors of 1e4 to 1e9.
    "gradient_h": 0.02,
    "gradient_max_error": 100.0,
}
KPI_FLOOR = 0.1  # the gradient check's error is |autograd - FD| / (|FD| + KPI_FLOOR |KPI|)


def sr_field(mode: str) -> str:
    """The ``CellConfig`` field of the latency floor of ``mode``."""
    return {"L1": "l1_sr_slots", "QA": "qa_sr_slots"}[mode]


def fleet_sizes(R) -> tuple:
    """``R`` (robots per cell: an integer, or a sequence of distinct ones) as a tuple of ints >= 1."""
    sizes = (R,) if isinstance(R, (int, np.integer)) and not isinstance(R, bool) else R
    try:
        sizes = tuple(sizes)
    except TypeError:
        raise TypeError(f"R: expected an integer >= 1 or a sequence of them, got {R!r}") from None
    if isinstance(R, (str, bytes)) or not sizes or any(not _is_integer(r) or r < 1 for r in sizes):
        raise ValueError(f"R: expected an integer >= 1 or a non-empty sequence of them, got {R!r}")
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"R: expected distinct fleet sizes, got {list(sizes)}")
    return tuple(int(r) for r in sizes)


def _one_fleet_size(R) -> int:
    """``R`` of one use of a calibration: one fleet size, an integer >= 1 (not a tuple of them, a
    float or a string, which ``int()`` would read or round)."""
    if isinstance(R, bool) or not isinstance(R, (int, np.integer)):
        hint = " (one of the fitted sizes, not the tuple)" if isinstance(R, (tuple, list)) else ""
        raise TypeError(f"R: expected one fleet size, an integer >= 1{hint}; got {R!r}")
    if R < 1:
        raise ValueError(f"R: expected one fleet size, an integer >= 1; got {R!r}")
    return int(R)


def concat_points(parts) -> dict:
    """KPIs ``{kpi: [..., n_points]}`` of several fleet sizes as one set of points, in order."""
    parts = list(parts)
    return {k: torch.cat([part[k] for part in parts], -1) for k in parts[0]}


def product_grid(p, msg_bytes, tx_dbm) -> tuple:
    """Operating points ``(p, msg_bytes, tx_dbm)``, the product of the three lists."""
    return tuple((float(a), float(b), float(c)) for a, b, c in itertools.product(p, msg_bytes, tx_dbm))


# ---------------------------------------------------------------------------- targets
@dataclasses.dataclass(frozen=True)
class Problem:
    """The inputs of the operating points, batched as envs: point ``i`` is envs
    ``[i * envs, (i + 1) * envs)``.

    :field p, B, tx_dbm: ``[E, R]``; :field pos: ``[E, R, 2]`` m; :field u: ``[T, E, R]``.
    """

    points: tuple
    envs: int
    T: int
    warmup: int
    p: torch.Tensor
    B: torch.Tensor
    tx_dbm: torch.Tensor
    pos: torch.Tensor
    u: torch.Tensor

    def first(self, n: int) -> "Problem":
        """The first ``n`` envs of every point (the model's share of the target's envs)."""
        if n >= self.envs:
            return self
        idx = torch.arange(len(self.points) * self.envs).view(len(self.points), self.envs)[:, :n].reshape(-1)
        return dataclasses.replace(
            self,
            envs=n,
            p=self.p[idx],
            B=self.B[idx],
            tx_dbm=self.tx_dbm[idx],
            pos=self.pos[idx],
            u=self.u[:, idx],
        )


def problem(
    points,
    *,
    R: int,
    area_m=(40.0, 140.0),
    envs: int = 16,
    T: int = 60,
    warmup: int = 10,
    seed: int = 0,
    dtype=torch.float32,
) -> Problem:
    """Positions uniform in ``area_m`` squared and send uniforms for each point, from one seeded
    generator (the same on every machine)."""
    points = tuple(tuple(float(v) for v in pt) for pt in points)
    if not points:
        raise ValueError("points: expected at least one operating point (p, msg_bytes, tx_dbm)")
    for pt in points:
        if len(pt) != 3 or not (0 <= pt[0] <= 1) or pt[1] <= 0:
            raise ValueError(f"points: expected (p in [0, 1], msg_bytes > 0, tx_dbm), got {pt}")
    lo, hi = (float(a) for a in area_m)
    if not (0 <= lo < hi):
        raise ValueError(f"area_m: expected [low, high] with 0 <= low < high, got {list(area_m)}")
    g = torch.Generator().manual_seed(int(seed))
    n = len(points)
    E = n * envs
    per_env = torch.tensor(points, dtype=dtype).repeat_interleave(envs, 0)  # [E, 3]
    return Problem(
        points,
        envs,
        T,
        warmup,
        p=per_env[:, :1].expand(E, R).contiguous(),
        B=per_env[:, 1:2].expand(E, R).contiguous(),
        tx_dbm=per_env[:, 2:].expand(E, R).contiguous(),
        pos=lo + (hi - lo) * torch.rand(E, R, 2, generator=g, dtype=dtype),
        u=torch.rand(T, E, R, generator=g, dtype=dtype),
    )


def group_kpis(res: dict, n_groups: int) -> dict:
    """Batch KPIs ``[n_groups]`` of consecutive groups of envs from a rollout's per-robot results,
    defined as the rollout's batch means (``kpi.KpiAccumulator``): delay and delivery totals over
    totals with the denominator floored at ``kpi.MIN_COUNT_MSGS``, AoI and energy means."""

    def grp(x):
        return x.reshape(n_groups, -1)

    delivered, offered = grp(res["delivered"]).sum(-1), grp(res["offered"]).sum(-1)
    return {
        "mean_delay": grp(res["delay_sum"]).sum(-1) / delivered.clamp_min(MIN_COUNT_MSGS),
        "delivery_ratio": delivered / offered.clamp_min(MIN_COUNT_MSGS),
        "mean_aoi": grp(res["aoi"]).mean(-1),
        "mean_energy_j": grp(res["energy_j"]).mean(-1),
    }


def measure(
    prob: Problem,
    *,
    level: str = "L2-legacy",
    cfg: CellConfig | None = None,
    l2_cfg: L2LegacyConfig | None = None,
    seed: int = 0,
) -> dict:
    """KPIs ``{kpi: [n_points]}`` (float64) of the discrete level at each operating point."""
    kwargs = {"l2_cfg": l2_cfg} if level == "L2-legacy" and l2_cfg is not None else {}
    res = discrete_rollout(
        level,
        prob.T,
        prob.p,
        prob.B,
        pos=prob.pos,
        tx_dbm=prob.tx_dbm,
        warmup=prob.warmup,
        u=prob.u,
        cfg=cfg,
        dtype=prob.p.dtype,
        seed=seed,
        **kwargs,
    )
    return {k: v.double() for k, v in group_kpis(res, len(prob.points)).items()}


# ---------------------------------------------------------------------------- the model side
def model_kpis(
    mode: str, sends: str, prob: Problem, cfg: CellConfig, *, tau: float, lam: float, candidates=None
) -> dict:
    """KPIs ``{kpi: [n_cand, n_points]}`` of the model at each point, forward only.

    ``candidates``: ``[(rate_factor, snr_offset_db)]`` applied exactly through the inputs
    (bytes ``B / rate_factor``, SNR ``snr_db + offset`` with the energy at the true power) in one
    batched rollout on top of ``cfg``; None: ``cfg`` alone (one candidate).
    """
    cands = [(1.0, 0.0)] if candidates is None else list(candidates)
    n = len(cands)
    dt = prob.p.dtype
    eta = torch.tensor([c[0] for c in cands], dtype=dt).repeat_interleave(prob.p.shape[0]).unsqueeze(-1)
    off = torch.tensor([c[1] for c in cands], dtype=dt).repeat_interleave(prob.p.shape[0]).unsqueeze(-1)
    snr = radio.snr_db(prob.pos, prob.tx_dbm, cfg).repeat(n, 1) + off
    E, R = snr.shape
    net = DiffFluid(E, R, "cpu", mode=mode, tau=tau, cfg=cfg, dtype=dt)
    with torch.no_grad():
        res = rollout(
            net,
            prob.T,
            prob.p.repeat(n, 1),
            prob.B.repeat(n, 1) / eta,
            snr_db=snr,
            tx_dbm=prob.tx_dbm.repeat(n, 1),
            warmup=prob.warmup,
            sends=sends,
            u=prob.u.repeat(1, n, 1) if sends != "mean_field" else None,
            lam=lam,
        )
    return {k: v.double().view(n, -1) for k, v in group_kpis(res, n * len(prob.points)).items()}


def _rollout_kpis(mode: str, sends: str, prob: Problem, cfg: CellConfig, p: torch.Tensor, *, tau: float,
                  lam: float) -> dict:
    """Batch KPIs ``{kpi: [n_points]}`` of the model with constants ``cfg`` at the send probabilities
    ``p`` ``[E, R]`` (the rest of ``prob``'s inputs), differentiable where grad is on."""
    E, R = p.shape
    net = DiffFluid(E, R, "cpu", mode=mode, tau=tau, cfg=cfg, dtype=p.dtype)
    res = rollout(net, prob.T, p, prob.B, pos=prob.pos, tx_dbm=prob.tx_dbm, warmup=prob.warmup, sends=sends,
                  u=prob.u if sends != "mean_field" else None, lam=lam)
    return group_kpis(res, len(prob.points))


def gradient_check(mode: str, sends: str, prob: Problem, cfg: CellConfig, *, tau: float, lam: float,
                   h: float = SEARCH["gradient_h"], max_error: float = SEARCH["gradient_max_error"]) -> dict:
    """Whether the model's gradients are usable with the constants of ``cfg``: at each point of
    ``prob``, the autograd derivative of every KPI with respect to a common shift of p (one
    backward per KPI) against the model's own central finite difference with the half step ``h``
    (smaller where p is within ``2 h`` of 0 or 1), both on the same sends.

    A backpropagation through time that is unstable (a state map that expands, step after step)
    gives derivatives many orders of magnitude above the finite difference, which stays of the
    size of the KPI's change: the error ``|autograd - FD| / (|FD| + KPI_FLOOR |KPI|)`` measures it.
    A point at ``p = 0`` or ``p = 1`` is left out (``skipped``): p cannot move both ways there, so
    there is no central difference, and at ``p = 0`` nothing is delivered and the delay has no value.

    :output: ``{"stable": worst error <= max_error, "worst_error", "kpi", "point", "autograd",
        "fd"}`` (the last four where the error is worst), plus ``h``, ``max_error``, ``kpi_floor``
        and, where some points were left out, ``skipped`` (their points).
    """
    n = len(prob.points)
    per_point = torch.tensor([pt[0] for pt in prob.points], dtype=torch.float64)
    h_pt = torch.minimum(torch.full_like(per_point, float(h)), torch.minimum(per_point, 1.0 - per_point) / 2)
    h_pt = h_pt.clamp_min(1e-4).to(prob.p.dtype)
    inside = (per_point > 0) & (per_point < 1)

    def envs(v):  # [n_points] -> [E, 1], point i's envs
        return v.repeat_interleave(prob.envs).unsqueeze(-1)

    opts = dict(tau=tau, lam=lam)
    shift = torch.zeros(n, dtype=prob.p.dtype, requires_grad=True)
    with torch.enable_grad():
        base = _rollout_kpis(mode, sends, prob, cfg, prob.p + envs(shift), **opts)
        grads = {}
        for i, k in enumerate(KPIS):
            (grads[k],) = torch.autograd.grad(base[k].sum(), shift, retain_graph=i < len(KPIS) - 1)
    with torch.no_grad():
        up = _rollout_kpis(mode, sends, prob, cfg, (prob.p + envs(h_pt)).clamp(0.0, 1.0), **opts)
        down = _rollout_kpis(mode, sends, prob, cfg, (prob.p - envs(h_pt)).clamp(0.0, 1.0), **opts)
    worst = {"worst_error": 0.0, "kpi": None, "point": None, "autograd": None, "fd": None}
    for k in KPIS:
        g = grads[k].double()
        fd = (up[k] - down[k]).double() / (2.0 * h_pt.double())
        err = (g - fd).abs() / (fd.abs() + KPI_FLOOR * base[k].detach().double().abs())
        err = torch.where(torch.isfinite(err), err, math.inf)
        err = torch.where(inside, err, 0.0)  # no central difference at p = 0 or 1
        i = int(err.argmax())
        if float(err[i]) > worst["worst_error"] or worst["kpi"] is None:
            worst = {"worst_error": float(err[i]), "kpi": k, "point": list(prob.points[i]),
                     "autograd": float(g[i]), "fd": float(fd[i])}
    stable = worst["worst_error"] <= max_error
    skipped = [list(pt) for pt, keep in zip(prob.points, inside.tolist(), strict=True) if not keep]
    return {"stable": stable, **worst, "h": float(h), "max_error": float(max_error), "kpi_floor": KPI_FLOOR,
            **({"skipped": skipped} if skipped else {})}


def _errors(model: dict, target: dict) -> tuple[dict, dict]:
    """Per KPI ``[..., n_points]``: the log error of delay, AoI and energy, the delivery error in units
    of ``DELIVERY_UNIT``; and where each is defined (``[n_points]`` bools).

    A target that delivered nothing has no delay (its ``mean_delay`` is the convention 0, not a
    delay) and one that sent nothing no energy to compare (0): e.g. a point at ``p = 0``. There the
    log error has no value and its term is left out (0, and so is every change to or from it in the
    slope term); the point still counts its delivery and AoI. A model that delivers nothing where
    the target does keeps an infinite error."""
    out = {"delivery_ratio": (model["delivery_ratio"] - target["delivery_ratio"]) / DELIVERY_UNIT}
    defined = {"delivery_ratio": torch.ones_like(target["delivery_ratio"], dtype=torch.bool)}
    for k in ("mean_delay", "mean_aoi", "mean_energy_j"):
        defined[k] = target[k] > 0
        out[k] = torch.where(defined[k], torch.log(model[k]) - torch.log(target[k]), 0.0)
    return out, defined


def _weighted_squares(errors: dict) -> torch.Tensor:
    total = sum(LOSS_WEIGHTS[k] * e**2 for k, e in errors.items())
    return torch.where(torch.isfinite(total), total, math.inf)


def point_loss(model: dict, target: dict) -> torch.Tensor:
    """Loss per point ``[..., n_points]``: squared log errors of delay, AoI and energy plus the
    delivery error in units of ``DELIVERY_UNIT``, weighted by ``LOSS_WEIGHTS``. A model that
    delivers nothing where the target does has an infinite loss; a target without a delay or an
    energy (nothing delivered or sent, e.g. at ``p = 0``) leaves that term out (:func:`_errors`)."""
    return _weighted_squares(_errors(model, target)[0])


def neighbours(points, n_sizes: int = 1) -> torch.Tensor:
    """``[n_pairs, 2]`` indices ``(i, j)`` of neighbouring (fleet size, point)s of the points
    ``(p, msg_bytes, tx_dbm)`` taken at ``n_sizes`` fleet sizes, one size after the other (as
    :func:`concat_points`): at one size, two points that differ in one coordinate only, ``j``'s the
    next larger value of it among the points; and one point at two consecutive fleet sizes."""
    points = [tuple(float(v) for v in pt) for pt in points]
    n = len(points)
    values = [sorted({pt[d] for pt in points}) for d in range(3)]
    pairs = []
    for i, a in enumerate(points):
        for j, b in enumerate(points):
            differ = [d for d in range(3) if a[d] != b[d]]
            if len(differ) == 1:
                axis = values[differ[0]]
                if axis.index(b[differ[0]]) == axis.index(a[differ[0]]) + 1:
                    pairs.append((i, j))
    pairs = [(size * n + i, size * n + j) for size in range(n_sizes) for i, j in pairs]
    pairs += [(size * n + i, (size + 1) * n + i) for size in range(n_sizes - 1) for i in range(n)]
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


def loss(model: dict, target: dict, pairs: torch.Tensor | None = None,
         slope_weight: float = SLOPE_WEIGHT) -> torch.Tensor:
    """The fit's loss ``[...]``: the mean :func:`point_loss` over the points (the level term) plus
    ``slope_weight`` times the same weighted squares of the errors' *changes* between the
    neighbours ``pairs`` (:func:`neighbours`), averaged over the pairs (the slope term).

    A KPI's slope along p, message size, power or fleet size is its change between neighbours;
    the slope term is the error of that change (``(m_j - m_i) - (t_j - t_i)`` on the log or
    delivery scale). Levels alone let a fit trade an error at one point against the opposite
    error at its neighbour, a slope of the wrong size: what a gradient-based user then follows.
    """
    errors, defined = _errors(model, target)
    total = _weighted_squares(errors).mean(-1)
    if pairs is None or not len(pairs) or slope_weight == 0:
        return total
    i, j = pairs[:, 0], pairs[:, 1]
    # A change to or from a point where the error has no value has none either.
    changes = {k: torch.where(defined[k][..., j] & defined[k][..., i], e[..., j] - e[..., i], 0.0)
               for k, e in errors.items()}
    return total + slope_weight * _weighted_squares(changes).mean(-1)


# ---------------------------------------------------------------------------- the calibration
_WARNED: set = set()


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Effective constants of one model (``mode``, ``sends``) fitted to L2-legacy, and what they
    were fitted for. Frozen; build with :func:`fit` or :meth:`load`.

    :field rate_factor, snr_offset_db, sr_slots: the constants (``sr_slots``: ``l1_sr_slots``
        for L1D, ``qa_sr_slots`` for QAD).
    :field qa_snr_req_db: QAD's per-subband SNR requirement of its headroom rule, dB (None: not
        fitted, the cell's own; always None for L1D).
    :field tau: the relaxation temperature they were fitted at, the model's to run at:
        ``DiffFluid(..., tau=cal.tau, cfg=cal.apply(cfg))`` (another temperature moves the operating
        point). A file written before the temperature was fitted gives the fit's ``setup["tau"]``.
    :field train_loss, heldout_loss: mean point loss on the training grid and on the held-out
        points (None without them), calibrated; ``uncalibrated_*``: the same for the plain model.
    :field grid, heldout_grid: the points ``(p, msg_bytes, tx_dbm)``.
    :field R: the fleet sizes (robots per cell) of the training cells, a tuple (a file with one
        integer gives a tuple of one).
    :field area_m: the square of the positions, m.
    :field cell, l2_config: the ``CellConfig`` the constants apply to and the ``L2LegacyConfig``
        they were fitted against, as dicts.
    :field setup: the fit's settings (T, warmup, the plain model's tau, lam, envs, seed, search
        grid, loss weights, the slope term's weight and number of pairs).
    :field gradient_check: :func:`gradient_check` of the constants on the training points (``stable``,
        the worst error and where) and the floors ``rejected`` for unusable gradients (None in a
        file written before the check existed).
    """

    mode: str
    sends: str
    rate_factor: float
    snr_offset_db: float
    sr_slots: int
    train_loss: float
    heldout_loss: float | None
    uncalibrated_train_loss: float
    uncalibrated_heldout_loss: float | None
    grid: tuple
    heldout_grid: tuple
    R: tuple
    area_m: tuple
    cell: dict
    l2_config: dict
    setup: dict
    gradient_check: dict | None = None
    tau: float | None = None
    qa_snr_req_db: float | None = None
    provenance: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "R", fleet_sizes(self.R))
        if self.tau is None:  # a file from before the temperature was fitted: the fit's own
            object.__setattr__(self, "tau", float(self.setup["tau"]))
        if not (isinstance(self.tau, (int, float)) and math.isfinite(self.tau) and self.tau > 0):
            raise ValueError(f"tau: expected a finite temperature > 0, got {self.tau!r}")
        req = self.qa_snr_req_db
        is_db = isinstance(req, (int, float)) and not isinstance(req, bool) and math.isfinite(req)
        if req is not None and (self.mode != "QA" or not is_db):
            raise ValueError(f"qa_snr_req_db: expected None or, for mode 'QA', a finite number of dB; "
                             f"got {req!r}")

    @property
    def constants(self) -> dict:
        """The ``CellConfig`` fields this calibration sets, by name."""
        out = {
            "rate_factor": self.rate_factor,
            "snr_offset_db": self.snr_offset_db,
            sr_field(self.mode): self.sr_slots,
        }
        if self.qa_snr_req_db is not None:
            out["qa_snr_req_db"] = self.qa_snr_req_db
        return out

    def apply(
        self,
        cfg: CellConfig | None = None,
        *,
        R: int | None = None,
        area_m=None,
        l2_config: L2LegacyConfig | None = None,
    ) -> CellConfig:
        """``cfg`` (default ``CellConfig()``) with this calibration's constants; run the model at
        :attr:`tau` (the temperature is the model's, not the cell's).

        Name what it is used for to have it checked: another ``R`` or ``area_m`` than fitted for
        is allowed and warns once (the held-out points measure how well it transfers; ``R`` counts
        as fitted for when it is one of the fleet sizes of the fit); a cell
        that differs in other constants warns once too; another ``l2_config`` than it was fitted
        against is refused (``ValueError``).
        """
        cfg = CellConfig() if cfg is None else cfg
        if not isinstance(cfg, CellConfig):
            raise TypeError(f"cfg: expected a CellConfig, got {type(cfg).__name__}")
        if l2_config is not None:
            if not isinstance(l2_config, L2LegacyConfig):
                raise TypeError(f"l2_config: expected an L2LegacyConfig, got {type(l2_config).__name__}")
            theirs = _jsonable(dataclasses.asdict(l2_config))
            if theirs != self.l2_config:
                diff = sorted(k for k in theirs if theirs[k] != self.l2_config.get(k))
                raise ValueError(
                    f"l2_config: this calibration ({self.mode}, {self.sends}) was fitted against "
                    f"another L2LegacyConfig (differs in {', '.join(diff)}); refit it"
                )
        if R is not None:
            R = _one_fleet_size(R)
        differs = []
        if R is not None and R not in self.R:
            differs.append(f"R = {R} (fitted for {' and '.join(map(str, self.R))})")
        if area_m is not None and tuple(float(a) for a in area_m) != tuple(self.area_m):
            differs.append(f"area_m = {list(area_m)} (fitted for {list(self.area_m)})")
        mine = {k: v for k, v in _jsonable(dataclasses.asdict(cfg)).items() if k not in _CALIBRATED_FIELDS}
        base = {k: v for k, v in self.cell.items() if k not in _CALIBRATED_FIELDS}
        cell_diff = sorted(k for k in mine if mine[k] != base.get(k))
        if cell_diff:
            differs.append(f"cell constants {', '.join(cell_diff)} differ from those fitted on")
        key = (self.mode, self.sends, tuple(self.constants.items()), self.tau, tuple(differs))
        if differs and key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(
                f"calibration ({self.mode}, {self.sends}) used outside what it was fitted for: "
                + "; ".join(differs),
                stacklevel=2,
            )
        return dataclasses.replace(cfg, **self.constants)

    def model(self, E: int, R: int, device="cpu", *, cfg: CellConfig | None = None, area_m=None,
              l2_config: L2LegacyConfig | None = None, **kwargs) -> DiffFluid:
        """The calibrated model as fitted: ``DiffFluid(E, R, device, mode=self.mode, tau=self.tau,
        cfg=self.apply(cfg, R=R, area_m=area_m, l2_config=l2_config), **kwargs)`` (``kwargs``: the
        rest of ``DiffFluid``'s, e.g. ``dtype``, ``compile``). Roll it out with ``sends=self.sends``."""
        if "mode" in kwargs or "tau" in kwargs:
            raise TypeError("model: mode and tau are the calibration's "
                            "(build DiffFluid yourself to change them)")
        return DiffFluid(E, R, device, mode=self.mode, tau=self.tau,
                         cfg=self.apply(cfg, R=R, area_m=area_m, l2_config=l2_config), **kwargs)

    def to_dict(self) -> dict:
        return _jsonable(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict, source: str = "the dict") -> "Calibration":
        """A calibration from its dict (:meth:`to_dict`, an entry of a calibration file), every field
        checked: a ValueError or TypeError names ``source`` (the file) and the field."""
        if not isinstance(d, dict):
            raise TypeError(f"{source}: expected a calibration entry (a JSON object), got {type(d).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        optional = ("provenance", "gradient_check", "tau", "qa_snr_req_db")
        missing = [n for n in names if n not in d and n not in optional]
        if missing:
            raise ValueError(f"{source}: a calibration entry lacks {', '.join(missing)}")
        kw = {n: d[n] for n in names if n in d}
        _check_fields(kw, source)
        kw["grid"] = tuple(tuple(pt) for pt in kw["grid"])
        kw["heldout_grid"] = tuple(tuple(pt) for pt in kw["heldout_grid"])
        kw["area_m"] = tuple(kw["area_m"])
        try:
            return cls(**kw)
        except (TypeError, ValueError) as err:  # the checks of __post_init__ (R, tau, qa_snr_req_db)
            raise type(err)(f"{source}: {err}") from None

    def save(self, path) -> None:
        """Write this calibration into the calibration file ``path``, replacing an entry of the same
        ``(mode, sends)`` and keeping the others (a new file when there is none)."""
        path = Path(path)
        entries = _read_file(path) if path.exists() else []
        entries = [e for e in entries if (e["mode"], e["sends"]) != (self.mode, self.sends)] + [
            self.to_dict()
        ]
        save_all(path, entries)

    @classmethod
    def load(cls, path, *, mode: str, sends: str) -> "Calibration":
        """The calibration of ``(mode, sends)`` from the calibration file ``path``."""
        _check_model(mode, sends)
        entries = _read_file(Path(path))
        for e in entries:
            if (e["mode"], e["sends"]) == (mode, sends):
                return cls.from_dict(e, str(path))
        have = ", ".join(f"({e.get('mode')}, {e.get('sends')})" for e in entries) or "none"
        raise ValueError(f"{path}: no calibration for mode={mode!r}, sends={sends!r}; the file holds: {have}")


_CALIBRATED_FIELDS = ("rate_factor", "snr_offset_db", "l1_sr_slots", "qa_sr_slots", "qa_snr_req_db")


def save_all(path, calibrations) -> None:
    """Write several calibrations (``Calibration`` or their dicts) as one calibration file.

    A non-finite number (a loss or a gradient check's error of inf) is written as JSON's
    extension ``Infinity`` / ``NaN``, which :meth:`Calibration.load` reads back as it was."""
    entries = [c.to_dict() if isinstance(c, Calibration) else c for c in calibrations]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(
        json.dumps({"format": FORMAT, "version": VERSION, "calibrations": entries}, indent=1, allow_nan=True)
        + "\n"
    )


def _field_error(source: str, name: str, expected: str, value, kind=ValueError):
    return kind(f"{source}: calibration field {name!r}: expected {expected}, got {value!r}")


def _check_fields(kw: dict, source: str) -> None:
    """Every field of a calibration entry of the right type and range (the error names ``source``
    and the field). A loss may be inf (a point the model could not meet) or null (none measured,
    or written as null by a strict-JSON writer such as the pipeline's artifacts)."""
    def number(name, *, finite=True, optional=False, lo=None, lo_open=False):
        v = kw.get(name)
        if v is None and optional:
            return
        what = "a finite number" if finite else "a number"
        what += "" if lo is None else f" {'>' if lo_open else '>='} {lo:g}"
        what += " or null" if optional else ""
        if not _is_number(v):
            raise _field_error(source, name, what, v, TypeError)
        if math.isnan(v) or (finite and not math.isfinite(v)) or (
                lo is not None and (v <= lo if lo_open else v < lo)):
            raise _field_error(source, name, what, v)

    for name in ("mode", "sends"):
        allowed = MODES if name == "mode" else SENDS
        if kw[name] not in allowed:
            raise _field_error(source, name, f"one of {list(allowed)}", kw[name])
    number("rate_factor", lo=0.0, lo_open=True)
    number("snr_offset_db")
    if not _is_integer(kw["sr_slots"]) or kw["sr_slots"] < 0:
        raise _field_error(source, "sr_slots", "an integer >= 0 (slots)", kw["sr_slots"],
                           TypeError if not _is_integer(kw["sr_slots"]) else ValueError)
    for name in ("train_loss", "uncalibrated_train_loss", "heldout_loss", "uncalibrated_heldout_loss"):
        number(name, finite=False, optional=True, lo=0.0)
    for name in ("grid", "heldout_grid"):
        v = kw[name]
        if not isinstance(v, (list, tuple)):
            raise _field_error(source, name, "a list of points [p, msg_bytes, tx_dbm]", v, TypeError)
        if not all(isinstance(pt, (list, tuple)) for pt in v):
            raise _field_error(source, name, "a list of points [p, msg_bytes, tx_dbm]", v, TypeError)
        try:
            _check_points(v, repr(name), allow_empty=name == "heldout_grid")
        except (TypeError, ValueError) as err:
            raise type(err)(f"{source}: calibration field {err}") from None
    try:
        fleet_sizes(kw["R"])
    except (TypeError, ValueError) as err:
        raise type(err)(f"{source}: calibration field {err}") from None
    area = kw["area_m"]
    if not (isinstance(area, (list, tuple)) and len(area) == 2 and all(_is_number(a) for a in area)
            and all(math.isfinite(a) for a in area) and 0 <= area[0] < area[1]):
        raise _field_error(source, "area_m", "[low, high] m with 0 <= low < high", area)
    cell = kw["cell"]
    if not isinstance(cell, dict):
        raise _field_error(source, "cell", "the CellConfig fitted on, as an object", cell, TypeError)
    try:
        CellConfig(**cell)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{source}: calibration field 'cell': not a valid CellConfig: {err}") from None
    l2 = kw["l2_config"]
    if not isinstance(l2, dict):
        raise _field_error(source, "l2_config", "the L2LegacyConfig fitted against, as an object", l2,
                           TypeError)
    try:
        L2LegacyConfig(**l2)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{source}: calibration field 'l2_config': not a valid L2LegacyConfig: "
                         f"{err}") from None
    if not isinstance(kw["setup"], dict):
        raise _field_error(source, "setup", "the fit's settings, as an object", kw["setup"], TypeError)
    number("tau", optional=True, lo=0.0, lo_open=True)
    if kw.get("tau") is None:  # a file from before the temperature was fitted: the fit's own
        t = kw["setup"].get("tau")
        if not (_is_number(t) and math.isfinite(t) and t > 0):
            raise _field_error(source, "tau", "a temperature > 0 (or, in a file without one, setup.tau)",
                               t, TypeError if not _is_number(t) else ValueError)
    number("qa_snr_req_db", optional=True)
    for name in ("gradient_check", "provenance"):
        v = kw.get(name)
        if v is not None and not isinstance(v, dict):
            raise _field_error(source, name, "an object or null", v, TypeError)
    if "provenance" in kw and kw["provenance"] is None:
        raise _field_error(source, "provenance", "an object", None, TypeError)


def _read_file(path: Path) -> list:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such calibration file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a calibration file (not readable JSON: {err})") from None
    if not (isinstance(data, dict) and data.get("format") == FORMAT):
        raise ValueError(f"{path}: not a calibration file (expected a JSON object with format {FORMAT!r})")
    if data.get("version") != VERSION or not isinstance(data.get("calibrations"), list):
        raise ValueError(
            f"{path}: calibration file version {data.get('version')!r}; this library reads "
            f"version {VERSION} with a list 'calibrations'"
        )
    for i, e in enumerate(data["calibrations"]):
        if not isinstance(e, dict):
            raise TypeError(f"{path}: calibrations[{i}]: expected a calibration entry (a JSON object), "
                            f"got {e!r}")
        for name, allowed in (("mode", MODES), ("sends", SENDS)):
            if e.get(name) not in allowed:
                raise ValueError(f"{path}: calibrations[{i}]: field {name!r}: expected one of "
                                 f"{list(allowed)}, got {e.get(name)!r}")
    return data["calibrations"]


def _jsonable(x):
    """``x`` as JSON's types: dicts with string keys, lists; numbers as they are (a non-finite one is
    written as ``Infinity`` / ``NaN`` by :func:`save_all` and read back unchanged)."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _check_model(mode, sends) -> None:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if sends not in SENDS:
        raise ValueError(f"sends: expected one of {', '.join(SENDS)}, got {sends!r}")


# ---------------------------------------------------------------------------- the fit
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
    progress: bool = False,
    provenance: dict | None = None,
) -> Calibration:
    """Fit the constants of ``(mode, sends)`` to ``level``'s KPIs on the operating points ``grid``.

    :param grid: training points ``(p, msg_bytes, tx_dbm)``; :param heldout: points never used
        by the fit, where the held-out loss is measured (none: ``heldout_loss`` is None).
    :param R: robots per cell, or several fleet sizes: every point is measured and fitted at each
        (the loss is the mean over fleet sizes and points).
    :param envs: cells per point on ``level`` (``envs`` seeds of positions and sends);
        :param model_envs: the first ``model_envs`` of them run through the model.
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
    """
    _check_model(mode, sends)
    if level != "L2-legacy":
        raise ValueError(f"level: calibrations are fitted to 'L2-legacy', got {level!r}")
    cfg = CellConfig() if cfg is None else cfg
    if cfg.is_calibrated:
        raise ValueError("cfg: expected the plain cell (no calibration constants) to fit on")
    l2_cfg = L2LegacyConfig() if l2_cfg is None else l2_cfg
    if not (isinstance(model_envs, int) and 1 <= model_envs <= envs):
        raise ValueError(f"model_envs: expected an integer in [1, envs={envs}], got {model_envs!r}")
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
    # QAD's headroom requirement: None keeps the cell's (and records nothing); L1D has no such rule.
    reqs = (None,) if mode != "QA" or sp.get("qa_snr_req_db") is None else tuple(
        float(r) for r in sp["qa_snr_req_db"])
    if not reqs or any(r is not None and not math.isfinite(r) for r in reqs):
        raise ValueError(f"search: SNR requirements (qa_snr_req_db) must be finite dB, got {list(reqs)}")
    if isinstance(slope_weight, bool) or not isinstance(slope_weight, (int, float)) or not (
            math.isfinite(slope_weight) and slope_weight >= 0):
        raise ValueError(f"slope_weight: expected a finite number >= 0, got {slope_weight!r}")
    sizes = fleet_sizes(R)
    kw = dict(area_m=area_m, envs=envs, T=T, warmup=warmup)
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
    m_train = [t.first(model_envs) for t in train]
    train_pairs = neighbours(grid, len(sizes))

    def fit_loss(kpis: dict, tgt: dict, pairs: torch.Tensor = train_pairs) -> torch.Tensor:
        return loss(kpis, tgt, pairs, float(slope_weight))

    def kpis_on(parts, c: CellConfig, t: float, candidates=None) -> dict:
        """The model's KPIs on every fleet size's problem, as one set of points."""
        return concat_points(model_kpis(mode, sends, part, c, tau=t, lam=lam, candidates=candidates)
                             for part in parts)

    def with_constants(eta, off, L, req=None):
        extra = {} if req is None else {"qa_snr_req_db": float(req)}
        return dataclasses.replace(
            cfg, rate_factor=float(eta), snr_offset_db=float(off), **{sr_field(mode): int(L)}, **extra
        )

    def cell_of(f: _Fitted) -> CellConfig:
        return with_constants(f.rate_factor, f.snr_offset_db, f.sr_slots, f.qa_snr_req_db)

    # 1. Coarse grid: one batched rollout per (latency floor, temperature, SNR requirement).
    cands = list(itertools.product(sp["rate_factor"], sp["snr_offset_db"]))
    coarse: list[_Fitted] = []
    choices = list(itertools.product(floors, taus, reqs))
    for L, t, req in _bar(choices, progress, f"calibrate {mode}D {sends}: grid"):
        losses = fit_loss(kpis_on(m_train, with_constants(1.0, 0.0, L, req), t, candidates=cands), targets)
        coarse += [_Fitted(float(v), eta, off, int(L), t, req)
                   for v, (eta, off) in zip(losses.tolist(), cands, strict=True)]
    coarse.sort(key=lambda r: r.loss)

    # 2. Refinement of the best (floor, temperature, requirement) choices with the constants themselves.
    from scipy.optimize import minimize

    tried = []

    def refine(choice: tuple) -> _Fitted:
        """Nelder-Mead on (log rate factor, offset) at the floor, temperature and requirement
        ``choice`` from its best grid point."""
        L, t, req = choice
        start = next(r for r in coarse if r.choice == choice)

        def objective(z):
            eta = float(np.exp(np.clip(z[0], math.log(0.05), math.log(2.0))))
            kpis = kpis_on(m_train, with_constants(eta, z[1], L, req), t)
            value = float(fit_loss(kpis, targets)[0])
            tried.append(_Fitted(value, eta, float(z[1]), L, t, req))
            return value if math.isfinite(value) else 1e12

        res = minimize(
            objective,
            x0=[math.log(start.rate_factor), start.snr_offset_db],
            method="Nelder-Mead",
            options={
                "maxfev": int(sp["refine_evals"]),
                "xatol": 1e-3,
                "fatol": 1e-4,
                "initial_simplex": [
                    [math.log(start.rate_factor), start.snr_offset_db],
                    [math.log(start.rate_factor) + 0.15, start.snr_offset_db],
                    [math.log(start.rate_factor), start.snr_offset_db + 1.5],
                ],
            },
        )
        cand = _Fitted(float(res.fun), float(np.exp(np.clip(res.x[0], math.log(0.05), math.log(2.0)))),
                       float(res.x[1]), L, t, req)
        if progress:
            print(
                f"calibrate {mode}D {sends}: floor {L} slots, tau {t:g}{_req_text(req)} -> "
                f"loss {cand.loss:.4g} (rate factor {cand.rate_factor:.3f}, offset "
                f"{cand.snr_offset_db:.2f} dB; {res.nfev} evaluations)",
                flush=True,
            )
        return cand

    # 3. The gradient check: the refined constants with the lowest loss whose gradients are usable
    # win. While every refined choice fails it, the next choice of the grid's ranking is refined.
    ranking = list(dict.fromkeys(r.choice for r in coarse))
    refined = [refine(choice) for choice in ranking[: int(sp["refine_top"])]]
    pending = ranking[int(sp["refine_top"]):]
    checks: dict = {}
    best = None
    while best is None:
        for cand in sorted(refined, key=lambda c: c.loss):
            if cand not in checks:
                checks[cand] = _worst_check([
                    {**gradient_check(mode, sends, part, cell_of(cand), tau=cand.tau, lam=lam,
                                      h=sp["gradient_h"], max_error=sp["gradient_max_error"]), "R": r}
                    for r, part in zip(sizes, m_train, strict=True)])
                if progress:
                    c = checks[cand]
                    print(f"calibrate {mode}D {sends}: floor {cand.sr_slots} slots, tau {cand.tau:g}"
                          f"{_req_text(cand.qa_snr_req_db)}, "
                          f"gradient check {'passed' if c['stable'] else 'FAILED'} "
                          f"(worst error {c['worst_error']:.3g}: "
                          f"d {c['kpi']} / d p {c['autograd']:.4g} against FD {c['fd']:.4g} at {c['point']}, "
                          f"R = {c['R']})",
                          flush=True)
            if checks[cand]["stable"]:
                best = cand
                break
        else:
            if not pending:
                break
            refined.append(refine(pending.pop(0)))
    if best is None:  # no choice gives usable gradients: the best fit, flagged
        best = min(refined, key=lambda c: c.loss)
        with_reqs = "" if reqs == (None,) else f" and SNR requirement of {list(reqs)} dB"
        warnings.warn(f"calibrate {mode}D {sends}: no latency floor of {list(floors)} at a temperature of "
                      f"{list(taus)}{with_reqs} passes the gradient check; the calibration is flagged "
                      "(gradient_check.stable is False)", stacklevel=2)
    grad_check = {**checks[best], "rejected": [
        {"sr_slots": c.sr_slots, "tau": c.tau, "qa_snr_req_db": c.qa_snr_req_db, "rate_factor": c.rate_factor,
         "snr_offset_db": c.snr_offset_db, "train_loss": c.loss,
         "worst_error": checks[c]["worst_error"], "kpi": checks[c]["kpi"], "point": checks[c]["point"],
         "R": checks[c]["R"]}
        for c in sorted(checks, key=lambda c: c.loss) if c != best and not checks[c]["stable"]]}
    fitted, plain = cell_of(best), cfg

    def loss_on(parts, tgt, c, t, pairs=train_pairs):
        return float(fit_loss(kpis_on(parts, c, t), tgt, pairs)[0])

    uncal_train = loss_on(m_train, targets, plain, tau)
    heldout_loss = uncal_heldout = None
    if held is not None:
        m_held, held_pairs = [h.first(model_envs) for h in held], neighbours(heldout, len(sizes))
        heldout_loss = loss_on(m_held, heldout_targets, fitted, best.tau, held_pairs)
        uncal_heldout = loss_on(m_held, heldout_targets, plain, tau, held_pairs)
    setup = {
        "level": level,
        "T": T,
        "warmup": warmup,
        "tau": tau,
        "lam": lam,
        "envs": envs,
        "model_envs": model_envs,
        "seed": seed,
        "search": {**sp, "sr_slots": list(floors), "tau": list(taus),
                   "qa_snr_req_db": None if reqs == (None,) else list(reqs)},
        "loss_weights": LOSS_WEIGHTS,
        "delivery_unit": DELIVERY_UNIT,
        "slope_weight": float(slope_weight),
        "slope_pairs": len(train_pairs),
        "evaluations": len(coarse) + len(tried),
        "gradient_checks": len(checks),
    }
    prov = {
        "torch": torch.__version__,
        "fitted_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **(provenance or {}),
    }
    return Calibration(
        mode=mode,
        sends=sends,
        rate_factor=best.rate_factor,
        snr_offset_db=best.snr_offset_db,
        sr_slots=int(best.sr_slots),
        train_loss=best.loss,
        heldout_loss=heldout_loss,
        uncalibrated_train_loss=uncal_train,
        uncalibrated_heldout_loss=uncal_heldout,
        grid=train[0].points,
        heldout_grid=held[0].points if held is not None else (),
        R=sizes,
        area_m=tuple(float(a) for a in area_m),
        cell=_jsonable(dataclasses.asdict(cfg)),
        l2_config=_jsonable(dataclasses.asdict(l2_cfg)),
        setup=_jsonable(setup),
        gradient_check=_jsonable(grad_check),
        tau=best.tau,
        qa_snr_req_db=best.qa_snr_req_db,
        provenance=prov,
    )


def _check_points(points, name: str, *, allow_empty: bool) -> None:
    """Operating points ``(p, msg_bytes, tx_dbm)``: ``p`` in [0, 1], a size > 0, finite numbers."""
    try:
        pts = [tuple(pt) for pt in points]
    except TypeError:
        raise TypeError(f"{name}: expected a sequence of points (p, msg_bytes, tx_dbm), "
                        f"got {points!r}") from None
    if not pts and not allow_empty:
        raise ValueError(f"{name}: expected at least one operating point (p, msg_bytes, tx_dbm), got none")
    for pt in pts:
        if len(pt) != 3 or not all(_is_number(v) and math.isfinite(v) for v in pt):
            raise ValueError(f"{name}: expected points (p, msg_bytes, tx_dbm) of finite numbers, got {pt!r}")
        if not (0 <= pt[0] <= 1 and pt[1] > 0):
            raise ValueError(f"{name}: expected points (p in [0, 1], msg_bytes > 0, tx_dbm), got {pt!r}")


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _is_integer(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


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
    values("search['qa_snr_req_db']", sp["qa_snr_req_db"], optional=True)
    for key in ("refine_top", "refine_evals"):
        v = sp[key]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"search[{key!r}]: expected an integer >= 1, got {v!r}")
    for key in ("gradient_h", "gradient_max_error"):
        v = sp[key]
        if not (_is_number(v) and math.isfinite(v) and v > 0):
            raise ValueError(f"search[{key!r}]: expected a finite number > 0, got {v!r}")
    return sp


def _check_targets(targets: dict, name: str, n: int) -> None:
    """Targets must hold every KPI at each of the ``n`` (fleet size, point) pairs."""
    missing = [k for k in KPIS if k not in targets]
    if missing:
        raise ValueError(f"{name}: expected the KPIs {list(KPIS)}, missing {missing}")
    shapes = {k: tuple(targets[k].shape) for k in KPIS}
    if any(shape[-1:] != (n,) for shape in shapes.values()):
        raise ValueError(f"{name}: expected {n} values per KPI (fleet sizes x points, one size after the "
                         f"other), got shapes {shapes}")


def _worst_check(checks: list) -> dict:
    """One gradient check of several fleet sizes: the worst of them, stable only if all are."""
    worst = max(checks, key=lambda c: c["worst_error"])
    return {**worst, "stable": all(c["stable"] for c in checks)}


class _Fitted(typing.NamedTuple):
    """One evaluated set of constants of :func:`fit`: its training loss and the constants."""

    loss: float
    rate_factor: float
    snr_offset_db: float
    sr_slots: int
    tau: float
    qa_snr_req_db: float | None

    @property
    def choice(self) -> tuple:
        """What the coarse grid batches over: (latency floor, temperature, SNR requirement)."""
        return self.sr_slots, self.tau, self.qa_snr_req_db


def _req_text(req) -> str:
    return "" if req is None else f", SNR requirement {req:g} dB"


def _bar(items, progress: bool, desc: str):
    if not progress:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, mininterval=2.0)


__all__ = [
    "Calibration",
    "fit",
    "gradient_check",
    "group_kpis",
    "loss",
    "measure",
    "model_kpis",
    "neighbours",
    "point_loss",
    "problem",
    "product_grid",
    "save_all",
    "sr_field",
]
