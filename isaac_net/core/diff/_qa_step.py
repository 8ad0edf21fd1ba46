r"""QAD (tau > 0, tau_n > 0) as autograd nodes with a hand-written backward.

Autograd through ``model._step`` in QA mode records ~120 tiny ops per step and replays
~500 in the backward (``where``, ``clamp``, ``softplus`` and ``div`` each cost several),
so at E = 64 the eager step is bookkeeping, not arithmetic. ``_forward`` runs the same step
without a graph and keeps the ~45 intermediates its adjoint needs; ``_backward`` applies the
adjoint equations below in about as many ops as the forward. ``QARollout`` runs ``T`` steps
as one node (``rollout``'s path) and ``qa_step`` one (``DiffFluid.step``). The tests check
them against autograd of ``model._step`` in float64 (values and gradients, at the edges),
against each other, and with gradcheck.

Forward, per env (``[A, E, R]`` per message, age-major, ``[E, R]`` per robot, ``[E, 1]`` per
cell):

.. math::
    m_0 = \sum_a w_a,\ adm = \sigma((F - \tfrac12 - m_0)/\tau_n),\ w_0 \leftarrow s\,adm,\
    x_0 \leftarrow w_0 B,\ cum_a = \sum_{k \ge a} x_k,\ b = \mathrm{smin}(\sum_a w_a, 1),\
    n = \sum_r b,\ sh = S / \mathrm{smax}(n, 1),\ al = m\,\mathrm{smin}(sh / m, 1),\\
    se = \mathrm{smin}(\log_2(1 + H(n)\,snr / \mathrm{smax}(al, 1)), se_{max}),\
    av = T_{step} - (1 - \mathrm{smin}(m_0, 1))\,T_{SR},\ S = al\,se\,\kappa\,av,\\
    z_a = (\log S - \log cum_a)/\tau,\ c = \sigma(z),\ q = cum\,c^\tau,\
    frac = (1 - c)^\tau,\ rest_a = x_a - q_a + q_{a+1}.

The AoI is written as ``1 + sum_{a < A-1} P_a + (aoi + 1 - A) P_{A-1}`` with
``P = cumprod(1 - w c)`` (the same value as ``model._step``'s sum over the freshest
delivery); the cumprod's adjoint is computed without dividing by its factors, which are
exactly 0 when a whole message is delivered.
"""

from __future__ import annotations

import functools
import math

import torch

from isaac_net.core.config import CellConfig
from isaac_net.core.diff._l1_loop import LN2
from isaac_net.core.diff.relax import EULER_GAMMA, _tiny


class _Consts:
    """The step's scalars as 0-dim tensors of the state's dtype and device: an op with a Python
    number wraps and converts it at every call (~2 us each on these small tensors)."""

    def __init__(self, tau: float, tau_n: float, cfg: CellConfig, A: int, dtype: torch.dtype,
                 device: torch.device):
        values = dict(
            zero=0.0, one=1.0, neg_inf=-math.inf, tiny=_tiny(torch.empty(0, dtype=dtype)), tau=tau,
            inv_tau=1.0 / tau, neg_inv_tau=-1.0 / tau, neg_tau=-tau, inv_tau_n=1.0 / tau_n,
            buffer_limit=cfg.buffer_msgs - 0.5, subbands=float(cfg.num_subbands), se_max=cfg.se_max,
            inv_se_max=1.0 / cfg.se_max, kappa=cfg.bytes_per_se_s, sr_full_s=cfg.qa_sr_slots * cfg.slot_s,
            step_s=cfg.step_s, inv_step_s=1.0 / cfg.step_s, inv_ln2=1.0 / LN2, gamma=EULER_GAMMA,
            one_minus_A=1.0 - A,
        )
        for name, value in values.items():
            setattr(self, name, torch.tensor(value, dtype=dtype, device=device))
        self.sr_fills_step = cfg.qa_sr_slots == cfg.num_slots
        self.ages = torch.arange(A, dtype=dtype, device=device).view(A, 1, 1)


@functools.lru_cache(maxsize=32)
def _consts(tau: float, tau_n: float, cfg: CellConfig, A: int, dtype: torch.dtype, device: torch.device):
    return _Consts(tau, tau_n, cfg, A, dtype, device)


def _keep_graph() -> bool:
    """Whether the running backward keeps the graph (``retain_graph=True``); True where torch
    cannot tell (then the rollout's values stay until the graph is freed)."""
    query = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)  # as AOT autograd
    return True if query is None else bool(query())


def _rev_cumsum(t: torch.Tensor) -> torch.Tensor:
    """``out_a = sum_{k >= a} t_k`` over the age dimension (0)."""
    return t.flip(0).cumsum(0).flip(0)


def _shift_older(t: torch.Tensor) -> torch.Tensor:
    """``out_0 = 0, out_a = t_{a-1}``: each message one age older (the step's final shift)."""
    return torch.nn.functional.pad(t[:-1], (0, 0, 0, 0, 1, 0))


def _shift_younger(t: torch.Tensor) -> torch.Tensor:
    """``out_a = t_{a+1}, out_{A-1} = 0``: the adjoint of ``_shift_older``."""
    return torch.nn.functional.pad(t[1:], (0, 0, 0, 0, 0, 1))


def _to_ages(t: torch.Tensor) -> torch.Tensor:
    """``[E, R, A]`` -> ``[A, E, R]``, contiguous.

    The steps work age-major: a per-robot ``[E, R]`` factor then broadcasts over contiguous age
    rows and a sum over ages adds whole rows, about 2x cheaper per op at E = 64 than over a last
    dimension of 10. The state they hand back is an ``[E, R, A]`` view of age-major storage, so
    the next step or rollout takes it without a copy.
    """
    return t.permute(2, 0, 1).contiguous()


def _smin1(x, k: _Consts, positive: bool = False):
    """``smin(x, 1) = exp(-tau softplus(-log(x) / tau))`` and its derivative (0 below ``tiny``,
    where the clamp holds ``x``, as autograd of ``relax.smin_const``; ``positive``: ``x`` is known
    to be far above ``tiny``, no clamp)."""
    xc = x if positive else torch.clamp_min(x, k.tiny)
    u = torch.log(xc).mul_(k.neg_inv_tau)
    val = torch.nn.functional.softplus(u).mul_(k.neg_tau).exp_()
    deriv = torch.sigmoid(u).mul_(val).div_(xc)
    return val, deriv if positive else torch.where(x > k.tiny, deriv, k.zero)


def _smax1(x, k: _Consts):
    """``smax(x, 1) = exp(tau softplus(log(x) / tau))`` and its derivative, as ``_smin1``."""
    xc = torch.clamp_min(x, k.tiny)
    u = torch.log(xc).mul_(k.inv_tau)
    val = torch.nn.functional.softplus(u).mul_(k.tau).exp_()
    return val, torch.where(x > k.tiny, torch.sigmoid(u).mul_(val).div_(xc), k.zero)


def _forward(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m, k: _Consts):
    """The step without a graph, on ``[A, E, R]`` ``x``, ``w``, ``keep`` (the rest ``[E, R]``):
    ``(outputs, saved)``, the outputs of ``model._step`` with ``x``, ``w`` ``[A, E, R]``."""
    # 1. Capture.
    m0 = w.sum(0)
    admit = torch.sigmoid((k.buffer_limit - m0).mul_(k.inv_tau_n))
    w0 = send * admit
    w1 = w.clone()
    w1[0] = w0
    x1 = x.clone()
    x1[0] = w0 * msg_bytes
    overflow = send - w0

    # 2. Service: one processor-sharing interval.
    cum = _rev_cumsum(x1)
    # busy = smin(sum_a w1, 1) and the was-empty gate's smin(m0, 1) in one pass
    (busy, e), (d_busy, d_e) = _smin1(torch.stack([w1.sum(0), m0]), k)
    n = busy.sum(-1, keepdim=True)
    sn, d_sn = _smax1(n, k)
    share = k.subbands / sn
    ratio = share / m
    sr, d_sr = _smin1(ratio, k, positive=True)  # share / m >= 1 / (smax(n, 1) m) > 0
    alloc = m * sr
    gain = torch.special.digamma(n + k.one).add_(k.gamma)
    # smax(a, 1) = a / smin(a, 1) (alloc >= smin(share / m, 1) > 0, no clamp), and its derivative
    # (1 - a smin'(a, 1) / smin(a, 1)) / smin(a, 1)
    s1, d_s1 = _smin1(alloc, k, positive=True)
    sa = alloc / s1
    d_sa = (k.one - alloc * d_s1 / s1).div_(s1)
    snr_g = gain * snr_lin / sa
    y = torch.log2(snr_g + k.one)
    v, d_v = _smin1(y * k.inv_se_max, k)
    se = v * k.se_max
    # model._service_qa sets a rate of 0 to 1; at tau > 0 it is not 0: n >= R smin(0, 1) > 0 keeps
    # the PF gain, and so se, above 0 (in float32 the rate is >= ~1e-26 B/s)
    rate = alloc * se * k.kappa
    sr_s = (k.one - e).mul_(k.sr_full_s)
    avail = k.step_s - sr_s
    served = rate * avail
    served_c = torch.clamp_min(served, k.tiny)
    cum_c = torch.clamp_min(cum, k.tiny)
    z = (torch.log(served_c) - torch.log(cum_c)).mul_(k.inv_tau)
    has = cum > k.zero
    log_c = torch.nn.functional.logsigmoid(z)
    if k.sr_fills_step:  # avail, and so served, is 0 for a robot that was empty: nothing is served
        log_c = torch.where(served > k.zero, log_c, k.neg_inf)
    log_c = torch.where(has, log_c, k.zero)
    c = torch.exp(log_c)
    ct = torch.exp(log_c * k.tau)
    q = cum * ct  # smin(cum, served)
    d = torch.where(has, log_c - z, k.neg_inf)  # log(1 - c)
    frac = torch.exp(d * k.tau)
    rest = x1 - q
    rest[:-1] += q[1:]
    finish_s = frac * avail + sr_s
    fin = c * finish_s * k.inv_step_s
    tx_s = busy * s1 * frac[0] * avail

    # 3. KPIs, AoI, ageing and the shift.
    done = w1 * c
    delivered = done.sum(0)
    delay_sum = (done * k.ages + w1 * fin).sum(0)
    w2 = w1 - done
    none_yet = torch.cumprod(k.one - done, 0)
    aoi_coef = aoi + k.one_minus_A  # d aoi_next / d none_yet_{A-1}; 1 for the other ages
    aoi_next = none_yet[:-1].sum(0).add_(k.one) + aoi_coef * none_yet[-1]
    kept = w2 * keep
    timeouts = (w2 - kept).sum(0)
    w_next = _shift_older(kept)
    x_next = _shift_older(rest * keep)
    energy_j = tx_w * tx_s
    outputs = (x_next, w_next, aoi_next, delivered, delay_sum, timeouts, overflow, energy_j, w_next.sum(0))
    saved = (send, msg_bytes, snr_lin, tx_w, keep, m, admit, w0, w1, busy, d_busy, sn, d_sn, share, ratio, sr,
             d_sr, alloc, n, gain, sa, d_sa, snr_g, se, d_v, rate, d_e, avail, served, served_c,
             cum, cum_c, c, ct, q, frac, finish_s, fin, s1, d_s1, tx_s, done, w2, none_yet,
             aoi_coef, rest)
    return outputs, saved


def _backward(saved, grads, k: _Consts, needs: tuple):
    """Adjoint of ``_forward`` (``[A, E, R]`` as there): gradients of ``(x, w, aoi, send, msg_bytes,
    snr_lin, tx_w, keep, m)``."""
    (send, msg_bytes, snr_lin, tx_w, keep, m, admit, w0, w1, busy, d_busy, sn, d_sn, share, ratio, sr, d_sr,
     alloc, n, gain, sa, d_sa, snr_g, se, d_v, rate, d_e, avail, served, served_c, cum, cum_c,
     c, ct, q, frac, finish_s, fin, s1, d_s1, tx_s, done, w2, none_yet, aoi_coef, rest) = saved
    g_x_next, g_w_next, g_aoi_next, g_delivered, g_delay, g_timeouts, g_overflow, g_energy, g_queued = grads

    # 3. Shift, ageing, timeouts: w_next = shift(w2 keep), x_next = shift(rest keep), queued = sum w_next,
    # timeouts = sum(w2 - w2 keep).
    g_kept = _shift_younger(g_w_next + g_queued).sub_(g_timeouts)
    g_xk = _shift_younger(g_x_next)
    g_w2 = g_kept * keep + g_timeouts
    g_keep = g_kept * w2 + g_xk * rest if needs[7] else None
    g_rest = g_xk * keep
    # aoi_next = 1 + sum_{a<A-1} P_a + coef P_{A-1}, P = cumprod(f), f = 1 - done. The adjoint at
    # factor i is sum_{j >= i} G_j prod_{k <= j, k != i} f_k. A factor is exactly 0 when a whole
    # message is delivered, so no division by it: with P' the cumprod of f with its zeros set to 1
    # and Z_j the number of zeros among f_0..f_j, the product is P'_j / f_i where Z_j = 0, P'_j where
    # f_i is the one zero (Z_j = 1), and 0 otherwise.
    # On the CPU, where reading a flag is free, the common case without zeros takes P' = P, Z = 0.
    g_aoi = g_aoi_next * none_yet[-1]
    f = k.one - done
    zero = f == k.zero
    if f.device.type == "cpu" and not bool(zero.any()):
        gp = none_yet * g_aoi_next  # G_j P_j
        gp[-1] *= aoi_coef
        g_f = _rev_cumsum(gp).div_(f)
    else:
        f_safe = torch.where(zero, k.one, f)
        num_zeros = zero.cumsum(0)
        gp = torch.cumprod(f_safe, 0).mul_(g_aoi_next)  # G_j P'_j
        gp[-1] *= aoi_coef
        g_f = _rev_cumsum(torch.where(num_zeros == 0, gp, k.zero)).div_(f_safe)
        g_f += torch.where(zero, _rev_cumsum(torch.where(num_zeros == 1, gp, k.zero)), k.zero)
    # w2 = w1 - done; delay_sum = sum(done ages + w1 fin); delivered = sum(done); done = w1 c.
    g_done = (g_delay * k.ages).add_(g_delivered).sub_(g_w2).sub_(g_f)
    g_w1 = (g_delay * fin).add_(g_w2).add_(g_done * c)
    g_fin = g_delay * w1
    g_c = g_done * w1
    # energy = tx_w tx_s; tx_s = busy s1 frac_0 avail.
    g_tx_w = g_energy * tx_s if needs[6] else None
    g_tx = g_energy * tx_w
    b_s1 = busy * s1
    f_av = frac[0] * avail
    g_busy = g_tx * s1 * f_av
    g_alloc = g_tx * busy * f_av * d_s1
    g_frac0 = g_tx * b_s1 * avail
    g_avail = g_tx * b_s1 * frac[0]
    # fin = c finish / T_step; finish = sr_s + frac avail.
    g_c += g_fin * finish_s * k.inv_step_s
    g_finish = g_fin * c * k.inv_step_s
    g_sr_s = g_finish.sum(0)
    g_frac = g_finish * avail
    g_frac[0] += g_frac0
    g_avail += (g_finish * frac).sum(0)
    # rest_a = x_a - q_a + q_{a+1}
    g_x1 = g_rest
    g_q = -g_rest
    g_q[1:] += g_rest[:-1]
    # frac = exp(tau d), d = log_c - z = log(1 - c); q = cum c^tau; c = exp(log_c); log_c = logsigmoid(z).
    g_d = g_frac * frac * k.tau
    g_log_c = (g_q * q * k.tau).add_(g_d).add_(g_c * c)
    g_cum = g_q * ct
    # d logsigmoid(z) / dz = 1 - c; where nothing is queued c = 1, where nothing is served g_log_c = 0
    g_z = (k.one - c).mul_(g_log_c).sub_(g_d)
    # z = (log served - log cum) / tau
    g_cum -= torch.where(cum > k.tiny, g_z * k.inv_tau / cum_c, k.zero)
    g_served = torch.where(served > k.tiny, g_z.sum(0) * k.inv_tau / served_c, k.zero)
    g_x1 = g_x1 + g_cum.cumsum(0)  # cum_a = sum_{k >= a} x_k
    # served = rate avail; avail = T_step - sr_s; sr_s = (1 - e) T_SR, e = smin(m0, 1).
    g_avail += g_served * rate
    g_m0 = (g_avail - g_sr_s).mul_(k.sr_full_s).mul_(d_e)
    # rate = alloc se kappa.
    g_rate0 = g_served * avail * k.kappa
    g_alloc += g_rate0 * se
    g_se = g_rate0 * alloc
    # se = se_max smin(y / se_max, 1); y = log2(1 + snr_g); snr_g = gain snr / sa; sa = smax(alloc, 1).
    g_sg = g_se * d_v * k.inv_ln2 / (snr_g + k.one)
    g_snr = g_sg * gain / sa if needs[5] else None
    g_gain = g_sg * snr_lin / sa
    g_alloc -= g_sg * snr_g / sa * d_sa
    # alloc = m sr, sr = smin(ratio, 1), ratio = share / m; share = S / sn, sn = smax(n, 1); gain = H(n).
    g_ratio = g_alloc * m * d_sr
    g_m = g_alloc * sr - g_ratio * ratio / m if needs[8] else None
    g_share = (g_ratio / m).sum(-1, keepdim=True)
    g_n = (g_gain.sum(-1, keepdim=True) * torch.special.polygamma(1, n + k.one)
           - g_share * share / sn * d_sn)
    # n = sum_r busy; busy = smin(sum_a w1, 1).
    g_w1 += (g_busy + g_n) * d_busy
    # Capture: w1 = w with w1_0 = w0, x1 = x with x1_0 = w0 B; overflow = send - w0; w0 = send admit.
    g_w0 = g_w1[0] + g_x1[0] * msg_bytes - g_overflow
    g_bytes = g_x1[0] * w0 if needs[4] else None
    g_send = g_overflow + g_w0 * admit
    g_m0 -= g_w0 * send * admit * (k.one - admit) * k.inv_tau_n
    g_x = g_x1  # x_0 is overwritten by the capture
    g_x[0] = 0.0
    g_w = g_w1 + g_m0
    g_w[0] = g_m0
    return g_x, g_w, g_aoi, g_send, g_bytes, g_snr, g_tx_w, g_keep, g_m


def _rollout_forward(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, headroom, T: int, warmup: int,
                     k: _Consts) -> tuple:
    """``T`` steps of ``_forward`` from ``[A, E, R]`` ``x``, ``w``, ``keep``: ``(x_T, w_T, aoi_T,
    queued_T, totals, tape)`` with the KPI totals over steps ``t >= warmup`` (``kpi.COUNT_KEYS``
    order) and each step's saved values."""
    tape, totals = [], None
    for t in range(T):
        send_t = send[t] if send.dim() == 3 else send
        (x, w, aoi, *kpis, queued), saved = _forward(x, w, aoi, send_t, msg_bytes, snr_lin, tx_w, keep,
                                                      headroom, k)
        tape.append(saved)
        if t >= warmup:  # offered, delivered, delay_sum, timeouts, overflow, energy_j, aoi
            step = (send_t, *kpis, aoi)
            if totals is None:
                totals = [v.clone() for v in step]
            else:
                for total, v in zip(totals, step, strict=True):
                    total.add_(v)
    return x, w, aoi, queued, totals, tape


def _rollout_backward(tape, grads, send_shape, T: int, warmup: int, free: bool, k: _Consts,
                      needs: tuple) -> tuple:
    """``_backward`` over the steps in reverse: gradients of ``QARollout``'s inputs (``[A, E, R]``
    ``x``, ``w``, ``keep``); ``free``: drop each step's saved values once used."""
    (g_x, g_w, g_aoi, g_queued, g_offered, g_delivered, g_delay, g_timeouts, g_overflow, g_energy,
     g_aoi_total) = grads
    zero = torch.zeros_like(g_aoi)
    g_send = g_aoi.new_empty(send_shape) if len(send_shape) == 3 else None
    totals = [None] * 5  # msg_bytes, snr_lin, tx_w, keep, headroom
    for t in range(T - 1, -1, -1):
        counted = t >= warmup
        kpi_grads = (g_delivered, g_delay, g_timeouts, g_overflow, g_energy) if counted else (zero,) * 5
        step_grads = (g_x, g_w, g_aoi + g_aoi_total if counted else g_aoi, *kpi_grads,
                      g_queued if t == T - 1 else zero)
        g_x, g_w, g_aoi, g_send_t, *g_inputs = _backward(tape[t], step_grads, k, needs)
        if free:
            tape[t] = None
        if counted:
            g_send_t = g_send_t + g_offered
        if len(send_shape) == 3:
            g_send[t] = g_send_t
        else:
            g_send = g_send_t if g_send is None else g_send.add_(g_send_t)
        totals = [g if s is None else (s if g is None else s.add_(g))
                  for s, g in zip(totals, g_inputs, strict=True)]
    return g_x, g_w, g_aoi, g_send, *totals


def _plain(t):
    """A normal tensor from one made under ``torch.inference_mode`` (None passes)."""
    return None if t is None else t.clone()


class QARollout(torch.autograd.Function):
    """``T`` QAD steps with constant inputs as one node: the rollout's KPI totals and final state.

    ``(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, headroom) -> (x_T, w_T, aoi_T,
    queued_msgs_T, *totals)`` with ``send`` ``[E, R]`` (the same at every step) or ``[T, E, R]``,
    and the totals over steps ``t >= warmup`` in ``kpi.COUNT_KEYS`` order: ``_forward`` and
    ``_backward`` step after step, one node instead of ``T`` step nodes and the ``7 T`` additions
    of the KPI totals, which autograd would record and replay one by one (``qa_step``: ``T = 1``).
    Both walks run under ``torch.inference_mode`` (no version counters or view tracking: ~5 %
    less per op); what leaves the node is copied out of it. Keeps each step's ~45 intermediates
    (``[A, E, R]`` and smaller) for the backward, which frees them step by step unless the graph
    is retained; once differentiable.
    """

    @staticmethod
    def forward(ctx, x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, headroom, T: int, warmup: int,
                tau: float, tau_n: float, cfg: CellConfig):
        ctx.k = k = _consts(tau, tau_n, cfg, x.shape[-1], x.dtype, x.device)
        with torch.inference_mode():
            x, w, aoi, queued, totals, ctx.tape = _rollout_forward(
                _to_ages(x), _to_ages(w), aoi, send, msg_bytes, snr_lin, tx_w, _to_ages(keep), headroom, T,
                warmup, k)
        ctx.T, ctx.warmup, ctx.send_shape = T, warmup, send.shape
        return (_plain(x).permute(1, 2, 0), _plain(w).permute(1, 2, 0), *map(_plain, (aoi, queued, *totals)))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_x, g_w, *grads):
        if ctx.tape is None:
            raise RuntimeError("QARollout: backward through the rollout a second time; its saved values were "
                               "freed (call backward with retain_graph=True the first time)")
        tape, free = ctx.tape, not _keep_graph()
        if free:  # as autograd frees its saved tensors
            ctx.tape = None
        with torch.inference_mode():
            g_x, g_w, g_aoi, g_send, g_bytes, g_snr, g_tx_w, g_keep, g_m = _rollout_backward(
                tape, (_to_ages(g_x), _to_ages(g_w), *grads), ctx.send_shape, ctx.T, ctx.warmup, free, ctx.k,
                ctx.needs_input_grad)
        g_x, g_w, g_keep = (None if g is None else _plain(g).permute(1, 2, 0) for g in (g_x, g_w, g_keep))
        return (g_x, g_w, *map(_plain, (g_aoi, g_send, g_bytes, g_snr, g_tx_w)), g_keep, _plain(g_m),
                None, None, None, None, None)


def qa_step(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, headroom, tau: float, tau_n: float,
            cfg: CellConfig) -> tuple:
    """One QAD step (``tau``, ``tau_n`` > 0) as ``QARollout`` of one step: ``model._step``'s outputs."""
    x, w, aoi, queued, _, delivered, delay_sum, timeouts, overflow, energy_j, _ = QARollout.apply(
        x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, headroom, 1, 0, tau, tau_n, cfg)
    return x, w, aoi, delivered, delay_sum, timeouts, overflow, energy_j, queued
