r"""The K-slot loop of L1D (tau > 0) as one autograd node with a hand-written backward.

Autograd over ~50 tiny ops per slot spends most of its time in bookkeeping. This node
runs the forward without a graph and keeps only ``served`` at the start of each slot
(``[K, E, R]``, activation checkpointing per slot); its backward walks the slots in
reverse, recomputes each slot's values from that checkpoint (or, with ``keep_tape``,
reads the values the forward kept) and applies the adjoint equations written below.
It is checked against autograd of the same recursion (``model._l1_slot``) in float64 by
the tests.

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

from isaac_net.core.diff.relax import _log_pos, _tiny, smax1_vjp, smin1_vjp

LN2 = math.log(2.0)


def _flip_dims(t: torch.Tensor) -> torch.Tensor:
    """``[E, R, A]`` <-> ``[A, R, E]`` and ``[E, R]`` <-> ``[R, E]`` (contiguous): the loop's layout."""
    return t.permute(tuple(range(t.dim()))[::-1]).contiguous()


def _completion(served, log_cum, tau):
    """``c = sigmoid(log(served) / tau - log(cum) / tau)`` ``[A, R, E]`` from ``served`` ``[R, E]``."""
    return torch.sigmoid(_log_pos(served) / tau - log_cum)


TAPE = ("b", "db", "N", "dN", "sh", "H", "dH", "dsv", "se", "s1", "ds1")
TENSORS_PER_SLOT = len(TAPE) + 1  # with the tape: its values and ``served`` before the slot


def _slot(w, c, served, snr_lin, tau, num_subbands, se_max, kappa, deriv: bool = True):
    """One slot from ``(c, served)`` before it: the values of ``TAPE`` (derivatives None
    without ``deriv``) and ``served`` after it."""
    m = (w * (1.0 - c)).sum(0)
    b, db = smin1_vjp(m, tau, deriv=deriv)
    N, dN = smax1_vjp(b.sum(0, keepdim=True), tau, deriv=deriv)
    sh = num_subbands / N
    H, dH = smax1_vjp(sh, tau, deriv=deriv)
    q = torch.log2(1.0 + snr_lin / H)
    sv, dsv = smin1_vjp(q / se_max, tau, deriv=deriv)
    se = se_max * sv
    s1, ds1 = smin1_vjp(sh, tau, deriv=deriv)
    return (b, db, N, dN, sh, H, dH, dsv, se, s1, ds1), served + kappa * sh * se


def _forward(w, log_cum, snr_lin, c0, tau, K: int, num_subbands, se_max, kappa, keep_tape: bool = False):
    """The K slots without a graph: ``(served, tx, csum, served_before, tape)``.

    ``served_before`` ``[K, E, R]`` holds ``served`` at the start of each slot. With
    ``keep_tape`` ``tape`` lists each slot's ``TAPE`` values (~12 ``[E, R]`` per slot) for the
    backward; otherwise it is empty and the backward recomputes them from ``served_before``.
    """
    served = torch.zeros_like(snr_lin)
    tx = torch.zeros_like(snr_lin)
    csum = torch.zeros_like(c0)
    c = c0
    history, tape = [], []
    for _ in range(K):
        history.append(served)
        values, served = _slot(w, c, served, snr_lin, tau, num_subbands, se_max, kappa, deriv=keep_tape)
        if keep_tape:
            tape.append(values)
        v = dict(zip(TAPE, values, strict=True))
        tx = tx + v["b"] * v["s1"]  # b smin(sh, 1)
        csum = csum + c
        c = _completion(served, log_cum, tau)
    # One [K, ...] tensor per TAPE value: 12 saved tensors instead of 12 K (each saved tensor costs
    # the autograd node, or a compiled graph's runtime wrapper, a pack and an unpack)
    return served, tx, csum, torch.stack(history), [torch.stack(v) for v in zip(*tape, strict=True)]


def _backward(w, log_cum, snr_lin, c0, served_before, served_K, tape, g_served, g_tx, g_csum, tau, K: int,
              num_subbands, se_max, kappa):
    """Reverse walk over the slots, with each slot's ``TAPE`` values from ``tape`` or recomputed."""
    s_bar, t_bar, cs_bar = g_served, g_tx, g_csum
    c_bar = torch.zeros_like(c0)
    gw = torch.zeros_like(w)
    glc = torch.zeros_like(log_cum)
    gsnr = torch.zeros_like(snr_lin)
    c, served = _completion(served_K, log_cum, tau), served_K  # after slot k
    for k in range(K - 1, -1, -1):
        c_prev = c0 if k == 0 else _completion(served_before[k], log_cum, tau)
        if tape:
            values = [t[k] for t in tape]
        else:
            values, _ = _slot(w, c_prev, served_before[k], snr_lin, tau, num_subbands, se_max, kappa)
        b, db, N, dN, sh, H, dH, dsv, se, s1, ds1 = values
        # c = sigmoid(log(served) / tau - log_cum)
        z_bar = c_bar * c * (1.0 - c)
        glc = glc - z_bar
        live = served > _tiny(served)
        s_bar = s_bar + torch.where(live, z_bar.sum(0) / (tau * torch.clamp(served, min=_tiny(served))), 0.0)
        # tx += b smin(sh, 1);  served += kappa sh se
        b_bar = t_bar * s1
        sh_bar = (t_bar * b).sum(0, keepdim=True) * ds1 + kappa * (s_bar * se).sum(0, keepdim=True)
        q_bar = s_bar * (kappa * sh) * dsv
        # q = log2(1 + snr / H)
        common = q_bar / (LN2 * (H + snr_lin))
        gsnr = gsnr + common
        sh_bar = sh_bar - (common * snr_lin / H).sum(0, keepdim=True) * dH
        # sh = S / N, N = smax(n, 1), n = sum_r b, b = smin(m, 1)
        n_bar = -sh_bar * sh / N * dN
        m_bar = (b_bar + n_bar) * db
        # m = sum_a w_a (1 - c_a);  csum += c
        gw = gw + m_bar * (1.0 - c_prev)
        c_bar = cs_bar - m_bar * w
        c, served = c_prev, served_before[k]
    return gw, glc, gsnr


class L1SlotLoop(torch.autograd.Function):
    """``(w, log_cum, snr_lin, c0) -> (served, tx_frac, c_sum)`` after K slots.

    Keeps ``served`` at the start of each slot (``[K, E, R]``) for the backward, which
    recomputes the other per-slot values while it walks the slots in reverse, or with
    ``keep_tape`` keeps those too (about 12x the memory, a third fewer ops in eager). Traceable
    by ``torch.compile`` (the compiled step fuses its forward and backward).
    """

    @staticmethod
    def forward(ctx, w, log_cum, snr_lin, c0, tau, K, num_subbands, se_max, kappa, keep_tape=False):
        consts = (tau, K, num_subbands, se_max, kappa)
        w, log_cum, snr_lin, c0 = (_flip_dims(t) for t in (w, log_cum, snr_lin, c0))
        served, tx, csum, served_before, tape = _forward(w, log_cum, snr_lin, c0, *consts, keep_tape)
        ctx.save_for_backward(w, log_cum, snr_lin, c0, served_before, served, *tape)
        ctx.consts = consts
        return _flip_dims(served), _flip_dims(tx), _flip_dims(csum)

    @staticmethod
    def backward(ctx, g_served, g_tx, g_csum):
        w, log_cum, snr_lin, c0, served_before, served_K, *tape = ctx.saved_tensors
        g_served = torch.zeros_like(snr_lin) if g_served is None else _flip_dims(g_served)
        g_tx = torch.zeros_like(snr_lin) if g_tx is None else _flip_dims(g_tx)
        g_csum = torch.zeros_like(c0) if g_csum is None else _flip_dims(g_csum)
        gw, glc, gsnr = _backward(w, log_cum, snr_lin, c0, served_before, served_K, tape, g_served, g_tx,
                                  g_csum, *ctx.consts)
        return _flip_dims(gw), _flip_dims(glc), _flip_dims(gsnr), None, None, None, None, None, None, None
