r"""The K-slot loop of L1D (tau > 0) as one autograd node with a hand-written backward.

Autograd over ~50 tiny ops per slot spends most of its time in bookkeeping. This node
runs the forward without a graph, and its backward re-runs the forward (so nothing per
slot is kept between forward and backward: activation checkpointing per step) and then
walks the slots in reverse with the adjoint equations written below. It is checked
against autograd of the same recursion (``model._l1_slot``) in float64 by the tests.

Per slot ``k`` (``c`` is ``[E, R, A]``, cell quantities ``[E, 1]``, the rest ``[E, R]``):

.. math::
    m = \sum_a w_a (1 - c_a),\ b = \mathrm{smin}(m, 1),\ n = \sum_r b,\
    sh = S / \mathrm{smax}(n, 1),\ q = \log_2(1 + \mathrm{snr} / \mathrm{smax}(sh, 1)),\
    se = \mathrm{smin}(q, se_{max}),\ served \mathrel{+}= \kappa\, sh\, se,\
    tx \mathrel{+}= b\, \mathrm{smin}(sh, 1),\ csum \mathrel{+}= c,\
    c \leftarrow \sigma(\log(served) / \tau - \log(cum) / \tau).
"""

from __future__ import annotations

import math

import torch

from isaac_net.core.diff.relax import _log_pos, _tiny

LN2 = math.log(2.0)


def _smin1(x, tau):
    """``smin(x, 1)`` and its derivative."""
    xc = torch.clamp(x, min=_tiny(x))
    u = -torch.log(xc) / tau
    val = torch.exp(-tau * torch.nn.functional.softplus(u))
    return val, torch.where(x > _tiny(x), val * torch.sigmoid(u) / xc, torch.zeros_like(x))


def _smax1(x, tau):
    """``smax(x, 1)`` and its derivative."""
    xc = torch.clamp(x, min=_tiny(x))
    u = torch.log(xc) / tau
    val = torch.exp(tau * torch.nn.functional.softplus(u))
    return val, torch.where(x > _tiny(x), val * torch.sigmoid(u) / xc, torch.zeros_like(x))


def _forward(w, log_cum, snr_lin, c, tau, K, num_subbands, se_max, kappa, record):
    served = torch.zeros_like(snr_lin)
    tx = torch.zeros_like(snr_lin)
    csum = torch.zeros_like(c)
    tape = []
    for _ in range(K):
        m = (w * (1.0 - c)).sum(-1)
        b, db = _smin1(m, tau)
        N, dN = _smax1(b.sum(-1, keepdim=True), tau)
        sh = num_subbands / N
        H, dH = _smax1(sh, tau)
        q = torch.log2(1.0 + snr_lin / H)
        sv, dsv = _smin1(q / se_max, tau)
        se = se_max * sv
        s1, ds1 = _smin1(sh, tau)
        served = served + kappa * sh * se
        tx = tx + b * s1
        csum = csum + c
        c_prev = c
        c = torch.sigmoid(_log_pos(served).unsqueeze(-1) / tau - log_cum)
        if record:
            tape.append((c_prev, b, db, N, dN, sh, H, dH, dsv, se, s1, ds1, served, c))
    return served, tx, csum, tape


def _backward(w, log_cum, snr_lin, c0, g_served, g_tx, g_csum, tau, K, num_subbands, se_max, kappa):
    *_, tape = _forward(w, log_cum, snr_lin, c0, tau, K, num_subbands, se_max, kappa, True)
    s_bar, t_bar, cs_bar = g_served, g_tx, g_csum
    c_bar = torch.zeros_like(c0)
    gw = torch.zeros_like(w)
    glc = torch.zeros_like(log_cum)
    gsnr = torch.zeros_like(snr_lin)
    for c_prev, b, db, N, dN, sh, H, dH, dsv, se, s1, ds1, served, c in reversed(tape):
        # c = sigmoid(log(served) / tau - log_cum)
        z_bar = c_bar * c * (1.0 - c)
        glc = glc - z_bar
        live = served > _tiny(served)
        s_bar = s_bar + torch.where(live, z_bar.sum(-1) / (tau * torch.clamp(served, min=_tiny(served))),
                                    torch.zeros_like(served))
        # tx += b smin(sh, 1);  served += kappa sh se
        b_bar = t_bar * s1
        sh_bar = (t_bar * b).sum(-1, keepdim=True) * ds1 + kappa * (s_bar * se).sum(-1, keepdim=True)
        q_bar = s_bar * (kappa * sh) * dsv
        # q = log2(1 + snr / H)
        common = q_bar / (LN2 * (H + snr_lin))
        gsnr = gsnr + common
        sh_bar = sh_bar - (common * snr_lin / H).sum(-1, keepdim=True) * dH
        # sh = S / N, N = smax(n, 1), n = sum_r b, b = smin(m, 1)
        n_bar = -sh_bar * sh / N * dN
        m_bar = (b_bar + n_bar) * db
        # m = sum_a w_a (1 - c_a);  csum += c
        gw = gw + m_bar.unsqueeze(-1) * (1.0 - c_prev)
        c_bar = cs_bar - m_bar.unsqueeze(-1) * w
    return gw, glc, gsnr


_COMPILED = {}


def _impl(name, compiled):
    fn = {"forward": _forward, "backward": _backward}[name]
    if not compiled:
        return fn
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=False)
    return _COMPILED[name]


class L1SlotLoop(torch.autograd.Function):
    """``(w, log_cum, snr_lin, c0) -> (served, tx_frac, c_sum)`` after K slots.

    With ``compiled`` the forward and the backward (each a graph-free unrolled loop) go
    through ``torch.compile``.
    """

    @staticmethod
    def forward(ctx, w, log_cum, snr_lin, c0, tau, K, num_subbands, se_max, kappa, compiled=False):
        ctx.save_for_backward(w, log_cum, snr_lin, c0)
        if compiled:  # a tensor, so that a new temperature is a new input value, not a recompile
            tau = torch.tensor(tau, dtype=w.dtype, device=w.device)
        ctx.consts = (tau, K, num_subbands, se_max, kappa)
        ctx.compiled = compiled
        served, tx, csum, _ = _impl("forward", compiled)(w, log_cum, snr_lin, c0, *ctx.consts, False)
        return served, tx, csum

    @staticmethod
    def backward(ctx, g_served, g_tx, g_csum):
        w, log_cum, snr_lin, c0 = ctx.saved_tensors
        g_served = torch.zeros_like(snr_lin) if g_served is None else g_served
        g_tx = torch.zeros_like(snr_lin) if g_tx is None else g_tx
        g_csum = torch.zeros_like(c0) if g_csum is None else g_csum
        with torch.no_grad():
            gw, glc, gsnr = _impl("backward", ctx.compiled)(w, log_cum, snr_lin, c0, g_served, g_tx, g_csum,
                                                            *ctx.consts)
        return gw, glc, gsnr, None, None, None, None, None, None, None
