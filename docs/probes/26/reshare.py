"""Probe: QAD with the time of robots not being served shared among the others (the branch's QA rule),
soft: levels L_s (the early robots' by the SR time) and L (the step's end) as roots of sums of
smin(V_j, l), Newton from below under no_grad and one differentiable Newton step (implicit gradient).
Patches model.MODES["QA"] (service, no fused node): the reference step, autograd."""
import dataclasses, math, os
import torch
from isaac_net.core.diff import model, relax
from isaac_net.core.diff.model import _fifo_cum, _n_busy, on_air_s


def _smin_l(V, L, tau):  # smin(V, L) and its derivative in L, (smin / L)^(1 + 1/tau)
    s = relax.smin(V, L, tau)
    return s, (s / L) ** (1.0 + 1.0 / tau)


RESID = []
WEIGHTED = True
CHECK = False
ITERS = 12


def _root(S, target, lo, cap, iters=None):
    iters = iters or ITERS
    """The level where the concave increasing S reaches target, from lo (S(lo) <= target), at most cap."""
    with torch.no_grad():
        L = lo.detach().clone()
        capd = cap.detach()
        for _ in range(iters):  # a fixed count: no data-dependent branch in a compiled step
            f, d = S(L)
            step = torch.clamp((target.detach() - f) / torch.clamp(d, min=1e-300), min=0.0)
            L = torch.minimum(L + step, capd)
        if CHECK:
            r = (S(L)[0] - target.detach()).abs() / target.detach().abs().clamp(min=1e-300)
            RESID.append(float(torch.where(L < capd, r, 0.0).max()))
    f, d = S(L)  # with the graph of the inputs, at the root
    # where S is flat (every robot done below the cap) the level is the cap's
    flat = d.detach() <= 1e-12
    Lg = L + (target - f) / torch.where(flat, 1.0, d.detach())
    return torch.where((L >= capd) | flat, cap, Lg)


ALPHA = float(os.environ.get("RESHARE", "1"))


def service(x, w, mass_before, snr_lin, headroom, cfg, tau, slot_grad="recompute"):

    cum = _fifo_cum(x)
    n = _n_busy(w, tau)
    sn = relax.smax(n, 1.0, tau)
    share = cfg.num_subbands / sn
    alloc = headroom * relax.smin_const(share / headroom, 1.0, tau)
    gain = relax.harmonic(n)
    se = relax.smin(torch.log2(1.0 + gain * snr_lin / relax.smax(alloc, 1.0, tau)), cfg.se_max, tau)
    rate = alloc * se * cfg.bytes_per_se_s
    rate = torch.where(rate > 0, rate, 1.0)
    e = relax.soft_empty(mass_before, tau)
    total = x.sum(-1)
    tiny = 1e-9 * cfg.step_s  # keeps smin's powers (1 / tau up to 20) finite
    b = relax.soft_busy(w.sum(-1), tau)  # [E, R]: the robot backlogged with weight b, then holding V / b
    bw = b if WEIGHTED else torch.ones_like(b)
    V = torch.clamp(total / torch.clamp(rate, min=1.0), min=tiny)  # s at the rate of n served (clamped: rate^2 underflows in float32 where n ~ 0)
    Vc = torch.clamp(V / torch.clamp(bw, min=1e-6), min=tiny) if WEIGHTED else V
    s = min(cfg.qa_sr_slots * cfg.slot_s, cfg.step_s)
    T = cfg.step_s
    assert s < T, "the probe does not cover an SR offset of the whole step"
    early = 1.0 - e

    def S1(L):
        sm, d = _smin_l(Vc, L, tau)
        return (ALPHA * (bw * early * sm).sum(-1, keepdim=True) + (1.0 - ALPHA) * sn * L,
                ALPHA * (bw * early * d).sum(-1, keepdim=True) + (1.0 - ALPHA) * sn)

    zero = torch.zeros_like(sn)
    if s > 0:
        L_s = _root(S1, sn * s, zero + tiny, sn * s)
        idle = s - S1(L_s)[0] / sn
    else:
        L_s, idle = zero, zero



    def S2(L):
        aa, da = _smin_l(Vc, L, tau)
        u = torch.clamp(L - L_s, min=tiny)
        bb, db = _smin_l(Vc, u, tau)
        return (ALPHA * (bw * (early * aa + e * bb)).sum(-1, keepdim=True) + (1.0 - ALPHA) * sn * L,
                ALPHA * (bw * (early * da + e * db)).sum(-1, keepdim=True) + (1.0 - ALPHA) * sn)

    L = _root(S2, sn * (T - idle), L_s + tiny, L_s + sn * T)
    start = e * L_s
    span = L - start
    served = rate * span
    c, frac, rest = relax.fifo_serve(x, cum, served.unsqueeze(-1), tau)
    level = start.unsqueeze(-1) + frac * span.unsqueeze(-1)  # [E, R, A]
    lv = torch.clamp(level, min=tiny).unsqueeze(-1)  # against the cell's robots [E, 1, 1, R]
    Vb, eb, wb = Vc[:, None, None, :], e[:, None, None, :], bw[:, None, None, :]
    a = relax.smin(Vb.expand(*lv.shape[:-1], V.shape[-1]), lv, tau)
    u = torch.clamp(lv - L_s[:, None, None, :], min=tiny)
    bb = relax.smin(Vb.expand(*lv.shape[:-1], V.shape[-1]), u.expand_as(a), tau)
    t = (ALPHA * (wb * ((1.0 - eb) * a + eb * bb)).sum(-1) / sn.unsqueeze(-1) + (1.0 - ALPHA) * level
         + idle.unsqueeze(-1) * relax.soft_ge(level, L_s.unsqueeze(-1).expand_as(level), tau))
    finish_s = torch.clamp(t, max=T)
    fin = c * finish_s / cfg.step_s
    own = rate  # the rate at n served: the re-share gives a robot more of the band's time, not a faster one
    return c, fin, served, on_air_s(x, rest, snr_lin, cfg, tau, own_rate=own, n_busy=n), rest


model.MODES["QA"] = dataclasses.replace(model.MODES["QA"], service=service, fused_step=None)
