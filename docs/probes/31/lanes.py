"""Probe (31) (g): QAD served one robot after another in a random order, where QA's static share serves
every robot backlogged in a step side by side (processor sharing, which completes a step's equal
messages together or not at all). Importing it patches ``model.MODES["QA"]`` (off the fused node).

A robot served takes ``alloc`` subbands (the whole band up to its headroom) at its rate alone ``rate``
(the PF gain of the backlogged count kept), so its queue takes ``A = bytes / rate`` seconds alone and
``V = alloc A`` subband-seconds. The cell packs the robots' subband-seconds into ``S`` subbands in a
random order: robot i starts after ``U W_i``, ``U`` uniform on [0, 1] and ``W_i`` the others' work over
the band, ``(sum V - V_i) / S``. Its expected service by a horizon ``T`` (its interval ``T - sr``) is
``E[clamp(T - sr - U W, 0, A)]``, in closed form by ``K`` below, as are its messages' expected bytes
served and the chance each prefix completes, ``clamp((T - sr - a) / W, 0, 1)`` (``a`` the prefix's time
alone). A uniform start neither packs exactly nor excludes two robots on one band: the horizon ``T`` is
the root of "the band's work served = min(S step, the work queued)" (bisection, then one Newton step
for the gradient), ``T = step`` where the step already serves exactly that; times inside the interval
are mapped back by ``step / T``. Equal messages whose work fits the step all complete, at (n + 1) / 2 of
a message's time alone on average. At tau = 0 it is not the discrete QA's rule (a probe, not a level).
"""
import dataclasses
import os

import torch

from isaac_net.core.diff import model, relax
from isaac_net.core.diff.model import _fifo_cum, _n_busy, on_air_s

BISECT = 40
#: ``LANE_SB`` (environment, optional; probe (34)): a robot served takes at most this many subbands, so
#: that ``S / LANE_SB`` robots are served side by side (default the whole band: one at a time, (31) (g)).
LANE_SB = os.environ.get("LANE_SB")
_TINY_S = 1e-9  # a wait shorter than this is no wait (the closed forms divide by W)


def K(t, d):
    """``int_{-inf}^{t} clamp(s, 0, d) ds``: 0, ``t^2 / 2``, ``d^2 / 2 + d (t - d)``."""
    tc = torch.clamp(t, min=0.0)
    inner = torch.minimum(tc, d)
    return 0.5 * inner * inner + d * (tc - inner)


def expected_clamp(t, W, d):
    """``E[clamp(t - U W, 0, d)]``, U uniform on [0, 1] (broadcast); W <= _TINY_S: ``clamp(t, 0, d)``."""
    Ws = torch.clamp(W, min=_TINY_S)
    spread = (K(t, d) - K(t - Ws, d)) / Ws
    return torch.where(W > _TINY_S, spread, torch.minimum(torch.clamp(t, min=0.0), d))


def d_expected_clamp(t, W, d):
    """d/dt of :func:`expected_clamp`."""
    Ws = torch.clamp(W, min=_TINY_S)
    spread = (torch.minimum(torch.clamp(t, min=0.0), d) - torch.minimum(torch.clamp(t - Ws, min=0.0), d)) / Ws
    return torch.where(W > _TINY_S, spread, ((t > 0) & (t < d)).to(t.dtype))


def horizon(A, W, alloc, sr_s, step_s, num_subbands):
    """The horizon ``T`` ``[E, 1]`` whose expected band work served is ``min(S step, sum V)``."""
    target = torch.minimum((alloc * A).sum(-1, keepdim=True), torch.full_like(A[..., :1], num_subbands * step_s))

    def F(T):
        return (alloc * expected_clamp(T - sr_s, W, A)).sum(-1, keepdim=True)

    def dF(T):
        return (alloc * d_expected_clamp(T - sr_s, W, A)).sum(-1, keepdim=True)

    with torch.no_grad():
        hi_all = (sr_s + W + A).amax(-1, keepdim=True).clamp(min=step_s) + step_s
        at_step = F(torch.full_like(target, step_s))
        over = at_step > target
        lo = torch.where(over, torch.zeros_like(target), torch.full_like(target, step_s))
        hi = torch.where(over, torch.full_like(target, step_s), hi_all)
        for _ in range(BISECT):
            mid = 0.5 * (lo + hi)
            below = F(mid) < target
            lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
        Tb = torch.where((at_step - target).abs() <= 1e-6 * target.clamp(min=1e-12), torch.full_like(target, step_s),
                         hi)
    slope = dF(Tb)
    # one Newton step from the detached root: the value stays (F(Tb) = target), the gradient is the root's
    T = Tb - torch.where(slope > 0, (F(Tb) - target) / torch.where(slope > 0, slope, 1.0), 0.0)
    return T


def service(x, w, mass_before, snr_lin, headroom, cfg, tau, slot_grad="recompute"):
    cum = _fifo_cum(x)  # [E, R, A]
    n = _n_busy(w, tau)  # [E, 1]
    S = float(cfg.num_subbands)
    full = torch.full_like(headroom, S if LANE_SB is None else float(LANE_SB))
    alloc = torch.minimum(full, headroom) if relax.is_hard(tau) else headroom * relax.smin_const(full / headroom, 1.0, tau)
    se = relax.smin(torch.log2(1.0 + relax.harmonic(n) * snr_lin / relax.smax(alloc, 1.0, tau)), cfg.se_max, tau)
    rate = alloc * se * cfg.bytes_per_se_s
    rate = torch.where(rate > 0, rate, 1.0)  # [E, R] B/s alone
    sr_s = relax.soft_empty(mass_before, tau) * (cfg.qa_sr_slots * cfg.slot_s)  # [E, R]
    A = cum[..., 0] / rate  # [E, R] the whole queue's time alone (cum's first slot: every byte queued)
    V = alloc * A
    W = torch.clamp((V.sum(-1, keepdim=True) - V) / S, min=0.0)  # [E, R]
    T = horizon(A, W, alloc, sr_s, cfg.step_s, S)  # [E, 1]
    t = (T - sr_s).unsqueeze(-1)  # [E, R, 1] the robot's interval on the horizon's clock
    Wm = W.unsqueeze(-1)
    a = cum / rate.unsqueeze(-1)  # [E, R, A] each prefix's time alone
    a_older = (cum - x) / rate.unsqueeze(-1)
    served_msg = rate.unsqueeze(-1) * expected_clamp(t - a_older, Wm, x / rate.unsqueeze(-1))
    served_msg = torch.minimum(served_msg, x)
    rest = x - served_msg
    Ws = torch.clamp(Wm, min=_TINY_S)
    c = torch.where(Wm > _TINY_S, torch.clamp((t - a) / Ws, 0.0, 1.0), (t >= a).to(x.dtype))
    c = torch.where(cum > 0, c, 1.0)  # nothing queued is complete (fifo_serve's rule)
    # given completion the start is uniform on [0, min(W, t - a)]: the prefix ends at a + that / 2
    wait = 0.5 * torch.minimum(Wm, torch.clamp(t - a, min=0.0))
    finish_s = sr_s.unsqueeze(-1) + (a + wait) * (cfg.step_s / T).unsqueeze(-1)
    finish_s = torch.clamp(finish_s, max=cfg.step_s)
    served = served_msg.sum(-1)
    air_s = on_air_s(x, rest, snr_lin, cfg, tau, own_rate=rate, n_busy=n)
    return c, c * finish_s / cfg.step_s, served, air_s, rest


model.MODES["QA"] = dataclasses.replace(model.MODES["QA"], service=service, fused_step=None)
