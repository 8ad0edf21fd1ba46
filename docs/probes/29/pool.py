"""Probe (29): QAD's interval with the share ``a`` of the band's time pooled among the robots being
served, the rest held as QA's static share (``a = 0`` QA's static share, ``a = 1`` probe (19)'s time
re-shared). A robot being served then gets ``(1 - a) / n + a / n'`` of the band's time (``n`` robots
backlogged, ``n'`` being served), where ``CellConfig.qa_reshare``'s rule (probe (26)) gives
``1 / ((1 - a) n + a n')``: a rate blend rather than a count blend, the form of (25)'s output blend.

In level units (seconds of service at the static rate) a robot's level grows at ``(1 - a) + a n / n'``,
so the time of level ``l`` is ``int_0^l g(n'(u)) du`` with ``g(n') = n' / ((1 - a) n' + a n)``: piecewise
linear with knots where a robot's need ends (``n'`` piecewise constant), exactly, by sorted sums
(``min`` at every temperature, as ``model._served_at``; the relaxation's smoothing comes from the soft
busy and empty weights). An early robot (queued at the step's start) is served from level 0, a late
one (empty, sends an SR) from the level ``L_s`` the early robots reach by the SR's time.

Patches ``model._reshared_qa`` (so ``CellConfig.qa_reshare > 0`` runs this rule), through the
reference step (autograd), compiled or eager."""
import torch

from isaac_net.core.diff import model, relax
from isaac_net.core.diff.model import on_air_s


def _g(n_srv, a: float, sn, g_tail):
    """``dt / dl`` while ``n_srv`` robots are served: ``n' / ((1 - a) n' + a n)``; ``g_tail`` where none
    is (the level then runs on at QA's static pace: the time nobody uses passes)."""
    return torch.where(n_srv > 0, n_srv / ((1.0 - a) * n_srv + a * sn), g_tail)


def _time_map(starts, ends, wts, a: float, sn, g_tail):
    """The level-to-time map's knots: levels ``[E, K]`` (sorted) and times ``[E, K]`` and the slope
    ``g`` of the segment ending at each knot ``[E, K]``, for pieces of service ``[start, end)`` with
    weights ``wts`` (``[E, P]`` each)."""
    ev = torch.cat([starts, ends], -1)  # [E, 2P]
    dw = torch.cat([wts, -wts], -1)
    ev_s, order = torch.sort(ev, dim=-1)
    dw_s = torch.gather(dw, -1, order)
    n_after = torch.cumsum(dw_s, -1)  # served weight on the segment after each knot
    n_before = torch.cat([torch.zeros_like(n_after[:, :1]), n_after[:, :-1]], -1)
    seg = torch.clamp(n_before, min=0.0)  # rounding of the running sum
    g = _g(seg, a, sn, g_tail)
    prev = torch.cat([torch.zeros_like(ev_s[:, :1]), ev_s[:, :-1]], -1)
    t = torch.cumsum((ev_s - prev) * g, -1)
    return ev_s, t, g


def _segment(keys, query, right: bool, ev_s, t, g, g_tail):
    """The segment of the map ``(ev_s, t, g)`` where ``query`` falls among ``keys`` (its knots' levels or
    times): the time and level at its start and its slope, ``g_tail`` past the last knot."""
    k = torch.searchsorted(keys.detach().contiguous(), query.detach().contiguous(), right=right)
    K = ev_s.shape[-1]
    pad = torch.zeros_like(t[:, :1])
    t0 = torch.gather(torch.cat([pad, t], -1), -1, k)
    l0 = torch.gather(torch.cat([pad, ev_s], -1), -1, k)
    return t0, l0, torch.where(k < K, torch.gather(g, -1, torch.clamp(k, max=K - 1)), g_tail)


def _time_at(levels, ev_s, t, g, g_tail):
    """The time ``[E, K']`` at levels ``[E, K']`` on the map ``(ev_s, t, g)``; past its last knot (nobody
    served) at the slope ``g_tail``."""
    t0, l0, gk = _segment(ev_s, levels, False, ev_s, t, g, g_tail)  # ev_s[k-1] < l <= ev_s[k]
    return t0 + (levels - l0) * gk


def _level_at(time_s, ev_s, t, g, g_tail):
    """The level ``[E, 1]`` the map reaches at ``time_s`` ``[E, 1]``; past its last knot (every robot
    done) at the slope ``g_tail``."""
    t0, l0, gk = _segment(t, time_s, True, ev_s, t, g, g_tail)  # t[k-1] <= time < t[k]
    return l0 + (time_s - t0) / torch.where(gk > 0, gk, 1.0)


def pooled_qa(x, w, cum, mass_before, snr_lin, n, sn, rate, cfg, tau):
    """Drop-in for ``model._reshared_qa`` (inputs and output as ``model._service_qa``'s)."""
    a, T, hard = float(cfg.qa_reshare), cfg.step_s, relax.is_hard(tau)
    tiny = 1e-9 * cfg.step_s
    e = relax.soft_empty(mass_before, tau)  # [E, R]
    b = relax.soft_busy(w.sum(-1), tau)
    V = torch.clamp(x.sum(-1) / torch.clamp(rate, min=1.0), min=tiny)
    Vb = torch.clamp(V / torch.clamp(b, min=1e-6), min=tiny)
    s = min(cfg.qa_sr_slots * cfg.slot_s, T)
    early = b * (1.0 - e)
    zero = torch.zeros_like(Vb)
    # up to the SR: the early robots alone
    # past every robot's need the level runs on at QA's static pace, (1 - a) of the band's time held
    # (at a = 1: the level reaches the step's end at 1 / n, as the re-shared interval's cap)
    g_tail = torch.full_like(sn, 1.0 - a) if a < 1.0 else 1.0 / sn
    ev1, t1, g1 = _time_map(zero, Vb, early, a, sn, g_tail)
    L_s = _level_at(torch.full_like(sn, s), ev1, t1, g1, g_tail)
    late = b * e
    starts = torch.cat([zero, L_s.expand_as(Vb)], -1)
    ends = torch.cat([Vb, L_s + Vb], -1)
    ev, t, g = _time_map(starts, ends, torch.cat([early, late], -1), a, sn, g_tail)
    if s >= T:
        L = L_s
    else:
        L = _level_at(torch.full_like(sn, T), ev, t, g, g_tail)
    start = e * L_s
    span = torch.clamp(L - start, min=0.0)
    served = rate * span
    if hard:
        served = torch.where(start + Vb <= L, torch.maximum(served, x.sum(-1)), served)
    c, frac, rest = relax.fifo_serve(x, cum, served.unsqueeze(-1), tau)
    part = cum / rate.unsqueeze(-1) if hard else frac * span.unsqueeze(-1)
    level = start.unsqueeze(-1) + part  # [E, R, A]
    E = level.shape[0]
    t_s = _time_at(level.reshape(E, -1), ev, t, g, g_tail).reshape(level.shape)
    finish_s = torch.clamp(t_s, max=T)
    return c, c * finish_s / T, served, on_air_s(x, rest, snr_lin, cfg, tau, own_rate=rate, n_busy=n), rest


model._reshared_qa = pooled_qa
