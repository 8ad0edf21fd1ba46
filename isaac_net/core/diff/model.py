"""DiffFluid: differentiable L1D and QAD with an age-indexed queue.

State layout. A robot enqueues at most one message per control step and a message
leaves after at most ``timeout`` steps, so slot ``a`` of a ``[E, R, A]`` buffer holds the
message captured ``a`` steps ago and FIFO order is age order (oldest = highest ``a``).
Each slot carries the expected remaining bytes ``x`` and the mass ``w``, the
probability-like weight of the message still being queued. The buffer shifts by one
slot per step.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
import warnings
from collections.abc import Callable

import torch

from isaac_net.core import _validate, radio
from isaac_net.core._kernels import Precompiled
from isaac_net.core.config import CellConfig
from isaac_net.core.diff import _l1_loop, relax
from isaac_net.core.diff._l1_loop import TENSORS_PER_SLOT
from isaac_net.core.diff._outputs import StepArgs, StepOut, split_rollout
from isaac_net.core.diff._qa_step import QARollout, qa_step


@dataclasses.dataclass(frozen=True)
class FluidState:
    """Queue and AoI state, ``x``/``w`` ``[E, R, A]`` (bytes, mass), ``aoi`` ``[E, R]`` steps."""

    x: torch.Tensor
    w: torch.Tensor
    aoi: torch.Tensor

    def detach(self) -> "FluidState":
        return FluidState(self.x.detach(), self.w.detach(), self.aoi.detach())


def _fifo_cum(x: torch.Tensor) -> torch.Tensor:
    """Bytes queued up to and including each slot in FIFO (oldest-first) order. ``[E, R, A]``."""
    if torch.compiler.is_compiling():  # A sums fuse into the step's kernels; aten cumsum is a call of its own
        return torch.stack([x[..., a:].sum(-1) for a in range(x.shape[-1])], -1)
    return x.flip(-1).cumsum(-1).flip(-1)


def _cumprod(y: torch.Tensor) -> torch.Tensor:
    """``cumprod`` over the last (age) dimension; unrolled when compiled, as ``_fifo_cum``."""
    if not torch.compiler.is_compiling():
        return torch.cumprod(y, -1)
    out = [y[..., 0]]
    for a in range(1, y.shape[-1]):
        out.append(out[-1] * y[..., a])
    return torch.stack(out, -1)


def _l1_slot(w, w_sum, c_busy, served, snr_lin, tau, consts: tuple, gate=None):
    """One UL slot of L1D: the reference recursion. At ``tau = 0`` the hard operations; at
    ``tau > 0`` differentiated by autograd (the plain per-slot design, ``slot_grad="autograd"``).

    ``DiffFluid`` runs the K slots at ``tau > 0`` without a latency floor through
    ``_l1_loop.L1SlotLoop`` (one node with a hand-written backward); the tests check that node
    against this recursion.

    :input c_busy: ``[E, R, A]`` the completion the robot's backlog is counted from before the slot.
    :input gate: ``[E, R]`` the probability that the robot's queue was not empty before capture, in
        the slots of its latency floor (None: every robot is served).
    :param consts: ``(num_subbands, se_max, bytes_per_se_slot)``.
    :output: ``served`` after the slot: the bytes offered to a robot that is served from the start
        of the step.
    """
    num_subbands, se_max, kappa = consts
    busy = relax.soft_busy(w_sum - (w * c_busy).sum(-1), tau)  # [E, R]
    if gate is not None:  # an empty robot waits: it takes no share and does not transmit
        busy = busy * gate
    n = busy.sum(-1, keepdim=True)  # [E, 1] soft count of backlogged robots
    share = num_subbands / relax.smax(n, 1.0, tau)
    se = relax.smin(torch.log2(1.0 + snr_lin / relax.smax(share, 1.0, tau)), se_max, tau)
    return served + share * se * kappa


def _service_l1(x, w, mass_before, snr_lin, headroom, cfg: CellConfig, tau, slot_grad: str = "recompute"):
    """L1D: K UL slots with equal subband shares among backlogged robots.

    Latency floor (``cfg.l1_sr_slots = L > 0``): with ``g = smin(mass_before, 1)`` the probability
    that the robot's queue was not empty before capture (``1 - soft_empty``), the step is the
    mixture of the two cases the discrete level knows: served from slot 0 (weight ``g``) or
    from slot ``L`` (weight ``1 - g``). In the first ``L`` slots the completion is ``c0 + g (c(S) -
    c0)`` (``c0``: nothing served) and the robot counts as backlogged with weight ``g``; after them
    the bytes it has been offered are the expectation ``S_k - (1 - g) S_{L-1}``. Mixing completions
    rather than scaling the served bytes by ``g`` keeps ``log(served)`` away from 0 for a robot that
    was nearly empty (a scaled rate makes the gradients of mean-field sends explode). Exact at
    ``tau = 0`` (``g`` is 0 or 1); ``L = K``: the completion is the mixture to the end.

    :input mass_before: ``[E, R]`` the queue's mass before this step's capture.
    :input headroom: unused (L1D has no headroom rule); the service rules share one signature.
    :param slot_grad: how the slot loop is differentiated (``tau > 0``): ``"recompute"`` and
        ``"tape"``, the ``L1SlotLoop`` node recomputing or keeping the per-slot values (with a
        floor, one node for the first ``L`` slots, gated, and one for the rest, from the
        expected bytes offered; :func:`_l1_slot_loops`); ``"autograd"``, autograd through every
        slot of the recursion (:func:`_l1_recursion`: the plain per-slot design, a baseline, and
        the reference the nodes are tested against).

    :output: completion ``c`` ``[E, R, A]``, finish-time term ``fin`` ``[E, R, A]`` (the
        completion increase in each slot times ``(k + 1) / K``, summed; control steps),
        bytes offered ``served`` ``[E, R]``, transmit time ``tx_s`` ``[E, R]`` (:func:`on_air_s`)
        and the bytes left per message ``rest`` ``[E, R, A]``.
    """
    cum = _fifo_cum(x)
    consts = (float(cfg.num_subbands), float(cfg.se_max), cfg.bytes_per_se_slot)
    c0 = relax.soft_ge(torch.zeros_like(cum), cum, tau)  # nothing served yet
    if relax.is_hard(tau):
        def completion(s):
            return relax.soft_ge(s.unsqueeze(-1), cum, tau)
        log_cum = None
    else:  # the completion needs only log(served) against log(cum), computed once
        log_cum = relax._log_pos(cum) / tau

        def completion(s):
            return torch.sigmoid(relax._log_pos(s).unsqueeze(-1) / tau - log_cum)
    if not relax.is_hard(tau) and slot_grad != "autograd":
        c, fin, served, rest = _l1_slot_loops(x, w, cum, log_cum, c0, completion, mass_before, snr_lin, cfg,
                                              tau, consts, slot_grad)
    else:
        c, fin, served, rest = _l1_recursion(x, w, cum, c0, completion, mass_before, snr_lin, cfg, tau,
                                             consts)
    n_busy = None if cfg.air_is_plain else _n_busy(w, tau)
    return c, fin, served, on_air_s(x, rest, snr_lin, cfg, tau, n_busy=n_busy), rest


def _n_busy(w, tau):
    """The soft count of robots backlogged in each cell ``[E, 1]`` from the queue's mass ``w``
    ``[E, R, A]``: QAD's processor-sharing count and the time on air's crowd (both modes)."""
    return relax.soft_busy(w.sum(-1), tau).sum(-1, keepdim=True)


def on_air_s(x, rest, snr_lin, cfg: CellConfig, tau, own_rate=None, n_busy=None):
    """The transmit time of L1D and QAD ``[E, R]``, s: the bytes the robot sent in the step (``x - rest``
    ``[E, R, A]``, summed) at the rate of the whole band, ``S smin(log2(1 + snr / S), se_max)``
    ``bytes_per_se_s``, or (``own_rate`` ``[E, R]`` B/s, QAD's) at ``smax`` of that and its own rate;
    in a calibrated cell (``not cfg.air_is_plain``) times ``air_factor smax(n_busy, 1)^air_crowd_exp``
    (``n_busy`` ``[E, 1]``, the soft count of robots backlogged) and ``smin``'d with the step: the
    discrete levels' rule, ``levels.base.on_air_s``."""
    S = float(cfg.num_subbands)
    se = relax.smin(torch.log1p(snr_lin / S) / math.log(2.0), cfg.se_max, tau)  # log1p: > 0 at -150 dB
    rate = S * se * cfg.bytes_per_se_s
    tx_s = (x - rest).sum(-1) / (rate if own_rate is None else relax.smax(rate, own_rate, tau))
    if cfg.air_is_plain:
        return tx_s
    return crowded_on_air_s(tx_s, relax.smax(n_busy, 1.0, tau), cfg.air_factor, cfg.air_crowd_exp, cfg.step_s,
                            tau)


def crowded_on_air_s(tx_s, crowd, air_factor: float, air_crowd_exp: float, step_s: float, tau):
    """A calibrated cell's time on air, s: the band-rate time ``tx_s`` times
    ``air_factor crowd^air_crowd_exp`` (``crowd``: ``smax(n_busy, 1)``, broadcast to ``tx_s``), at most
    the step (:func:`on_air_s`'s rule; the calibration's search evaluates it on recorded ``tx_s`` and
    ``crowd``)."""
    # smin(t, step) = step smin(t / step, 1): the temperature is relative
    return step_s * relax.smin(tx_s * (air_factor * crowd ** air_crowd_exp) / step_s, 1.0, tau)


def _l1_slot_loops(x, w, cum, log_cum, c0, completion, mass_before, snr_lin, cfg: CellConfig, tau,
                   consts: tuple, slot_grad: str):
    """``_service_l1`` at ``tau > 0`` through ``_l1_loop``'s slot-loop nodes (without a floor one
    loop of K slots; with one, the not-empty case's first ``L`` slots and then the rest).

    :input log_cum: ``[E, R, A]`` ``log(cum) / tau``; :input c0: ``[E, R, A]`` the completion of
        nothing served; :input completion: served bytes ``[E, R]`` -> completion ``[E, R, A]``.
    :output: ``(c, fin, served, rest)``, as ``_service_l1``'s.
    """
    K, L = cfg.num_slots, cfg.l1_sr_slots
    # c0 (log of nothing served against log(cum), over tau: 0 up to underflow where a message
    # is queued, 1 where none is) enters the loops as a constant.
    loop = functools.partial(_l1_loop.slot_loop, w, log_cum, snr_lin, tau=tau, consts=consts,
                             keep_tape=slot_grad == "tape")
    if L == 0:
        served, c_sum = loop(c0.detach(), K)
    else:  # the recursion's two phases, each one slot loop
        gate = relax.smin(mass_before, 1.0, tau)  # P(the queue was not empty)
        g3 = gate.unsqueeze(-1)
        base, c_sum_ne = loop(c0.detach(), L, gate=gate)  # the not-empty case's first L slots
        c_sum = L * c0 + g3 * (c_sum_ne - L * c0)  # the mixture's completions, summed
        if L == K:  # the floor fills the step: a robot that was empty is not served at all
            c_ne, _, rest_ne = relax.fifo_serve(x, cum, base.unsqueeze(-1), tau)
            c = c0 + g3 * (c_ne - c0)
            return c, c - c_sum / K, gate * base, x + g3 * (rest_ne - x)
        # After the floor, the completion of the expected bytes offered, S_k - (1 - g) S_{L-1}:
        # a loop from gate * base whose first slot sees the mixture's completion.
        c_mix = c0 + g3 * (completion(base) - c0)
        served, c_sum_late = loop(c_mix, K - L, served0=gate * base)
        c_sum = c_sum + c_sum_late
    c, _, rest = relax.fifo_serve(x, cum, served.unsqueeze(-1), tau)  # c_K again, exact at cum = 0
    # sum_k (c_{k+1} - c_k) (k + 1) / K telescopes to c_K - mean_{k<K} c_k.
    return c, c - c_sum / K, served, rest


def _l1_recursion(x, w, cum, c0, completion, mass_before, snr_lin, cfg: CellConfig, tau, consts: tuple):
    """``_service_l1`` slot by slot through :func:`_l1_slot` (the hard operations at ``tau = 0``,
    autograd through every slot at ``tau > 0``). Inputs as :func:`_l1_slot_loops`.

    :output: ``(c, fin, served, rest)``, as ``_service_l1``'s.
    """
    K, L = cfg.num_slots, cfg.l1_sr_slots
    w_sum = w.sum(-1)
    gate = relax.smin(mass_before, 1.0, tau) if L > 0 else None  # P(the queue was not empty)
    g3 = None if gate is None else gate.unsqueeze(-1)
    c_sum = torch.zeros_like(x)
    served = torch.zeros_like(w_sum)  # offered since slot 0 (the robot that was not empty)
    c_ne, c, base = c0, c0, None  # the not-empty case's completion; the mixture's; S_{L-1}
    for k in range(K):
        early = k < L
        served = _l1_slot(w, w_sum, c_ne if early else c, served, snr_lin, tau, consts,
                          gate if early else None)
        c_sum = c_sum + c
        if early:
            c_ne = completion(served)
            c = c0 + g3 * (c_ne - c0)
            if k == L - 1:
                base = served
        else:
            c = completion(served - (1.0 - gate) * base if base is not None else served)
    if base is None:
        c, _, rest = relax.fifo_serve(x, cum, served.unsqueeze(-1), tau)
    elif L < K:
        served = served - (1.0 - gate) * base  # the expected bytes offered in the step
        c, _, rest = relax.fifo_serve(x, cum, served.unsqueeze(-1), tau)
    else:  # the floor fills the step: a robot that was empty is not served at all
        c_ne, _, rest_ne = relax.fifo_serve(x, cum, served.unsqueeze(-1), tau)
        c = c0 + g3 * (c_ne - c0)
        rest = x + g3 * (rest_ne - x)
        served = gate * served
    return c, c - c_sum / K, served, rest


def qa_headroom(snr_lin, cfg: CellConfig, tau, tau_n):
    """QAD's per-robot subband cap ``smax(floor_tau_n(snr / snr_req), 1)`` ``[E, R]`` (headroom)."""
    req_lin = 10.0 ** (cfg.qa_snr_req_db / 10.0)
    return relax.smax(relax.soft_floor(snr_lin / req_lin, cfg.num_subbands, tau_n), 1.0, tau)


def _service_qa(x, w, mass_before, snr_lin, headroom, cfg: CellConfig, tau: float,
                slot_grad: str = "recompute"):
    """QAD: one processor-sharing interval per step with PF gain, headroom cap ``headroom`` (``[E, R]``
    subbands, >= 1) and SR offset.

    :param slot_grad: unused (QAD has no slot loop); the service rules share one signature.
    :output: as ``_service_l1``.
    """
    cum = _fifo_cum(x)
    closure = cfg.mf_backlog_closure and not relax.is_hard(tau)
    if closure:
        busy, n, _ = relax.backlog_closure(w.sum(-1), deriv=False)
    else:
        n = _n_busy(w, tau)
    sn = relax.smax(n, 1.0, tau)
    share = cfg.num_subbands / sn
    if relax.is_hard(tau):
        alloc = torch.minimum(share, headroom)
    else:  # smin(share, h) = h smin(share / h, 1): both > 0 (h >= 1), so no guard for zeros
        alloc = headroom * relax.smin_const(share / headroom, 1.0, tau)
    gain = relax.harmonic(n)
    spread = relax.smax(alloc, float(cfg.qa_min_grant_subbands), tau)  # the subbands the power is spread over
    se = relax.smin(torch.log2(1.0 + gain * snr_lin / spread), cfg.se_max, tau)
    rate = alloc * se * cfg.bytes_per_se_s  # B/s while backlogged
    # With no robot backlogged (n = 0, G = 0) the rate is 0 and nothing is queued; keep the
    # served bytes (and log(served) in fifo_serve) away from exact 0.
    rate = torch.where(rate > 0, rate, 1.0)
    if cfg.qa_reshare > 0:  # the interval with idle robots' time re-shared (not with the closure)
        return _reshared_qa(x, w, cum, mass_before, snr_lin, n, sn, rate, cfg, tau)
    sr_s = relax.soft_empty(mass_before, tau) * (cfg.qa_sr_slots * cfg.slot_s)
    avail_s = cfg.step_s - sr_s
    # With the closure a robot is served min(cum, busy * rate * avail_s) in expectation: it holds
    # cum / busy bytes while backlogged, so its messages finish at cum / (busy * rate) into the interval.
    served = rate * avail_s * busy if closure else rate * avail_s
    c, frac, rest = relax.fifo_serve(x, cum, served.unsqueeze(-1), tau)
    # The prefix up to a message takes the part frac of the interval: smin(cum, served) / rate.
    finish_s = sr_s.unsqueeze(-1) + frac * avail_s.unsqueeze(-1)
    fin = c * finish_s / cfg.step_s
    return c, fin, served, on_air_s(x, rest, snr_lin, cfg, tau, own_rate=rate, n_busy=n), rest


#: Newton steps to QAD's re-shared levels (:func:`_level_root`), a fixed count: no data-dependent
#: branch in a compiled step. From below on a concave sum each step stays below the root; 4-5 reach
#: rounding (docs/design.md, section 5, probe (26)), the rest is margin.
RESHARE_NEWTON_STEPS = 8


def _served_s(V, b, e, L, L_s, tau, floor: float = 0.0):
    """``sum_j b_j ((1 - e_j) smin(V_j, L) + e_j smin(V_j, L - L_s))`` over the cell's robots (the
    last dimension) and its derivative in ``L``: the seconds of service (at ``rate``) robots with
    weights ``b`` have had by the level ``L``, those that were empty (``e``) from ``L_s`` on.
    :input V, b, e: ``[E, R]``; :input L: ``[E, 1]``; :input L_s: ``[E, 1]``, or None (no robot
    late); ``floor``: the least ``L - L_s``, s (smin takes logs). ``min`` at ``tau = 0``."""
    hard = relax.is_hard(tau)

    def part(lv):
        if hard:
            return torch.minimum(V, lv), (V > lv).to(V.dtype)
        m = relax.smin(V, lv, tau)
        return m, (m / lv) ** (1.0 + 1.0 / tau)  # d smin(V, l) / dl

    m, dm = part(L)
    if L_s is None:
        return (b * m).sum(-1), (b * dm).sum(-1)
    m2, dm2 = part(torch.clamp(L - L_s, min=floor))  # a late robot's level runs from L_s
    return (b * ((1.0 - e) * m + e * m2)).sum(-1), (b * ((1.0 - e) * dm + e * dm2)).sum(-1)


def _served_at(V, b, e, levels, L_s):
    """``sum_j b_j ((1 - e_j) min(V_j, l) + e_j min(V_j, (l - L_s)+))`` at many levels ``l``: the
    seconds of service the cell's robots have had when one robot's service reaches ``l`` (the
    finish-time sums), by sorted prefix sums, ``O(R log R + K log R)`` a cell where the sums over
    robot pairs cost ``O(K R)`` (``K = R A`` levels). ``min`` at every temperature: the sum is
    continuous and piecewise linear in ``V``, ``b`` and ``l``, with its derivative where it has one.
    :input V, b, e: ``[E, R]``; :input levels: ``[E, R, A]``; :input L_s: ``[E, 1]``.
    :output: ``[E, R, A]``."""
    Vs, order = torch.sort(V, dim=-1)
    zero = torch.zeros_like(V[:, :1])

    def summed(w, q):  # sum_j w_j min(V_j, q) for q [E, K]
        w = torch.gather(w, -1, order)
        below_v = torch.cat([zero, torch.cumsum(w * Vs, -1)], -1)  # [E, R + 1]: sum over V_j < V_(k)
        below_w = torch.cat([zero, torch.cumsum(w, -1)], -1)
        k = torch.searchsorted(Vs.detach().contiguous(), q.detach().contiguous())  # [E, K]: V_j < q
        return torch.gather(below_v, -1, k) + q * (below_w[:, -1:] - torch.gather(below_w, -1, k))

    q = levels.reshape(levels.shape[0], -1)
    m = summed(b * (1.0 - e), q) + summed(b * e, torch.clamp(q - L_s, min=0.0))
    return m.reshape(levels.shape)


def _level_root(f, target, lo, cap):
    """The level ``L`` in ``[lo, cap]`` ``[E, 1]`` where the concave increasing ``f`` (``L -> (f, f')``)
    reaches ``target``, or ``cap`` where it does not. Newton from ``lo`` (``f(lo) <= target``) without a
    graph, then one differentiable Newton step at the root: its gradient is the implicit function's,
    ``dL = (d target - d f) / f'``."""
    with torch.no_grad():
        L, capd, goal = lo.detach().clone(), cap.detach(), target.detach()
        for _ in range(RESHARE_NEWTON_STEPS):
            v, d = f(L)
            L = torch.minimum(L + torch.clamp((goal - v) / torch.clamp(d, min=1e-300), min=0.0), capd)
    v, d = f(L)  # with the graph of the inputs, at the root
    flat = d.detach() <= 1e-12  # every robot done below the cap (qa_reshare = 1): the cap's level
    root = L + (target - v) / torch.where(flat, 1.0, d.detach())
    return torch.where((L >= capd) | flat, cap, root)


def _level_hard(V, b, target, a: float, sn):
    """The level where ``a sum_j b_j min(V_j, L) + (1 - a) sn L`` reaches ``target`` ``[E, 1]``, at most
    the largest ``V_j`` of a robot taking part (``b_j > 0``; 0 if none), exactly: the sum is piecewise
    linear with knots at the ``V_j``, and the root lies past the largest knot at or below ``target``.
    :input V, b: ``[E, R]``; :input target, sn: ``[E, 1]``."""
    at_knots = a * (b.unsqueeze(-2) * torch.minimum(V.unsqueeze(-2), V.unsqueeze(-1))).sum(-1)
    at_knots = at_knots + (1.0 - a) * sn * V
    part = b > 0
    lo = torch.where(part & (at_knots <= target), V, 0.0).amax(-1, keepdim=True)
    top = torch.where(part, V, 0.0).amax(-1, keepdim=True)
    f_lo = a * (b * torch.minimum(V, lo)).sum(-1, keepdim=True) + (1.0 - a) * sn * lo
    slope = a * (b * (V > lo)).sum(-1, keepdim=True) + (1.0 - a) * sn
    L = lo + (target - f_lo) / torch.where(slope > 0, slope, 1.0)
    return torch.where(slope > 0, torch.minimum(L, top), top)


def _reshared_qa(x, w, cum, mass_before, snr_lin, n, sn, rate, cfg: CellConfig, tau):
    """QAD's interval with the share ``a = qa_reshare`` of an idle robot's time re-shared: the QA
    level's rule (``NetQA._reshared``), relaxed. A robot is backlogged with the weight
    ``b = soft_busy`` and then needs ``Vb = V / b`` seconds at ``rate`` (``V`` its bytes over ``rate``);
    the time of level ``l`` is ``(a served_s(l) + (1 - a) sn l) / sn`` (:func:`_served_s`): the
    early robots' up to the SR level ``L_s``, then every robot's, a late robot from ``L_s`` on, plus
    the SR's idle time; the step ends at the level ``L``. Inputs ``[E, R]`` and ``[E, 1]`` as
    :func:`_service_qa`'s; output as it."""
    a, T, hard = float(cfg.qa_reshare), cfg.step_s, relax.is_hard(tau)
    tiny = 1e-9 * cfg.step_s  # keeps smin's powers (1 / tau up to 20) finite
    floor = 0.0 if hard else tiny
    e = relax.soft_empty(mass_before, tau)  # [E, R]: was empty, so served after its SR
    b = relax.soft_busy(w.sum(-1), tau)
    # s at rate, clamped: rate^2 underflows in float32 where n ~ 0
    V = torch.clamp(x.sum(-1) / torch.clamp(rate, min=1.0), min=tiny)
    Vb = torch.clamp(V / torch.clamp(b, min=1e-6), min=tiny)
    s = min(cfg.qa_sr_slots * cfg.slot_s, T)
    early = b * (1.0 - e)

    def f1(L):  # up to the SR: the early robots
        m, dm = _served_s(Vb, early, e, L, None, tau)
        return a * m.unsqueeze(-1) + (1.0 - a) * sn * L, a * dm.unsqueeze(-1) + (1.0 - a) * sn

    zero = torch.zeros_like(sn)
    if s == 0:
        L_s, idle = zero, zero
    else:
        L_s = _level_hard(Vb, early, sn * s, a, sn) if hard else _level_root(f1, sn * s, zero + tiny, sn * s)
        idle = s - f1(L_s)[0] / sn  # > 0 where every early robot is done before the SR

    def f2(L):  # after it: every robot, a late one from L_s
        m, dm = _served_s(Vb, b, e, L, L_s, tau, floor)
        return a * m.unsqueeze(-1) + (1.0 - a) * sn * L, a * dm.unsqueeze(-1) + (1.0 - a) * sn

    if s >= T:  # the SR fills the step: a late robot is not served
        L = L_s
    elif hard:  # a late robot's need ends at the level Vb + L_s
        late = b * e
        L = _level_hard(Vb + e * L_s, b, sn * (T - idle) + a * late.sum(-1, keepdim=True) * L_s, a, sn)
    else:
        L = _level_root(f2, sn * (T - idle), L_s + tiny, L_s + sn * T)
    start = e * L_s  # [E, R]: the level a robot's service starts at
    span = torch.clamp(L - start, min=0.0)
    served = rate * span
    if hard:  # a robot whose need is reached is served its bytes exactly (no rounding of rate V)
        served = torch.where(start + Vb <= L, torch.maximum(served, x.sum(-1)), served)
    c, frac, rest = relax.fifo_serve(x, cum, served.unsqueeze(-1), tau)
    # a message's level: where the robot's service reaches it (exactly cum / rate at tau = 0, as the
    # need: the last message of the robot that ends the SR's interval finishes at L_s, not after it)
    part = cum / rate.unsqueeze(-1) if hard else frac * span.unsqueeze(-1)
    level = start.unsqueeze(-1) + part  # [E, R, A]
    m = _served_at(Vb, b, e, level, L_s)  # [E, R, A]
    L_s3, sn3 = L_s.unsqueeze(-1), sn.unsqueeze(-1)
    after = level > L_s3 if hard else relax.soft_ge(level, L_s3.expand_as(level), tau)
    t_s = (a * m + (1.0 - a) * sn3 * level) / sn3 + idle.unsqueeze(-1) * after
    finish_s = torch.clamp(t_s, max=T)
    return c, c * finish_s / T, served, on_air_s(x, rest, snr_lin, cfg, tau, own_rate=rate, n_busy=n), rest


class StepInputs(typing.NamedTuple):
    """The per-step inputs of a rollout, checked once and turned into what the step uses.

    Built by :meth:`DiffFluid.inputs`; ``keep`` and ``headroom`` depend on the temperatures
    ``temps = (tau, tau_n)`` they were computed at (``DiffFluid.advance`` recomputes them when
    the model's temperatures have changed since).
    """

    msg_bytes: torch.Tensor  # [E, R] bytes
    snr_lin: torch.Tensor  # [E, R] linear SNR
    tx_w: torch.Tensor  # [E, R] transmit power, W
    deadline: torch.Tensor  # [E, R] control steps
    keep: torch.Tensor  # [E, R, A] per-step survival at each age (tau_n)
    headroom: torch.Tensor | None  # [E, R] QAD's subband cap; None for L1D
    temps: tuple  # (tau, tau_n) of keep and headroom
    made_for: tuple = ()  # (E, R, mode, cfg, dtype, device) of the net that built them

    @classmethod
    def build(cls, msg_bytes, snr_db, tx_dbm, deadline, *, cfg: CellConfig, mode: str, tau: float,
              tau_n: float, made_for: tuple = ()) -> "StepInputs":
        snr_lin = radio.rate_snr_lin(snr_db, cfg)  # the calibration's SNR offset; tx_w keeps the power
        return cls(msg_bytes, snr_lin, radio.dbm_to_w(tx_dbm), deadline,
                   *cls._derived(snr_lin, deadline, cfg, mode, tau, tau_n), (tau, tau_n), made_for)

    def at(self, tau: float, tau_n: float, *, cfg: CellConfig, mode: str) -> "StepInputs":
        """These inputs with ``keep`` and ``headroom`` at the temperatures ``(tau, tau_n)``."""
        if self.temps == (tau, tau_n):
            return self
        keep, headroom = self._derived(self.snr_lin, self.deadline, cfg, mode, tau, tau_n)
        return self._replace(keep=keep, headroom=headroom, temps=(tau, tau_n))

    @staticmethod
    def _derived(snr_lin, deadline, cfg: CellConfig, mode: str, tau: float, tau_n: float) -> tuple:
        keep = relax.survival(deadline, cfg.timeout_steps, tau_n)
        headroom = MODES[mode].headroom
        return keep, (None if headroom is None else headroom(snr_lin, cfg, tau, tau_n))


def fluid_step(state: FluidState, send, inputs: StepInputs, *, cfg: CellConfig, mode: str, tau: float,
               tau_n: float, compiled: bool = False, slot_grad: str = "recompute"):
    """One control step of L1D or QAD as a pure function of the state.

    :input send: ``[E, R]`` send weight in [0, 1]; :input inputs: the step's other inputs,
        at the temperatures ``(tau, tau_n)``.
    :param compiled: run the step through ``torch.compile`` (both temperatures must be > 0;
        at 0 the hard operations run eager).
    :param slot_grad: how L1D's slot loop is differentiated (see ``_service_l1``); ``"autograd"``
        also runs QAD through autograd of ``_step`` instead of the fused ``_qa_step`` node
        (eager, ``tau > 0`` and ``tau_n > 0``).
    :output: ``(next_state, kpis)``, kpis ``[E, R]`` as expectations.
    """
    if inputs.temps != (tau, tau_n):
        raise ValueError(f"inputs: built at (tau, tau_n) = {inputs.temps}, the step runs at {(tau, tau_n)}")
    tensors = StepArgs(x=state.x, w=state.w, aoi=state.aoi, send=send, msg_bytes=inputs.msg_bytes,
                       snr_lin=inputs.snr_lin, tx_w=inputs.tx_w, keep=inputs.keep, headroom=inputs.headroom)
    if _runs_fused(mode, compiled, tau, tau_n, slot_grad, state.x.device, cfg):
        out = MODES[mode].fused_step(*tensors, tau, tau_n, cfg, compiled=compiled)
    elif compiled and tau > 0 and tau_n > 0:
        out = _run_compiled(mode, slot_grad, tensors, tau, tau_n, cfg)
    else:
        out = _step(*tensors, tau, tau_n, cfg, mode, slot_grad)
    # offered and aoi are inputs / outputs already: a compiled graph that returns an alias of
    # its input or one tensor twice pays for it at every call.
    kpis = dict(offered=send, delivered=out.delivered, delay_sum=out.delay_sum, timeouts=out.timeouts,
                overflow=out.overflow, aoi=out.aoi, energy_j=out.energy_j,
                throughput_bytes_per_s=out.throughput_bytes_per_s, queued_msgs=out.queued_msgs)
    return FluidState(out.x, out.w, out.aoi), kpis


def _runs_fused(mode: str, compiled: bool, tau: float, tau_n: float, slot_grad: str,
                device: torch.device, cfg: CellConfig) -> bool:
    """Whether the step runs through the mode's fused node (``Mode.fused_step``; QAD's ``_qa_step``),
    soft only: not at tau = 0 (the hard operations), not ``slot_grad="autograd"`` (autograd through
    ``_step``), not compiled unless on the CPU (where the node's forward runs as a compiled kernel), and
    not with QA's re-shared time (``cfg.qa_reshare``: autograd through ``_step``)."""
    return (MODES[mode].fused_step is not None and tau > 0 and tau_n > 0 and slot_grad != "autograd"
            and (not compiled or device.type == "cpu") and cfg.qa_reshare == 0)


_COMPILED_STEPS: dict = {}


def _compiled_step(mode: str, slot_grad: str) -> Precompiled:
    """``_step`` compiled whole: one function per (mode, slot_grad), dtype, device, grad mode and
    ``CellConfig`` serves every batch and fleet size (E and R are symbolic, A static),
    forward and backward each fused by inductor; the temperatures are tensor inputs. L1D's slot
    loop is an operator of its own inside (``_l1_loop.compiled_slot_loop``). Kept on disk and
    loaded by a later process without tracing (:class:`~isaac_net.core._kernels.Precompiled`)."""
    key = (mode, slot_grad)
    if key not in _COMPILED_STEPS:
        before = MODES[mode].before_compile if slot_grad != "autograd" else None
        _COMPILED_STEPS[key] = Precompiled(_step_of(mode, slot_grad), tag=key, dim=(0, 1),
                                           before_compile=before)
    return _COMPILED_STEPS[key]


def _slot_kernels_in_background(args: tuple) -> None:
    """Before a cold compile of L1D's step: its slot kernels compiled in another process meanwhile."""
    x, cfg = args[0], args[-1]
    _l1_loop.slot_kernels_in_background(x, cfg.l1_sr_slots, cfg.num_slots, torch.is_grad_enabled())


def _step_of(mode: str, slot_grad: str):
    """``_step`` of one mode and slot design as a function of the tensors, the temperatures and the
    config (a function, not a ``functools.partial``: ``aot_compile`` keeps its code)."""
    def step(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, headroom, tau, tau_n, cfg: CellConfig):
        return _step(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, headroom, tau, tau_n, cfg, mode,
                     slot_grad)

    return step


def _run_compiled(mode: str, slot_grad: str, tensors: StepArgs, tau: float, tau_n: float,
                  cfg: CellConfig) -> StepOut:
    """The compiled step on ``tensors``, traced for at most two patterns of inputs: all of them
    requiring grad (the first step's zero state and a constant input become leaves whose
    gradient is dropped; a graph per pattern would compile again for each) or, when none does
    or grad is off, none (an inference graph)."""
    temps = _temperatures(tau, tau_n, tensors.x.dtype, tensors.x.device)
    training = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    if training:
        tensors = StepArgs._make(t if t is None or t.requires_grad else t.detach().requires_grad_()
                                 for t in tensors)
    with torch.set_grad_enabled(training):
        return _compiled_step(mode, slot_grad)(*tensors, *temps, cfg)


@functools.lru_cache(maxsize=64)
def _temperatures(tau: float, tau_n: float, dtype: torch.dtype, device: torch.device) -> tuple:
    """``(tau, tau_n)`` as 0-dim tensors, made once per value: the compiled step's inputs."""
    return torch.tensor(tau, dtype=dtype, device=device), torch.tensor(tau_n, dtype=dtype, device=device)


def _step(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, headroom, tau, tau_n, cfg: CellConfig, mode: str,
          slot_grad: str = "recompute") -> StepOut:
    """The step on plain tensors (:class:`~._outputs.StepArgs`' fields): the next state and the KPIs."""
    A = x.shape[-1]

    # 1. Capture into the youngest slot; the buffer limit acts on the soft message count.
    mass_before = w.sum(-1)
    admit = relax.step_add(cfg.buffer_msgs - 0.5 - mass_before, tau_n)
    w0 = send * admit
    w = torch.cat([w0.unsqueeze(-1), w[..., 1:]], dim=-1)
    x = torch.cat([(w0 * msg_bytes).unsqueeze(-1), x[..., 1:]], dim=-1)
    overflow = send - w0  # send (1 - admit)

    # 2. Service.
    service = MODES[mode].service
    c, fin, served, tx_s, rest = service(x, w, mass_before, snr_lin, headroom, cfg, tau, slot_grad)
    ages = torch.arange(A, dtype=x.dtype, device=x.device)
    done = w * c  # delivered mass per age slot
    delivered = done.sum(-1)
    delay_sum = (done * ages + w * fin).sum(-1)
    x = rest
    w = w - done

    # 3. AoI: the freshest delivered message (youngest slot first) sets it; none delivered: it ages.
    none_yet = _cumprod(1.0 - done)  # no delivery among ages 0..a
    before = torch.nn.functional.pad(none_yet[..., :-1], (1, 0), value=1.0)  # ... among ages < a
    aoi = (done * before * (ages + 1.0)).sum(-1) + (aoi + 1.0) * none_yet[..., -1]

    # 4. Ageing and timeout, then the shift by one slot (the youngest slot empty for the next capture).
    kept = w * keep
    timeouts = (w - kept).sum(-1)
    w = torch.nn.functional.pad(kept[..., :-1], (1, 0))
    x = torch.nn.functional.pad((x * keep)[..., :-1], (1, 0))
    energy_j = tx_w * tx_s
    # Goodput: the delivered mass times the message size (the step's: a rollout's sizes are constant).
    throughput = delivered * msg_bytes * (1.0 / cfg.step_s)
    return StepOut(x=x, w=w, aoi=aoi, delivered=delivered, delay_sum=delay_sum, timeouts=timeouts,
                   overflow=overflow, energy_j=energy_j, throughput_bytes_per_s=throughput,
                   queued_msgs=w.sum(-1))


@dataclasses.dataclass(frozen=True)
class Mode:
    """What differs between L1D and QAD: every dispatch on ``mode`` reads :data:`MODES`.

    :field label: the model's name in messages (``"L1D"``, ``"QAD"``).
    :field service: the service rule, ``(x, w, mass_before, snr_lin, headroom, cfg, tau, slot_grad)
        -> (c, fin, served, tx_s, rest)`` (shapes at :func:`_service_l1`).
    :field sr_field: the ``CellConfig`` field of the latency floor, slots.
    :field headroom: the derived input of the service rule, ``(snr_lin, cfg, tau, tau_n)`` ->
        ``[E, R]`` subbands (QAD's headroom cap), built once per rollout; None: none.
    :field snr_req_field: the ``CellConfig`` field of the headroom rule's per-subband SNR
        requirement, dB (a constant a calibration may fit); None: no headroom rule.
    :field fused_step: the soft step as one node with a hand-written backward
        (``_qa_step.qa_step``); None: the reference step ``_step`` (L1D's slot loop a node inside it).
    :field before_compile: run before a cold compile of the step (L1D: its slot kernels compiled
        in another process meanwhile); None: nothing.
    """

    label: str
    service: Callable
    sr_field: str
    headroom: Callable | None = None
    snr_req_field: str | None = None
    fused_step: Callable | None = None
    before_compile: Callable | None = None


MODES = {
    "L1": Mode("L1D", _service_l1, "l1_sr_slots", before_compile=_slot_kernels_in_background),
    "QA": Mode("QAD", _service_qa, "qa_sr_slots", headroom=qa_headroom, snr_req_field="qa_snr_req_db",
               fused_step=qa_step),
}


def mode_spec(mode: str) -> Mode:
    """The table entry of ``mode`` (a ValueError naming the choices for an unknown one)."""
    try:
        return MODES[mode]
    except (KeyError, TypeError):  # TypeError: an unhashable mode
        raise ValueError(f"unknown mode {mode!r}; expected one of: {', '.join(MODES)}") from None


class DiffFluid:
    """Differentiable fluid model of the uplink: ``mode="L1"`` (L1D) or ``"QA"`` (QAD).

    Eager (default), L1D's slot loop and QAD's whole step each run as one autograd node with
    a hand-written backward (``_l1_loop``, ``_qa_step``); :func:`rollout` runs a QAD rollout as
    one node (:meth:`advance_rollout`). QAD's state is then stored age-major (``[E, R, A]``
    views of ``[A, E, R]`` storage).

    :param tau: temperature of every relaxation (``0`` runs the hard operations); may be
        changed between steps (annealing).
    :param tau_n: temperature of the additive relaxations (buffer limit, timeout,
        headroom floor), in messages / control steps; defaults to ``tau``.
    :param compile: run each step compiled by torch's compiler (L1D and QAD; inductor fuses
        the step's forward and backward). One compile per mode, dtype, device, grad mode and
        ``CellConfig`` serves every batch size ``E`` and fleet size ``R`` (symbolic dimensions) and both radio
        inputs (``snr_db``, or ``pos`` + ``tx_dbm``); the temperatures are tensor inputs, so
        annealing does not recompile. L1D's K slots are not unrolled: its slot loop calls one
        compiled kernel per slot forward and one per slot backward (``_l1_loop``). The step and
        the slot kernels are kept on disk (``isaac_net_kernels/`` in ``TORCHINDUCTOR_CACHE_DIR``,
        by default ``/tmp/torchinductor_$USER``). Warm-up with an empty cache: under a minute on
        one core; with a warm one a few seconds in every new process, importing torch's
        compiler and loading the kept step, nothing traced (the cost stage measures both). At
        ``tau = 0`` or ``tau_n = 0`` the step runs eager (the hard operations). On the CPU, QAD
        (rollouts and step loops) runs its fused node with the forward compiled as one kernel a
        step (``_qa_step.FORWARD_KERNELS``) and the hand-written backward eager: compiling the
        step whole, forward and backward (what runs on a GPU), compiles longer and rolls out
        slower on the CPU (docs/design.md, "Measurements and history").
    :param checkpoint: L1D's slot loop keeps only ``served`` per slot (``[K, E, R]``) and its
        backward recomputes the rest (``True``), or keeps ~12 ``[E, R]`` values per slot for a
        third fewer ops in the eager backward (``False``). ``None`` (default): keep them
        when they take at most 4 MiB per step, recompute otherwise and when compiled.
    """

    def __init__(self, E: int, R: int, device="cpu", mode: str = "L1", tau: float = 0.05,
                 tau_n: float | None = None, *, cfg: CellConfig | None = None,
                 dtype: torch.dtype = torch.float32, compile: bool = False, checkpoint: bool | None = None):
        _validate.check_dims(E, R)
        _validate.check_dtype(dtype)
        mode_spec(mode)
        self.cfg = cfg if cfg is not None else CellConfig()
        if not isinstance(self.cfg, CellConfig):
            raise TypeError(f"cfg: expected a CellConfig, got {type(self.cfg).__name__}")
        self.E, self.R, self.mode, self.dtype = E, R, mode, dtype
        self.device = _validate.check_device(device)
        self.tau = tau
        self.tau_n = tau_n
        self.compile = bool(compile)
        if checkpoint not in (None, True, False):
            raise TypeError(f"checkpoint: expected True, False or None, got {checkpoint!r}")
        if checkpoint is None:
            tape_bytes = TENSORS_PER_SLOT * E * R * self.cfg.num_slots * torch.finfo(dtype).bits // 8
            checkpoint = self.compile or tape_bytes > 4 * 2**20
        # "recompute" / "tape": the slot loop's custom backward; "autograd" (set by the
        # benchmarks): autograd through every slot, the plain per-slot design.
        self.slot_grad = "recompute" if checkpoint else "tape"
        A = self.cfg.timeout_steps
        z = torch.zeros(E, R, A, dtype=dtype, device=self.device)
        self.state = FluidState(z, z.clone(), torch.zeros(E, R, dtype=dtype, device=self.device))

    @property
    def tau(self) -> float:
        return self._tau

    @tau.setter
    def tau(self, value: float) -> None:
        self._tau = _validate.temperature(value, "tau")
        below = 0.0 < self._tau < relax.CLOSURE_MIN_TAU
        if self.mode == "QA" and self.cfg.mf_backlog_closure and below:
            warnings.warn(f"tau: QAD with mean-field sends' backlog closure (cfg.mf_backlog_closure) has "
                          f"unstable gradients below tau = {relax.CLOSURE_MIN_TAU} (backpropagation through "
                          f"time diverges on some cells, in float64 too), got tau = {self._tau}; "
                          f"docs/design.md, section 6", stacklevel=2)

    @property
    def tau_n(self) -> float:
        return self._tau if self._tau_n is None else self._tau_n

    @tau_n.setter
    def tau_n(self, value: float | None) -> None:
        self._tau_n = _validate.temperature(value, "tau_n", allow_none=True)

    def reset(self, env_ids=None) -> None:
        """Re-initialise the envs ``env_ids`` (all when None: a fresh state with no history).

        Out of place: the other envs keep their values and their gradient history.
        """
        if env_ids is None:  # a fresh state: no link to the previous graph
            z = torch.zeros_like(self.state.x, requires_grad=False)
            self.state = FluidState(z, z.clone(), torch.zeros_like(self.state.aoi, requires_grad=False))
            return
        mask = _validate.env_mask(env_ids, self.E, self.device)
        s = self.state
        m3 = mask[:, None, None]
        self.state = FluidState(
            x=torch.where(m3, torch.zeros_like(s.x), s.x),
            w=torch.where(m3, torch.zeros_like(s.w), s.w),
            aoi=torch.where(mask[:, None], torch.zeros_like(s.aoi), s.aoi),
        )

    def detach(self) -> None:
        """Truncate backpropagation through time: later losses see the state as a constant."""
        self.state = self.state.detach()

    def step(self, send, msg_bytes, snr_db=None, pos=None, tx_dbm=None, deadline=None) -> dict:
        """Advance one control step; returns the per-step KPIs as expectations.

        :input send: ``[E, R]`` send weight in [0, 1] (probability, relaxed or binary sample).
        :input msg_bytes: ``[E, R]`` message size, bytes (> 0).
        :input snr_db: ``[E, R]`` dB, or :input pos: ``[E, R, 2]`` m with :input tx_dbm: ``[E, R]`` dBm.
        :input deadline: ``[E, R]`` continuous, in ``[1, timeout_steps]`` control steps.
        :output: dict of ``[E, R]`` tensors: offered, delivered, delay_sum, timeouts,
            overflow, aoi, energy_j, throughput_bytes_per_s, queued_msgs.
        """
        send = _validate.per_robot(send, "send", self.E, self.R, self.dtype, self.device)
        _validate.check_range(send, "send", 0.0, 1.0, "send weights in [0, 1]")
        return self.advance(send, self.inputs(msg_bytes, snr_db, pos, tx_dbm, deadline))

    def inputs(self, msg_bytes, snr_db=None, pos=None, tx_dbm=None, deadline=None) -> StepInputs:
        """Check the per-step inputs once and derive what the step uses (:class:`StepInputs`).

        A rollout with constant inputs does this once rather than at every step: ``pos``
        goes through the radio model, the deadlines become per-age survival factors and,
        for QAD, the SNR becomes the headroom cap; each is computed (and differentiated)
        once per rollout.
        """
        E, R, dt, dev, cfg = self.E, self.R, self.dtype, self.device, self.cfg
        msg_bytes = _validate.msg_bytes(msg_bytes, E, R, dt, dev)
        snr, tx = _validate.radio_inputs(snr_db, pos, tx_dbm, cfg, E, R, dt, dev)
        dl = _validate.deadline_steps(deadline, cfg, E, R, dt, dev, integer=False)
        return StepInputs.build(msg_bytes, snr, tx, dl, cfg=cfg, mode=self.mode, tau=self.tau,
                                tau_n=self.tau_n, made_for=self._inputs_key())

    def _inputs_key(self) -> tuple:
        """What the inputs of a step depend on besides the temperatures: sizes, mode, constants, dtype
        and device (``StepInputs.made_for``)."""
        return (self.E, self.R, self.mode, self.cfg, self.dtype, self.device)

    def _check_inputs(self, inputs) -> None:
        """``inputs`` were built by :meth:`inputs` of a net like this one (else a clear error, not a
        shape mismatch deep in the step or a silent mix of dtypes or constants)."""
        if not isinstance(inputs, StepInputs):
            raise TypeError(f"inputs: expected DiffFluid.inputs' StepInputs, got {type(inputs).__name__}")
        if inputs.made_for is not self._inputs_key() and inputs.made_for != self._inputs_key():
            names = ("E", "R", "mode", "cfg", "dtype", "device")
            diff = [f"{n} {a!r} (this net: {b!r})" for n, a, b in
                    zip(names, inputs.made_for or (None,) * 6, self._inputs_key(), strict=True) if a != b]
            raise ValueError("inputs: built for another net (" + "; ".join(diff)
                             + "); build them with this net's inputs()")

    @property
    def fused_rollout(self) -> bool:
        """Whether :func:`rollout` runs as one node (:meth:`advance_rollout`): QAD at tau > 0, eager,
        and on the CPU with ``compile=True`` too, where the node's forward runs as a compiled kernel
        (``_qa_step.FORWARD_KERNELS``, as a step loop's) and its hand-written backward stays eager."""
        return _runs_fused(self.mode, self.compile, self.tau, self.tau_n, self.slot_grad, self.device,
                           self.cfg)

    def advance_rollout(self, send, inputs: StepInputs, T: int, warmup: int) -> tuple:
        """``T`` steps of QAD with the inputs ``inputs`` as one node (``_qa_step.QARollout``).

        :input send: ``[E, R]`` (every step) or ``[T, E, R]``, in [0, 1].
        :output: ``(totals, last)``: the KPI totals over steps ``t >= warmup`` (``kpi.Totals``)
            and the last step's ``{"queued_msgs": [E, R]}``; the state advances by ``T`` steps.
        """
        if not self.fused_rollout:
            raise ValueError("advance_rollout: QAD only, with tau, tau_n > 0 and, on a GPU, compile=False")
        self._check_inputs(inputs)
        inputs = inputs.at(self.tau, self.tau_n, cfg=self.cfg, mode=self.mode)
        s = self.state
        end, totals = split_rollout(QARollout.apply(s.x, s.w, s.aoi, send, inputs.msg_bytes, inputs.snr_lin,
                                                    inputs.tx_w, inputs.keep, inputs.headroom, T, warmup,
                                                    self.tau, self.tau_n, self.cfg, self.compile))
        self.state = FluidState(end.x, end.w, end.aoi)
        return totals, {"queued_msgs": end.queued_msgs}

    def advance(self, send, inputs: StepInputs) -> dict:
        """``step`` on inputs from :meth:`inputs` (``send`` ``[E, R]`` in [0, 1]).

        Checks only that ``inputs`` were built for a net like this one (sizes, mode, ``cfg``, dtype,
        device): the loop of ``rollout``, where the inputs are checked once. If ``tau`` or
        ``tau_n`` changed since ``inputs`` was built, its temperature-dependent parts are
        recomputed for this step.
        """
        self._check_inputs(inputs)
        inputs = inputs.at(self.tau, self.tau_n, cfg=self.cfg, mode=self.mode)
        self.state, kpis = fluid_step(self.state, send, inputs, cfg=self.cfg,
                                      mode=self.mode, tau=self.tau, tau_n=self.tau_n, compiled=self.compile,
                                      slot_grad=self.slot_grad)
        return kpis
