"""The model side of a calibration: the fluid model's KPIs at the operating points (forward, the
candidates' constants batched through the inputs), the energy under any time-on-air constants from
two recorded rollouts (:class:`AirBasis`) and the check that its gradients are usable.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from isaac_net.core import kpi, radio
from isaac_net.core.config import CellConfig
from isaac_net.core.diff import relax
from isaac_net.core.diff.calibrate.loss import TARGET_KPIS, group_kpis
from isaac_net.core.diff.calibrate.targets import Problem
from isaac_net.core.diff.model import DiffFluid, crowded_on_air_s
from isaac_net.core.diff.rollout import rollout

# The gradient check's defaults: the half step in p of the model's own finite difference, and the
# largest error of autograd against it (in units of |FD| + KPI_FLOOR |KPI|) that still counts as
# usable; a backpropagation through time that explodes gives errors of 1e4 to 1e9.
GRADIENT_H = 0.02
GRADIENT_MAX_ERROR = 100.0
KPI_FLOOR = 0.1  # the gradient check's error is |autograd - FD| / (|FD| + KPI_FLOOR |KPI|)


def model_kpis(
    mode: str, sends: str, prob: Problem, cfg: CellConfig, *, tau: float, lam: float, candidates=None,
    compile: bool = False, on_step=None,
) -> dict:
    """KPIs ``{kpi: [n_cand, n_points]}`` of the model at each point, forward only.

    ``candidates``: ``[(rate_factor, snr_offset_db)]`` applied exactly through the inputs
    (bytes ``B / rate_factor``, SNR ``snr_db + offset`` with the energy at the true power) in one
    batched rollout on top of ``cfg``; None: ``cfg`` alone (one candidate). ``cfg``'s own capacity
    factor and SNR offset go through the inputs too (combined with each candidate's), so every
    candidate and set of constants with one latency floor runs one model config. ``compile``: the
    model's compiled step (``DiffFluid(compile=True)``; the same KPIs to float rounding; it is
    compiled once per model config, so the constants fitted by Nelder-Mead cost no new compile; a cell
    with a calibrated time on air, whose constants are the config's, runs eagerly). ``on_step``:
    given each step's KPIs ``{name: [n_cand * E, R]}`` (``rollout``'s).
    """
    # A calibrated time on air is a cell constant: a compiled L1D step would compile again for each
    # value (the fit's search of them, the interpolated sizes); such a cell runs eagerly.
    compile = compile and cfg.air_is_plain
    # (the cfg's constants times / plus each candidate's, then the cfg without them)
    cands = [(cfg.rate_factor * eta, cfg.snr_offset_db + off)
             for eta, off in ([(1.0, 0.0)] if candidates is None else candidates)]
    cfg = dataclasses.replace(cfg, rate_factor=1.0, snr_offset_db=0.0)
    n = len(cands)
    dt = prob.p.dtype
    eta = torch.tensor([c[0] for c in cands], dtype=dt).repeat_interleave(prob.p.shape[0]).unsqueeze(-1)
    off = torch.tensor([c[1] for c in cands], dtype=dt).repeat_interleave(prob.p.shape[0]).unsqueeze(-1)
    snr = radio.snr_db(prob.pos, prob.tx_dbm, cfg).repeat(n, 1) + off
    E, R = snr.shape
    net = DiffFluid(E, R, "cpu", mode=mode, tau=tau, cfg=cfg, dtype=dt, compile=compile)
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
            on_step=on_step,
        )
    return {k: v.double().view(n, -1) for k, v in group_kpis(res, n * len(prob.points)).items()}


# The probe's time-on-air factor (CellConfig's smallest): far below the cap at the step, where the
# relative-temperature smin(a, 1) = a (1 + a^(1/tau))^(-tau) is a to 1e-4 or better (a = factor
# smax(n, 1) t / step_s <= 1e-3 R t / step_s, what robots that share a step's band reach) and its
# inverse is well conditioned.
_PROBE_AIR_FACTOR = 1e-3


@dataclasses.dataclass(frozen=True)
class AirBasis:
    """The model's KPIs under any time-on-air constants, from two rollouts (:meth:`record`).

    Energy does not feed back into the queues: every KPI but the energy is the plain rule's, and a
    robot's energy in a step is ``tx_w`` times its time on air,
    ``step_s smin(t air_factor smax(n, 1)^air_crowd_exp / step_s, 1)`` (``diff.model.crowded_on_air_s``)
    with ``t`` its band-rate time and ``n`` the cell's soft count of backlogged robots, both
    independent of the constants. The plain rollout gives ``tx_w t`` per step; a probe with the
    exponent 1 and a factor too small for the cap gives ``tx_w t factor smax(n, 1)``.

    :field kpis: ``{kpi: [1, n_points]}`` the plain rule's KPIs (``model_kpis``).
    :field tx_w: ``[E, R]`` transmit power, W. :field tx_s: ``[S, E, R]`` band-rate time on air per
        counted step, s (S steps after the warm-up). :field crowd: ``[S, E, R]`` ``smax(n, 1)`` of
        the robot's cell at that step (1 where the robot sent nothing: its energy is 0 at any).
    """

    kpis: dict
    tx_w: torch.Tensor
    tx_s: torch.Tensor
    crowd: torch.Tensor
    step_s: float
    tau: float

    @classmethod
    def record(cls, mode: str, sends: str, prob: Problem, cfg: CellConfig, *, tau: float, lam: float,
               compile: bool = False) -> "AirBasis":
        """The basis of ``cfg``'s model on ``prob`` (``cfg``'s own time on air is set aside)."""
        plain = dataclasses.replace(cfg, air_factor=1.0, air_crowd_exp=0.0)
        probe = dataclasses.replace(cfg, air_factor=_PROBE_AIR_FACTOR, air_crowd_exp=1.0)
        steps: dict = {"plain": [], "probe": []}
        kpis = model_kpis(mode, sends, prob, plain, tau=tau, lam=lam, compile=compile,
                          on_step=lambda out: steps["plain"].append(out["energy_j"]))
        model_kpis(mode, sends, prob, probe, tau=tau, lam=lam,
                   on_step=lambda out: steps["probe"].append(out["energy_j"]))
        plain_j, probe_j = (torch.stack(steps[k][prob.warmup:]).double() for k in ("plain", "probe"))
        tx_w = radio.dbm_to_w(prob.tx_dbm).double().expand(plain_j.shape[1:])
        if not relax.is_hard(tau):  # the probe's smin(a, 1) = r undone: a = r (1 - r^(1/tau))^(-tau)
            r = (probe_j / (tx_w * cfg.step_s)).clamp(0.0, 1.0)
            probe_j = probe_j * torch.exp(-tau * torch.log1p(-(r ** (1.0 / tau)).clamp_max(0.5)))
        sent = plain_j > 0
        crowd = torch.where(sent, probe_j / (_PROBE_AIR_FACTOR * torch.where(sent, plain_j, 1.0)), 1.0)
        return cls(kpis, tx_w, plain_j / tx_w, crowd, float(cfg.step_s), float(tau))

    def energy(self, air_factor: float, air_crowd_exp: float) -> torch.Tensor:
        """``mean_energy_j`` ``[1, n_points]`` with the constants (the rule of ``diff.model.on_air_s``;
        at the plain constants (1, 0) the plain rule's, uncapped)."""
        if CellConfig(air_factor=air_factor, air_crowd_exp=air_crowd_exp).air_is_plain:
            return self.kpis["mean_energy_j"]
        on_air_s = crowded_on_air_s(self.tx_s, self.crowd, air_factor, air_crowd_exp, self.step_s, self.tau)
        e = self.tx_w * on_air_s
        n = self.kpis["mean_energy_j"].shape[-1]
        return kpi.grouped_batch_kpis({"energy_j": e.mean(0)}, n, (kpi.BY_BATCH_KEY["mean_energy_j"],))[
            "mean_energy_j"].view(1, n)

    def at(self, air_factor: float, air_crowd_exp: float) -> dict:
        """The KPIs ``{kpi: [1, n_points]}`` with the constants."""
        return {**self.kpis, "mean_energy_j": self.energy(air_factor, air_crowd_exp)}


def _rollout_kpis(mode: str, sends: str, prob: Problem, cfg: CellConfig, p: torch.Tensor, *, tau: float,
                  lam: float) -> dict:
    """Batch KPIs ``{kpi: [n_points]}`` of the model with constants ``cfg`` at the send probabilities
    ``p`` ``[E, R]`` (the rest of ``prob``'s inputs), differentiable where grad is on."""
    E, R = p.shape
    net = DiffFluid(E, R, "cpu", mode=mode, tau=tau, cfg=cfg, dtype=p.dtype)
    res = rollout(net, prob.T, p, prob.B, pos=prob.pos, tx_dbm=prob.tx_dbm, warmup=prob.warmup, sends=sends,
                  u=prob.u if sends != "mean_field" else None, lam=lam)
    return group_kpis(res, len(prob.points))


def check_gradients(mode: str, sends: str, prob: Problem, cfg: CellConfig, *, tau: float, lam: float,
                   h: float = GRADIENT_H, max_error: float = GRADIENT_MAX_ERROR) -> dict:
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
        for i, k in enumerate(TARGET_KPIS):
            (grads[k],) = torch.autograd.grad(base[k].sum(), shift, retain_graph=i < len(TARGET_KPIS) - 1)
    with torch.no_grad():
        up = _rollout_kpis(mode, sends, prob, cfg, (prob.p + envs(h_pt)).clamp(0.0, 1.0), **opts)
        down = _rollout_kpis(mode, sends, prob, cfg, (prob.p - envs(h_pt)).clamp(0.0, 1.0), **opts)
    worst = {"worst_error": 0.0, "kpi": None, "point": None, "autograd": None, "fd": None}
    for k in TARGET_KPIS:
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

