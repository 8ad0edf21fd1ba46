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
    se = \mathrm{smin}(\log_2(1 + H(n)\,snr / \mathrm{smax}(al, K)), se_{max}),\
    av = T_{step} - (1 - \mathrm{smin}(m_0, 1))\,T_{SR},\ srv = al\,se\,\kappa\,av,\\
    z_a = (\log srv - \log cum_a)/\tau,\ c = \sigma(z),\ q = cum\,c^\tau,\
    frac = (1 - c)^\tau,\ rest_a = x_a - q_a + q_{a+1},\\
    tx = q_0 / \mathrm{smax}(S\,\mathrm{smin}(\log_2(1 + snr / S), se_{max})\,\kappa,\ al\,se\,\kappa)\
    \text{(on air for the bytes sent, at the faster of the band's rate and its own)};\\
    \text{a calibrated cell: } tx \leftarrow T_{step}\,\mathrm{smin}(tx\,f_{air}\,
    \mathrm{smax}(n, 1)^{\alpha} / T_{step}, 1)\ \text{(\_crowd\_on\_air)}.

With mean-field sends' backlog closure (``CellConfig.mf_backlog_closure``, ``relax.backlog_closure``)
a robot's own count replaces the cell's: :math:`b = \max(1 - e^{-\sum_a w_a}, b_{min})`,
:math:`n_r = 1 + \sum_{k \ne r} b_k` (``[E, R]``, and so ``sh``, ``H(n)`` and the crowd per robot),
and :math:`srv = b\,al\,se\,\kappa\,av`.

The AoI is written as ``1 + sum_{a < A-1} P_a + (aoi + 1 - A) P_{A-1}`` with
``P = cumprod(1 - w c)`` (the same value as ``model._step``'s sum over the freshest
delivery); the cumprod's adjoint is computed without dividing by its factors, which are
exactly 0 when a whole message is delivered.
"""

from __future__ import annotations

import functools
import math
import typing

import torch

from isaac_net.core._kernels import Kernel, own_storage
from isaac_net.core.config import CellConfig
from isaac_net.core.diff import relax
from isaac_net.core.diff._l1_loop import LN2
from isaac_net.core.diff._outputs import RolloutEnd, StepArgs, StepOut, split_rollout
from isaac_net.core.diff.relax import Temperature, harmonic, harmonic_deriv, smax1_vjp, smin1_vjp
from isaac_net.core.kpi import Totals

# The step's scalars besides the temperature's, in the order of ``_Consts.vector``.
_SCALARS = ("one", "neg_inf", "inv_tau_n", "buffer_limit", "subbands", "se_max", "inv_se_max", "kappa",
            "sr_full_s", "step_s", "inv_step_s", "inv_ln2", "one_minus_A", "air_factor", "air_crowd_exp",
            "inv_grant")


def _branches(cfg: CellConfig) -> tuple[bool, bool]:
    """The step's two static branches for a cell: ``(sr_fills_step, closure)`` (the scheduling request
    fills the step; mean-field sends' backlog closure), which also key its compiled kernel."""
    return cfg.qa_sr_slots == cfg.num_slots, cfg.mf_backlog_closure


class _Consts:
    """The step's scalars as 0-dim tensors of the state's dtype and device: an op with a Python
    number wraps and converts it at every call (~2 us each on these small tensors). ``vector``
    holds them all, the temperature's first (a compiled kernel's one constant input, which
    :meth:`of_vector` turns back into these)."""

    def __init__(self, tau: float, tau_n: float, cfg: CellConfig, A: int, dtype: torch.dtype,
                 device: torch.device):
        values = dict(
            one=1.0, neg_inf=-math.inf, inv_tau_n=1.0 / tau_n,
            buffer_limit=cfg.buffer_msgs - 0.5, subbands=float(cfg.num_subbands), se_max=cfg.se_max,
            inv_se_max=1.0 / cfg.se_max, kappa=cfg.bytes_per_se_s, sr_full_s=cfg.qa_sr_slots * cfg.slot_s,
            step_s=cfg.step_s, inv_step_s=1.0 / cfg.step_s, inv_ln2=1.0 / LN2,
            one_minus_A=1.0 - A, air_factor=cfg.air_factor, air_crowd_exp=cfg.air_crowd_exp,
            inv_grant=1.0 / cfg.qa_min_grant_subbands,
        )
        temp = Temperature.of(tau, dtype, device)
        vector = torch.cat([torch.stack(temp), torch.tensor([values[n] for n in _SCALARS], dtype=dtype,
                                                            device=device)])
        ages = torch.arange(A, dtype=dtype, device=device).reshape(A, 1, 1).clone()
        self._set(vector, ages, *_branches(cfg))
        self.air = not cfg.air_is_plain  # the time on air's crowd factor and cap (_crowd_on_air)

    def _set(self, vector: torch.Tensor, ages: torch.Tensor, sr_fills_step: bool, closure: bool) -> None:
        # tau, neg_tau, inv_tau, neg_inv_tau, tiny, zero: shared with the relaxations' value-derivative pairs
        n_temp = len(Temperature._fields)
        self.temp = Temperature._make(vector[i] for i in range(n_temp))
        for name, value in zip((*Temperature._fields, *_SCALARS), vector.unbind(), strict=True):
            setattr(self, name, value)
        self.vector, self.ages, self.sr_fills_step, self.closure = vector, ages, sr_fills_step, closure

    @classmethod
    def of_vector(cls, vector: torch.Tensor, ages: torch.Tensor, sr_fills_step: bool,
                  closure: bool) -> "_Consts":
        """The constants from ``vector`` (``[len(Temperature._fields) + len(_SCALARS)]``) and ``ages``
        (``[A, 1, 1]``): inside a compiled kernel, where they are its inputs."""
        k = cls.__new__(cls)
        k._set(vector, ages, sr_fills_step, closure)
        k.air = False  # a kernel's step is the plain one; _crowd_on_air runs after it
        return k


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


def _to_robots(t: torch.Tensor | None) -> torch.Tensor | None:
    """``[A, E, R]`` -> an ``[E, R, A]`` view (None passes): the inverse of ``_to_ages``."""
    return None if t is None else t.permute(1, 2, 0)


def _to_ages(t: torch.Tensor) -> torch.Tensor:
    """``[E, R, A]`` -> ``[A, E, R]``, contiguous.

    The steps work age-major: a per-robot ``[E, R]`` factor then broadcasts over contiguous age
    rows and a sum over ages adds whole rows, about 2x cheaper per op at E = 64 than over a last
    dimension of 10. The state they hand back is an ``[E, R, A]`` view of age-major storage, so
    the next step or rollout takes it without a copy.
    """
    return t.permute(2, 0, 1).contiguous()


class _Tape(typing.NamedTuple):
    """What ``_backward`` reads of one step of ``_forward``: the step's inputs but ``x``, ``w``, ``aoi``
    and its intermediates, named as there (``[A, E, R]`` per message, ``[E, R]`` per robot, ``[E, 1]``
    per cell)."""

    send: torch.Tensor
    msg_bytes: torch.Tensor
    snr_lin: torch.Tensor
    tx_w: torch.Tensor
    keep: torch.Tensor
    m: torch.Tensor
    admit: torch.Tensor
    w0: torch.Tensor
    w1: torch.Tensor
    busy: torch.Tensor
    d_busy: torch.Tensor
    sn: torch.Tensor
    d_sn: torch.Tensor
    share: torch.Tensor
    ratio: torch.Tensor
    sr: torch.Tensor
    d_sr: torch.Tensor
    alloc: torch.Tensor
    n: torch.Tensor
    gain: torch.Tensor
    sa: torch.Tensor
    d_sa: torch.Tensor
    snr_g: torch.Tensor
    se: torch.Tensor
    d_v: torch.Tensor
    rate: torch.Tensor
    d_e: torch.Tensor
    avail: torch.Tensor
    served: torch.Tensor
    served_c: torch.Tensor
    cum: torch.Tensor
    cum_c: torch.Tensor
    c: torch.Tensor
    ct: torch.Tensor
    q: torch.Tensor
    frac: torch.Tensor
    finish_s: torch.Tensor
    fin: torch.Tensor
    se_f: torch.Tensor
    d_vf: torch.Tensor
    sm: torch.Tensor
    d_sm: torch.Tensor
    tx_s: torch.Tensor
    done: torch.Tensor
    w2: torch.Tensor
    none_yet: torch.Tensor
    aoi_coef: torch.Tensor
    rest: torch.Tensor
    # A calibrated time on air (_crowd_on_air; None in a plain cell): the crowd factor
    # air_factor sn^air_crowd_exp [E, 1], the cap's derivative [E, R] and the time on air [E, R]
    # (tx_s stays the band-rate time).
    crowd: torch.Tensor | None = None
    d_cap: torch.Tensor | None = None
    tx_air: torch.Tensor | None = None


def _forward(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m, k: _Consts) -> tuple[StepOut, _Tape]:
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
    if k.closure:  # mean-field sends' backlog closure: busy = P(Poisson(sum_a w1) > 0), n [E, R]
        busy, n, d_busy = relax.backlog_closure(w1.sum(0))
        e, d_e = smin1_vjp(m0, k.temp)
    else:  # busy = smin(sum_a w1, 1) and the was-empty gate's smin(m0, 1) in one pass; n [E, 1]
        (busy, e), (d_busy, d_e) = smin1_vjp(torch.stack([w1.sum(0), m0]), k.temp)
        n = busy.sum(-1, keepdim=True)
    sn, d_sn = smax1_vjp(n, k.temp)
    share = k.subbands / sn
    ratio = share / m
    sr, d_sr = smin1_vjp(ratio, k.temp, clamp=False)  # share / m >= 1 / (smax(n, 1) m) > 0
    alloc = m * sr
    gain = harmonic(n)  # the PF gain H(n) (its series where digamma(n + 1) + gamma cancels, at tiny n)
    # the subbands the power is spread over, smax(a, K) = K smax(a / K, 1) = a / smin(a / K, 1) (alloc >=
    # smin(share / m, 1) > 0, no clamp), and its derivative (1 - (a / K) smin'(a / K, 1) / smin(a / K, 1))
    # / smin(a / K, 1); K = 1 (QA's rule) multiplies by 1, exactly
    a_k = alloc * k.inv_grant
    s1, d_s1 = smin1_vjp(a_k, k.temp, clamp=False)
    sa = alloc / s1
    d_sa = (k.one - a_k * d_s1 / s1).div_(s1)
    snr_g = gain * snr_lin / sa
    y = torch.log2(snr_g + k.one)
    v, d_v = smin1_vjp(y * k.inv_se_max, k.temp)
    se = v * k.se_max
    # model._service_qa sets a rate of 0 to 1; at tau > 0 it is not 0: n >= R smin(0, 1) > 0 keeps
    # the PF gain, and so se, above 0 (in float32 the rate is >= ~1e-26 B/s)
    rate = alloc * se * k.kappa
    sr_s = (k.one - e).mul_(k.sr_full_s)
    avail = k.step_s - sr_s
    # with the closure a robot is served busy rate avail in expectation (model._service_qa)
    served = rate * avail * busy if k.closure else rate * avail
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
    # on air for the bytes sent (q_0 = smin(cum_0, served)) at smax(the whole band's rate, its own rate)
    # (model.on_air_s): smax(rb, rate) = rb smax(rate / rb, 1)
    vf, d_vf = smin1_vjp(torch.log1p(snr_lin / k.subbands) * (k.inv_ln2 * k.inv_se_max), k.temp)
    se_f = vf * k.se_max
    rb = se_f * k.subbands * k.kappa
    sm, d_sm = smax1_vjp(rate / rb, k.temp, clamp=False)  # rate > 0 at tau > 0 (see above)
    tx_s = q[0] / (rb * sm)

    outputs, done, w2, none_yet, aoi_coef = _kpis_and_shift(w1, c, fin, rest, aoi, keep, tx_w, tx_s,
                                                            msg_bytes, overflow, k)
    return outputs, _Tape(send=send, msg_bytes=msg_bytes, snr_lin=snr_lin, tx_w=tx_w, keep=keep, m=m,
                          admit=admit, w0=w0, w1=w1, busy=busy, d_busy=d_busy, sn=sn, d_sn=d_sn, share=share,
                          ratio=ratio, sr=sr, d_sr=d_sr, alloc=alloc, n=n, gain=gain, sa=sa, d_sa=d_sa,
                          snr_g=snr_g, se=se, d_v=d_v, rate=rate, d_e=d_e, avail=avail, served=served,
                          served_c=served_c, cum=cum, cum_c=cum_c, c=c, ct=ct, q=q, frac=frac,
                          finish_s=finish_s, fin=fin, se_f=se_f, d_vf=d_vf, sm=sm, d_sm=d_sm, tx_s=tx_s,
                          done=done, w2=w2,
                          none_yet=none_yet, aoi_coef=aoi_coef, rest=rest)


def _kpis_and_shift(w1, c, fin, rest, aoi, keep, tx_w, tx_s, msg_bytes, overflow, k: _Consts) -> tuple:
    """3. (of ``_forward``) KPIs, AoI, ageing and the shift: ``(outputs, done, w2, none_yet, aoi_coef)``,
    the step's outputs and what the tape keeps of this part."""
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
    throughput = delivered * msg_bytes * k.inv_step_s
    outputs = StepOut(x=x_next, w=w_next, aoi=aoi_next, delivered=delivered, delay_sum=delay_sum,
                      timeouts=timeouts, overflow=overflow, energy_j=energy_j,
                      throughput_bytes_per_s=throughput, queued_msgs=w_next.sum(0))
    return outputs, done, w2, none_yet, aoi_coef


# The inputs a step's tape holds; the rest of it ``_forward`` computes (the time on air's crowd
# factor: _crowd_on_air, after it).
_TAPE_INPUTS = ("send", "msg_bytes", "snr_lin", "tx_w", "keep", "m")
_TAPE_AIR = ("crowd", "d_cap", "tx_air")
_TAPE_OWN = tuple(f for f in _Tape._fields if f not in _TAPE_INPUTS + _TAPE_AIR)


def _crowd_on_air(out: StepOut, s: _Tape, k: _Consts) -> tuple[StepOut, _Tape]:
    """The calibrated time on air of a step ``_forward`` ran (``k.air``): the band-rate time ``tx_s``
    times ``crowd = air_factor smax(n, 1)^air_crowd_exp``, ``step_s smin(. / step_s, 1)``
    (``model.on_air_s``), and the energy from it: ``(out, tape)`` with the energy and the tape's
    ``crowd``, ``d_cap``, ``tx_air``. A step apart from the kernel: the plain step stays one kernel."""
    crowd = k.air_factor * s.sn ** k.air_crowd_exp
    v, d_cap = smin1_vjp(s.tx_s * crowd * k.inv_step_s, k.temp)
    tx_air = v * k.step_s
    return out._replace(energy_j=s.tx_w * tx_air), s._replace(crowd=crowd, d_cap=d_cap, tx_air=tx_air)


def _forward_flat(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m, consts, ages,
                  sr_fills_step: bool, closure: bool) -> tuple:
    """``_forward`` on tensors only (``consts``, ``ages``: ``_Consts.vector`` and ``.ages``): the
    step's outputs, then the tape's own tensors (``_TAPE_OWN``)."""
    out, tape = _forward(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m,
                         _Consts.of_vector(consts, ages, sr_fills_step, closure))
    return (*out, *(getattr(tape, f) for f in _TAPE_OWN))


# A kernel's function for each of _forward's two static branches (a kernel has no branch on values).
def _forward_kernel(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m, consts, ages) -> tuple:
    """``_forward_flat`` where the scheduling request leaves part of the step."""
    return _forward_flat(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m, consts, ages, False, False)


def _forward_kernel_sr_fills_step(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m, consts,
                                  ages) -> tuple:
    """``_forward_flat`` where the scheduling request fills the step."""
    return _forward_flat(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m, consts, ages, True, False)


def _forward_kernel_closure(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m, consts, ages) -> tuple:
    """``_forward_flat`` with the backlog closure, where the scheduling request leaves part of the step."""
    return _forward_flat(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m, consts, ages, False, True)


def _forward_kernel_closure_sr_fills_step(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m, consts,
                                          ages) -> tuple:
    """``_forward_flat`` with the backlog closure, where the scheduling request fills the step."""
    return _forward_flat(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m, consts, ages, True, True)


# compile=True's QAD forward on the CPU, by ``(sr_fills_step, closure)`` (``forward_kernel``). E and R are
# the last two dimensions of [A, E, R] and [E, R] ([E, 1]: R's size 1 static): one compile serves every
# E and R (A is static).
FORWARD_KERNELS = {(False, False): Kernel(_forward_kernel, dim=(-2, -1)),
                   (True, False): Kernel(_forward_kernel_sr_fills_step, dim=(-2, -1)),
                   (False, True): Kernel(_forward_kernel_closure, dim=(-2, -1)),
                   (True, True): Kernel(_forward_kernel_closure_sr_fills_step, dim=(-2, -1))}


def forward_kernel(cfg: CellConfig) -> Kernel:
    """The compiled forward kernel (``FORWARD_KERNELS``) a QAD cell ``cfg`` runs."""
    return FORWARD_KERNELS[_branches(cfg)]


def _own_storage(tensors: tuple) -> list:
    """The tensors as a kernel takes them (``own_storage``), none twice (a repeat is copied)."""
    out, seen = [], set()
    for t in tensors:
        t = own_storage(t)
        if t.data_ptr() in seen:
            t = t.clone()
        seen.add(t.data_ptr())
        out.append(t)
    return out


def _compiled_forward(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m,
                      k: _Consts) -> tuple[StepOut, _Tape]:
    """``_forward`` (the same arguments and results) through its compiled kernel."""
    kernel = FORWARD_KERNELS[k.sr_fills_step, k.closure]
    flat = kernel(*_own_storage((x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, m, k.vector, k.ages)))
    n = len(StepOut._fields)
    tape = _Tape(**dict(zip(_TAPE_INPUTS, (send, msg_bytes, snr_lin, tx_w, keep, m), strict=True)),
                 **dict(zip(_TAPE_OWN, flat[n:], strict=True)))
    return StepOut._make(flat[:n]), tape


def _backward(s: _Tape, grads: StepOut, k: _Consts, needs: StepArgs) -> StepArgs:
    """Adjoint of ``_forward`` (``[A, E, R]`` as there): the gradients of the step's inputs from those
    of its outputs ``grads``; None where ``needs`` (bools) says an input needs none (``keep``, ``tx_w``,
    ``snr_lin``, ``msg_bytes``, ``headroom``). Its steps walk ``_forward``'s back: 3. the shift,
    ageing and AoI, the KPIs; 2. the service; 1. the capture."""
    # throughput = delivered B / T_step: into delivered's gradient (and B's, in the capture's)
    g_tput = grads.throughput_bytes_per_s * k.inv_step_s
    g_delivered = grads.delivered + g_tput * s.msg_bytes
    g_w2, g_keep, g_rest, g_aoi = _adjoint_shift(s, grads, k, needs)
    g_f = _adjoint_none_yet(s, grads.aoi, k)
    g_w1, g_c, g_tx_w, g_q0, g_rate_e, g_snr_f, g_frac, g_avail, g_sr_s, g_sn_air = _adjoint_kpis(
        s, grads, g_delivered, g_w2, g_f, k, needs)
    g_x1, g_served = _adjoint_completion(s, g_rest, g_c, g_frac, g_q0, k)
    g_m0, g_snr, g_m = _adjoint_rate(s, g_served, g_rate_e, g_avail, g_sr_s, g_w1, g_sn_air, k, needs)
    if g_snr is not None:
        g_snr += g_snr_f
    g_x, g_w, g_send, g_bytes = _adjoint_capture(s, g_w1, g_x1, g_m0, grads.overflow, g_tput, k, needs)
    return StepArgs(x=g_x, w=g_w, aoi=g_aoi, send=g_send, msg_bytes=g_bytes, snr_lin=g_snr, tx_w=g_tx_w,
                    keep=g_keep, headroom=g_m)


def _adjoint_shift(s: _Tape, grads: StepOut, k: _Consts, needs: StepArgs) -> tuple:
    """3. Shift, ageing, timeouts: w_next = shift(w2 keep), x_next = shift(rest keep), queued = sum w_next,
    timeouts = sum(w2 - w2 keep); and aoi_next's direct term (the last age's). ``(g_w2, g_keep, g_rest,
    g_aoi)`` (``g_keep`` None unless needed)."""
    g_timeouts = grads.timeouts
    g_kept = _shift_younger(grads.w + grads.queued_msgs).sub_(g_timeouts)
    g_xk = _shift_younger(grads.x)
    g_w2 = g_kept * s.keep + g_timeouts
    g_keep = g_kept * s.w2 + g_xk * s.rest if needs.keep else None
    g_rest = g_xk * s.keep
    g_aoi = grads.aoi * s.none_yet[-1]
    return g_w2, g_keep, g_rest, g_aoi


def _adjoint_none_yet(s: _Tape, g_aoi_next: torch.Tensor, k: _Consts) -> torch.Tensor:
    """The gradient of the factors ``f = 1 - done`` of ``none_yet = cumprod(f)`` from aoi_next's.

    aoi_next = 1 + sum_{a<A-1} P_a + coef P_{A-1}, P = cumprod(f), f = 1 - done. The adjoint at
    factor i is sum_{j >= i} G_j prod_{k <= j, k != i} f_k. A factor is exactly 0 when a whole
    message is delivered, so no division by it: with P' the cumprod of f with its zeros set to 1
    and Z_j the number of zeros among f_0..f_j, the product is P'_j / f_i where Z_j = 0, P'_j where
    f_i is the one zero (Z_j = 1), and 0 otherwise.
    On the CPU, where reading a flag is free, the common case without zeros takes P' = P, Z = 0."""
    f = k.one - s.done
    zero = f == k.zero
    if f.device.type == "cpu" and not bool(zero.any()):
        gp = s.none_yet * g_aoi_next  # G_j P_j
        gp[-1] *= s.aoi_coef
        return _rev_cumsum(gp).div_(f)
    f_safe = torch.where(zero, k.one, f)
    num_zeros = zero.cumsum(0)
    gp = torch.cumprod(f_safe, 0).mul_(g_aoi_next)  # G_j P'_j
    gp[-1] *= s.aoi_coef
    g_f = _rev_cumsum(torch.where(num_zeros == 0, gp, k.zero)).div_(f_safe)
    g_f += torch.where(zero, _rev_cumsum(torch.where(num_zeros == 1, gp, k.zero)), k.zero)
    return g_f


def _adjoint_kpis(s: _Tape, grads: StepOut, g_delivered, g_w2, g_f, k: _Consts, needs: StepArgs) -> tuple:
    """3. The deliveries, delay and energy: ``(g_w1, g_c, g_tx_w, g_q0, g_rate_e, g_snr_f, g_frac,
    g_avail, g_sr_s, g_sn_air)``, the service's parts so far (``g_tx_w`` and the energy's ``g_snr_f`` None
    unless needed; ``g_sn_air``, the time on air's part of ``smax(n, 1)``'s, None in a plain cell)."""
    g_delay, g_energy = grads.delay_sum, grads.energy_j
    # w2 = w1 - done; delay_sum = sum(done ages + w1 fin); delivered = sum(done); done = w1 c.
    g_done = (g_delay * k.ages).add_(g_delivered).sub_(g_w2).sub_(g_f)
    g_w1 = (g_delay * s.fin).add_(g_w2).add_(g_done * s.c)
    g_fin = g_delay * s.w1
    g_c = g_done * s.w1
    # energy = tx_w tx_s; tx_s = q_0 / d, d = rb sm(u), u = rate / rb, sm = smax(., 1); rb = se_f S kappa;
    # se_f = se_max smin(y_f / se_max, 1), y_f = log2(1 + snr / S).
    g_tx = g_energy * s.tx_w
    g_sn_air = None
    if s.crowd is None:
        g_tx_w = g_energy * s.tx_s if needs.tx_w else None
    else:  # tx_air = step smin(tx_s crowd / step, 1); crowd = air_factor sn^air_crowd_exp
        g_tx_w = g_energy * s.tx_air if needs.tx_w else None
        g_cap = g_tx * s.d_cap
        g_sn_air = _to_cell(g_cap * s.tx_s, k) * (k.air_crowd_exp * s.crowd / s.sn)
        g_tx = g_cap * s.crowd
    rb = s.se_f * k.subbands * k.kappa
    u = s.rate / rb
    d = rb * s.sm
    g_q0 = g_tx / d
    g_d = -g_tx * s.tx_s / d
    g_rate_e = g_d * s.d_sm  # dd / drate = sm'(u)
    g_snr_f = None
    if needs.snr_lin:  # dd / drb = sm - u sm'(u)
        g_rb = g_d * (s.sm - u * s.d_sm)
        g_snr_f = g_rb * (k.subbands * k.kappa) * s.d_vf * k.inv_ln2 / (s.snr_lin + k.subbands)
    # fin = c finish / T_step; finish = sr_s + frac avail.
    g_c += g_fin * s.finish_s * k.inv_step_s
    g_finish = g_fin * s.c * k.inv_step_s
    g_sr_s = g_finish.sum(0)
    g_frac = g_finish * s.avail
    g_avail = (g_finish * s.frac).sum(0)
    return g_w1, g_c, g_tx_w, g_q0, g_rate_e, g_snr_f, g_frac, g_avail, g_sr_s, g_sn_air


def _adjoint_completion(s: _Tape, g_rest, g_c, g_frac, g_q0, k: _Consts) -> tuple:
    """2. What each age completes, from the rest, the completion, the fraction left and the bytes sent
    ``q_0`` (the energy's): ``(g_x1, g_served)``."""
    # rest_a = x_a - q_a + q_{a+1}
    g_x1 = g_rest
    g_q = -g_rest
    g_q[1:] += g_rest[:-1]
    g_q[0] += g_q0
    # frac = exp(tau d), d = log_c - z = log(1 - c); q = cum c^tau; c = exp(log_c); log_c = logsigmoid(z).
    g_d = g_frac * s.frac * k.tau
    g_log_c = (g_q * s.q * k.tau).add_(g_d).add_(g_c * s.c)
    g_cum = g_q * s.ct
    # d logsigmoid(z) / dz = 1 - c; where nothing is queued c = 1, where nothing is served g_log_c = 0
    g_z = (k.one - s.c).mul_(g_log_c).sub_(g_d)
    # z = (log served - log cum) / tau
    g_cum -= torch.where(s.cum > k.tiny, g_z * k.inv_tau / s.cum_c, k.zero)
    g_served = torch.where(s.served > k.tiny, g_z.sum(0) * k.inv_tau / s.served_c, k.zero)
    g_x1 = g_x1 + g_cum.cumsum(0)  # cum_a = sum_{k >= a} x_k
    return g_x1, g_served


def _to_cell(g: torch.Tensor, k: _Consts) -> torch.Tensor:
    """The gradient ``g`` ``[E, R]`` of a quantity per robot in that of the cell's own (``n``, ``smax(n, 1)``
    and the share, ``[E, 1]``) it broadcasts from; with the backlog closure they are a robot's own,
    ``[E, R]``, and ``g`` is theirs."""
    return g if k.closure else g.sum(-1, keepdim=True)


def _adjoint_rate(s: _Tape, g_served, g_rate_e, g_avail, g_sr_s, g_w1, g_sn_air, k: _Consts,
                  needs: StepArgs) -> tuple:
    """2. The rate: served = rate avail (and the energy's ``g_rate_e``, its gradient in the rate) down
    to the allocation, the PF gain and the busy robots (and the time on air's ``g_sn_air`` in
    ``smax(n, 1)``, or None). Adds into ``g_avail`` and ``g_w1`` (in place); ``(g_m0, g_snr, g_m)``
    (``g_snr``, ``g_m`` None unless needed)."""
    # served = rate avail (busy rate avail with the closure); avail = T_step - sr_s; sr_s = (1 - e) T_SR,
    # e = smin(m0, 1).
    g_sv = g_served * s.busy if k.closure else g_served  # d served / d (rate avail)
    g_avail += g_sv * s.rate
    g_m0 = (g_avail - g_sr_s).mul_(k.sr_full_s).mul_(s.d_e)
    # rate = alloc se kappa.
    g_rate0 = (g_sv * s.avail + g_rate_e) * k.kappa
    g_alloc = g_rate0 * s.se
    g_se = g_rate0 * s.alloc
    # se = se_max smin(y / se_max, 1); y = log2(1 + snr_g); snr_g = gain snr / sa; sa = smax(alloc, K).
    g_sg = g_se * s.d_v * k.inv_ln2 / (s.snr_g + k.one)
    g_snr = g_sg * s.gain / s.sa if needs.snr_lin else None
    g_gain = g_sg * s.snr_lin / s.sa
    g_alloc -= g_sg * s.snr_g / s.sa * s.d_sa
    # alloc = m sr, sr = smin(ratio, 1), ratio = share / m; share = S / sn, sn = smax(n, 1); gain = H(n).
    g_ratio = g_alloc * s.m * s.d_sr
    g_m = g_alloc * s.sr - g_ratio * s.ratio / s.m if needs.headroom else None
    g_share = _to_cell(g_ratio / s.m, k)
    g_sn = -g_share * s.share / s.sn if g_sn_air is None else g_sn_air - g_share * s.share / s.sn
    g_n = _to_cell(g_gain, k) * harmonic_deriv(s.n) + g_sn * s.d_sn
    if k.closure:  # n_j = 1 + sum_k busy_k - busy_j, and served = busy rate avail
        g_busy = g_n.sum(-1, keepdim=True) - g_n + g_served * s.rate * s.avail
    else:  # n = sum_r busy; busy = smin(sum_a w1, 1)
        g_busy = g_n
    g_w1 += g_busy * s.d_busy
    return g_m0, g_snr, g_m


def _adjoint_capture(s: _Tape, g_w1, g_x1, g_m0, g_overflow, g_tput, k: _Consts, needs: StepArgs) -> tuple:
    """1. Capture: w1 = w with w1_0 = w0, x1 = x with x1_0 = w0 B; overflow = send - w0; w0 = send admit
    (and throughput's B). ``(g_x, g_w, g_send, g_bytes)`` (``g_bytes`` None unless needed)."""
    g_w0 = g_w1[0] + g_x1[0] * s.msg_bytes - g_overflow
    g_bytes = g_x1[0] * s.w0 + g_tput * s.done.sum(0) if needs.msg_bytes else None
    g_send = g_overflow + g_w0 * s.admit
    g_m0 -= g_w0 * s.send * s.admit * (k.one - s.admit) * k.inv_tau_n
    g_x = g_x1  # x_0 is overwritten by the capture
    g_x[0] = 0.0
    g_w = g_w1 + g_m0
    g_w[0] = g_m0
    return g_x, g_w, g_send, g_bytes


def _rollout_forward(a: StepArgs, T: int, warmup: int, k: _Consts,
                     forward=_forward) -> tuple[RolloutEnd, Totals, list]:
    """``T`` steps of ``forward`` (``_forward`` or ``_compiled_forward``) from ``a`` (``[A, E, R]``
    ``x``, ``w``, ``keep``; ``send`` ``[E, R]`` or ``[T, E, R]``): the state after them, the KPI
    totals over steps ``t >= warmup`` (``offered`` includes the mass queued at the start of step
    ``warmup``, as ``kpi.KpiAccumulator``) and each step's ``_Tape``."""
    tape, totals = [], None
    x, w, aoi = a.x, a.w, a.aoi
    queued_start = w.sum(0) if warmup == 0 else None  # the queue at the start of step warmup
    for t in range(T):
        send_t = a.send[t] if a.send.dim() == 3 else a.send
        out, saved = forward(x, w, aoi, send_t, a.msg_bytes, a.snr_lin, a.tx_w, a.keep, a.headroom, k)
        if k.air:
            out, saved = _crowd_on_air(out, saved, k)
        x, w, aoi = out.x, out.w, out.aoi
        tape.append(saved)
        if t == warmup - 1:
            queued_start = out.queued_msgs
        if t >= warmup:
            step = Totals(offered=send_t + queued_start if t == warmup else send_t, delivered=out.delivered,
                          delay_sum=out.delay_sum, timeouts=out.timeouts, overflow=out.overflow, aoi=out.aoi,
                          energy_j=out.energy_j, throughput_bytes_per_s=out.throughput_bytes_per_s)
            if totals is None:
                totals = Totals._make(v.clone() for v in step)
            else:
                for total, v in zip(totals, step, strict=True):
                    total.add_(v)
    return RolloutEnd(x, w, aoi, out.queued_msgs), totals, tape


def _rollout_backward(tape, g_end: RolloutEnd, g_tot: Totals, send_shape, T: int, warmup: int, free: bool,
                      k: _Consts, needs: StepArgs) -> StepArgs:
    """``_backward`` over the steps in reverse, from the gradients of ``_rollout_forward``'s state and
    totals: those of its inputs ``a`` (``[A, E, R]`` ``x``, ``w``, ``keep``); ``free``: drop each step's
    saved values once used."""
    g_x, g_w, g_aoi = g_end.x, g_end.w, g_end.aoi
    zero = torch.zeros_like(g_aoi)
    g_send = g_aoi.new_empty(send_shape) if len(send_shape) == 3 else None
    sums = [None] * 5  # the inputs that are the same at every step: msg_bytes, snr_lin, tx_w, keep, headroom
    for t in range(T - 1, -1, -1):
        counted = t >= warmup
        kpi = g_tot if counted else Totals._make([zero] * len(Totals._fields))
        # offered holds the queue at the end of step warmup - 1 (the start of the window)
        g_queued_t = g_end.queued_msgs if t == T - 1 else (g_tot.offered if t == warmup - 1 else zero)
        step_grads = StepOut(x=g_x, w=g_w, aoi=g_aoi + g_tot.aoi if counted else g_aoi,
                             delivered=kpi.delivered, delay_sum=kpi.delay_sum, timeouts=kpi.timeouts,
                             overflow=kpi.overflow, energy_j=kpi.energy_j,
                             throughput_bytes_per_s=kpi.throughput_bytes_per_s, queued_msgs=g_queued_t)
        g = _backward(tape[t], step_grads, k, needs)
        g_x, g_w, g_aoi = g.x, g.w, g.aoi
        if free:
            tape[t] = None
        g_send_t = g.send + g_tot.offered if counted else g.send
        if len(send_shape) == 3:
            g_send[t] = g_send_t
        else:
            g_send = g_send_t if g_send is None else g_send.add_(g_send_t)
        sums = [v if s is None else (s if v is None else s.add_(v))
                for s, v in zip(sums, (g.msg_bytes, g.snr_lin, g.tx_w, g.keep, g.headroom), strict=True)]
    if warmup == 0:  # offered holds the starting queue, sum_a w_a
        g_w = g_w + g_tot.offered
    g_bytes, g_snr, g_tx_w, g_keep, g_m = sums
    return StepArgs(x=g_x, w=g_w, aoi=g_aoi, send=g_send, msg_bytes=g_bytes, snr_lin=g_snr, tx_w=g_tx_w,
                    keep=g_keep, headroom=g_m)


def _plain(t):
    """A normal tensor from one made under ``torch.inference_mode`` (None passes)."""
    return None if t is None else t.clone()


class QARollout(torch.autograd.Function):
    """``T`` QAD steps with constant inputs as one node: the rollout's KPI totals and final state.

    ``(*StepArgs) -> (*RolloutEnd, *kpi.Totals)`` (:func:`~._outputs.split_rollout` names them) with
    ``send`` ``[E, R]`` (the same at every step) or ``[T, E, R]``, and the totals over steps
    ``t >= warmup``: ``_forward`` and
    ``_backward`` step after step, one node instead of ``T`` step nodes and the ``8 T`` additions
    of the KPI totals, which autograd would record and replay one by one (``qa_step``: ``T = 1``).
    Both walks run under ``torch.inference_mode`` (no version counters or view tracking: ~5 %
    less per op); what leaves the node is copied out of it. Keeps each step's ~45 intermediates
    (``[A, E, R]`` and smaller) for the backward, which frees them step by step unless the graph
    is retained; once differentiable. The caller's tensors that the tape holds are saved with
    ``save_for_backward`` too, so that a backward after an in-place change of one raises, as autograd's.

    With ``compiled`` the forward runs ``_compiled_forward`` (``FORWARD_KERNELS``: one inductor kernel a
    step, compiled once for every E), outside ``inference_mode``; the backward is the same.
    """

    @staticmethod
    def forward(ctx, x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, headroom, T: int, warmup: int,
                tau: float, tau_n: float, cfg: CellConfig, compiled: bool = False):
        ctx.k = k = _consts(tau, tau_n, cfg, x.shape[-1], x.dtype, x.device)
        ctx.save_for_backward(send, msg_bytes, snr_lin, tx_w, keep, headroom)
        with torch.no_grad() if compiled else torch.inference_mode():
            a = StepArgs(x=_to_ages(x), w=_to_ages(w), aoi=aoi, send=send, msg_bytes=msg_bytes,
                         snr_lin=snr_lin, tx_w=tx_w, keep=_to_ages(keep), headroom=headroom)
            forward = _compiled_forward if compiled else _forward
            end, totals, ctx.tape = _rollout_forward(a, T, warmup, k, forward)
        ctx.T, ctx.warmup, ctx.send_shape = T, warmup, send.shape
        end = RolloutEnd._make(map(_plain, end))
        return (*end._replace(x=_to_robots(end.x), w=_to_robots(end.w)), *map(_plain, totals))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        if ctx.tape is None:
            raise RuntimeError("QARollout: backward through the rollout a second time; its saved values were "
                               "freed (call backward with retain_graph=True the first time)")
        ctx.saved_tensors  # noqa: B018 (raises if the caller changed an input in place since the forward)
        tape, free = ctx.tape, not _keep_graph()
        if free:  # as autograd frees its saved tensors
            ctx.tape = None
        g_end, g_tot = split_rollout(grads)
        needs = StepArgs._make(ctx.needs_input_grad[:len(StepArgs._fields)])
        with torch.inference_mode():
            g_end = g_end._replace(x=_to_ages(g_end.x), w=_to_ages(g_end.w))
            g = _rollout_backward(tape, g_end, g_tot, ctx.send_shape, ctx.T, ctx.warmup, free, ctx.k, needs)
        g = StepArgs._make(map(_plain, g))
        g = g._replace(x=_to_robots(g.x), w=_to_robots(g.w), keep=_to_robots(g.keep))
        return (*g, None, None, None, None, None, None)  # T, warmup, tau, tau_n, cfg, compiled


def qa_step(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, headroom, tau: float, tau_n: float,
            cfg: CellConfig, compiled: bool = False) -> StepOut:
    """One QAD step (``tau``, ``tau_n`` > 0) as ``QARollout`` of one step: ``model._step``'s outputs
    (``compiled``: its forward through the compiled kernel)."""
    end, tot = split_rollout(QARollout.apply(x, w, aoi, send, msg_bytes, snr_lin, tx_w, keep, headroom, 1, 0,
                                             tau, tau_n, cfg, compiled))
    return StepOut(x=end.x, w=end.w, aoi=end.aoi, delivered=tot.delivered, delay_sum=tot.delay_sum,
                   timeouts=tot.timeouts, overflow=tot.overflow, energy_j=tot.energy_j,
                   throughput_bytes_per_s=tot.throughput_bytes_per_s, queued_msgs=end.queued_msgs)
