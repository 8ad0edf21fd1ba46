"""Relaxations of the hard operations of the discrete levels.

One temperature ``tau`` controls them all; ``tau = 0`` runs the exact hard operation.
Two kinds of temperature:

* **relative**: the smoothing acts on log ratios, so it is proportional to the
  quantity (a 4 kB and a 30 kB message see the same relative smoothing);
* **additive**: the smoothing acts on a difference in natural units (messages,
  control steps).

Every function accepts broadcastable tensors and a Python float ``tau >= 0`` (or a 0-dim
tensor ``tau > 0``, as in the compiled step).
"""

from __future__ import annotations

import functools
import math
import statistics
import typing

import numpy as np
import torch

EULER_GAMMA = 0.5772156649015329


def _tiny(x: torch.Tensor) -> float:
    # Smallest magnitude whose log is still finite and far below any physical value.
    return 1e-300 if x.dtype == torch.float64 else 1e-30


def is_hard(tau) -> bool:
    """True for the hard operations (``tau == 0`` as a Python number).

    A tensor temperature is taken to be ``> 0``: the compiled step passes ``tau`` as a 0-dim
    tensor so that annealing changes an input value, not the traced graph.
    """
    return not isinstance(tau, torch.Tensor) and tau == 0


def _log_pos(x: torch.Tensor) -> torch.Tensor:
    return torch.log(torch.clamp(x, min=_tiny(x)))


class Temperature(typing.NamedTuple):
    """A temperature ``tau > 0`` and what the relaxations derive from it, as 0-dim tensors of the
    state's dtype and device, for a hand-written node that calls :func:`smin1_vjp` and
    :func:`smax1_vjp` many times per step: an op with a Python number wraps and converts it at
    every call (~2 us each on small tensors). The relaxations then scale by ``inv_tau`` where
    they divide by a plain ``tau`` (equal to rounding)."""

    tau: torch.Tensor
    neg_tau: torch.Tensor
    inv_tau: torch.Tensor
    neg_inv_tau: torch.Tensor
    tiny: torch.Tensor  # the clamp of the logs, as _tiny
    zero: torch.Tensor

    @classmethod
    def of(cls, tau: float, dtype: torch.dtype, device) -> "Temperature":
        values = (tau, -tau, 1.0 / tau, -1.0 / tau, _tiny(torch.empty(0, dtype=dtype)), 0.0)
        return cls(*(torch.tensor(v, dtype=dtype, device=device) for v in values))


def _pow1_vjp(x: torch.Tensor, tau, sign: float, deriv: bool, clamp: bool):
    """``exp(sign tau softplus(sign log(x) / tau))`` (``smin(x, 1)`` at ``sign = -1``, ``smax(x, 1)``
    at ``+1``) and, with ``deriv``, its derivative ``val sigmoid(u) / x`` (0 below ``tiny``, where
    the clamp holds ``x``, as autograd gives; without ``clamp``, ``x`` must be far above ``tiny``)."""
    is_temp = isinstance(tau, Temperature)
    tiny, zero = (tau.tiny, tau.zero) if is_temp else (_tiny(x), 0.0)
    xc = torch.clamp_min(x, tiny) if clamp else x
    # In place on fresh tensors: log and softplus keep their inputs for autograd, not their outputs.
    if is_temp:
        u = torch.log(xc).mul_(tau.neg_inv_tau if sign < 0 else tau.inv_tau)
        val = torch.nn.functional.softplus(u).mul_(tau.neg_tau if sign < 0 else tau.tau).exp_()
    else:
        u = torch.log(xc).div_(-tau if sign < 0 else tau)
        val = torch.nn.functional.softplus(u).mul_(-tau if sign < 0 else tau).exp_()
    if not deriv:
        return val, None
    d = torch.sigmoid(u).mul_(val).div_(xc)
    return val, torch.where(x > tiny, d, zero) if clamp else d


def smin1_vjp(x: torch.Tensor, tau, *, deriv: bool = True, clamp: bool = True):
    r"""``smin(x, 1)`` and its derivative: the value and adjoint pair of the hand-written nodes.

    .. math::
        \mathrm{smin}_\tau(x, 1) = \exp\bigl(-\tau\,\mathrm{softplus}(-\log x / \tau)\bigr),\quad
        \frac{d}{dx} = \mathrm{smin}_\tau(x, 1)\,\sigma(-\log x / \tau) / x

    :input x: ``[...]`` >= 0. :param tau: > 0, a float, a 0-dim tensor or a :class:`Temperature`.
    :param deriv: also the derivative (else None). :param clamp: clamp ``x`` at the dtype's tiny
        before the log (without: ``x`` is known to be far above it).
    :output: ``(value, derivative)``, each ``[...]``. :func:`smin_const` at ``b = 1`` is its value.
    """
    return _pow1_vjp(x, tau, -1.0, deriv, clamp)


def smax1_vjp(x: torch.Tensor, tau, *, deriv: bool = True, clamp: bool = True):
    """``smax(x, 1) = exp(tau softplus(log x / tau))`` and its derivative
    ``smax(x, 1) sigmoid(log x / tau) / x``, as :func:`smin1_vjp`."""
    return _pow1_vjp(x, tau, 1.0, deriv, clamp)


def smin_const(a: torch.Tensor, b: float, tau) -> torch.Tensor:
    """``smin(a, b)`` for a constant ``b > 0`` and ``tau > 0`` (float or 0-dim tensor).

    Written as ``b smin(a / b, 1) = b exp(-tau softplus((log b - log a) / tau))``: one
    softplus instead of a logaddexp of two tensors (and no ``log b``, ``b *`` at ``b = 1``,
    where it is :func:`smin1_vjp`'s value).
    """
    if b == 1.0:
        return smin1_vjp(a, tau, deriv=False)[0]
    return b * torch.exp(-tau * torch.nn.functional.softplus((math.log(b) - _log_pos(a)) / tau))


def smax_const(a: torch.Tensor, b: float, tau) -> torch.Tensor:
    """``smax(a, b)`` for a constant ``b > 0`` and ``tau > 0``.

    ``b exp(tau softplus((log a - log b) / tau))`` (at ``b = 1`` :func:`smax1_vjp`'s value).
    """
    if b == 1.0:
        return smax1_vjp(a, tau, deriv=False)[0]
    return b * torch.exp(tau * torch.nn.functional.softplus((_log_pos(a) - math.log(b)) / tau))


def smin(a: torch.Tensor, b: torch.Tensor | float, tau: float) -> torch.Tensor:
    r"""Soft minimum of non-negative quantities in the log domain (relative temperature).

    .. math::
        \mathrm{smin}_\tau(a, b) = \exp\bigl(-\tau\,\mathrm{logsumexp}(-\log a/\tau, -\log b/\tau)\bigr)
        = (a^{-1/\tau} + b^{-1/\tau})^{-\tau}

    Exact at ``a = 0`` or ``b = 0`` (gives 0; with a constant ``b > 0`` it gives the
    dtype's tiny ~1e-30 / 1e-300 instead) and for ``b >> a`` (gives ``a``);
    ``smin(a, a) = a 2^{-tau}``. Limit ``tau -> 0``: ``min(a, b)``.
    """
    if not isinstance(b, torch.Tensor):
        if is_hard(tau):
            return torch.clamp(a, max=b)
        return smin_const(a, b, tau)
    if is_hard(tau):
        return torch.minimum(a, b)
    out = torch.exp(-tau * torch.logaddexp(-_log_pos(a) / tau, -_log_pos(b) / tau))
    return torch.where((a > 0) & (b > 0), out, 0.0)


def smax(a: torch.Tensor, b: torch.Tensor | float, tau: float) -> torch.Tensor:
    r"""Soft maximum of non-negative quantities in the log domain (relative temperature).

    .. math:: \mathrm{smax}_\tau(a, b) = (a^{1/\tau} + b^{1/\tau})^{\tau}

    Exact when either is 0 (gives the other) and for ``b >> a``; ``smax(a, a) = a 2^{tau}``.
    Limit ``tau -> 0``: ``max(a, b)``.
    """
    if not isinstance(b, torch.Tensor):
        if is_hard(tau):
            return torch.clamp(a, min=b)
        return smax_const(a, b, tau)
    if is_hard(tau):
        return torch.maximum(a, b)
    out = torch.exp(tau * torch.logaddexp(_log_pos(a) / tau, _log_pos(b) / tau))
    return torch.where(a <= 0, b.expand_as(out), torch.where(b <= 0, a.expand_as(out), out))


def soft_ge(served: torch.Tensor, cum: torch.Tensor, tau: float) -> torch.Tensor:
    r"""Completion indicator ``1[served >= cum]`` as a sigmoid of the log ratio (relative).

    .. math:: c_\tau(S, c) = \sigma\bigl((\log S - \log c) / \tau\bigr)

    ``cum <= 0`` (nothing to serve) gives 1 and ``served <= 0 < cum`` gives 0 at every tau.
    Limit ``tau -> 0``: ``1[S >= c]``.
    """
    if is_hard(tau):
        return (served >= cum).to(cum.dtype)
    c = torch.sigmoid((_log_pos(served) - _log_pos(cum)) / tau)
    return torch.where(cum <= 0, 1.0, torch.where(served <= 0, 0.0, c))


def fifo_remainder(x: torch.Tensor, cum: torch.Tensor, served: torch.Tensor, tau: float) -> torch.Tensor:
    """Unserved bytes per message after ``served`` bytes went out in FIFO order (relative).

    :input x: ``[..., A]`` bytes per message; :input cum: ``[..., A]`` bytes queued up to and
    including each message (FIFO order); :input served: ``[..., 1]``.

    The remainder of a FIFO prefix is ``cum - smin(cum, S)`` (``max(cum - S, 0)`` at tau = 0);
    a message keeps ``x - (smin(cum, S) - smin(cum - x, S))``, which is in ``[0, x]`` because
    smin is 1-Lipschitz. At tau = 0 the hard FIFO arithmetic is used as written: a message
    not reached keeps ``x``, the one in service keeps ``cum - S``, done ones keep 0.
    """
    prev = cum - x
    if is_hard(tau):
        return torch.where(served >= cum, torch.zeros_like(x), torch.where(prev < served, cum - served, x))
    return x - (smin(cum, served, tau) - smin(prev, served, tau))


def fifo_serve(x: torch.Tensor, cum: torch.Tensor, served: torch.Tensor, tau) -> tuple:
    """FIFO service of ``served`` bytes in one pass: completion, time share, remainder (relative).

    :input x: ``[..., A]`` bytes per message; :input cum: ``[..., A]`` bytes queued up to and
    including each message (FIFO order, so the next older message's ``cum`` is ``cum - x``);
    :input served: ``[..., 1]``.
    :output: ``(c, frac, rest)``, each ``[..., A]``: ``c = soft_ge(served, cum)``, the part of
    ``served`` that the FIFO prefix up to each message takes, ``frac = smin(cum, served) /
    served`` (0 where nothing is served), and ``rest = fifo_remainder(x, cum, served)``.

    With ``z = (log S - log cum) / tau`` and ``c = sigmoid(z)``,
    ``smin(cum, S) = cum (1 + (cum / S)^{1/tau})^{-tau} = cum c^tau = S (1 - c)^tau``; and the
    next older message's prefix is ``smin(cum - x, S)``, that message's. So one logsigmoid
    gives all three, where ``soft_ge`` and two ``fifo_remainder`` soft minima need three
    ``logaddexp`` passes over ``[..., A]`` (same values to rounding; a test checks them).
    ``frac`` needs no division by ``S``: a finish time ``frac * interval`` stays finite, with a
    finite gradient, when the rate behind ``S`` is tiny.
    """
    if is_hard(tau):
        safe = torch.where(served > 0, served, 1.0)
        return (soft_ge(served, cum, tau), torch.minimum(cum, served) / safe,
                fifo_remainder(x, cum, served, tau))
    z = (_log_pos(served) - _log_pos(cum)) / tau
    # Nothing queued is complete (c = 1, frac = 0); nothing served leaves the rest queued (c = 0).
    log_c = torch.where(served > 0, torch.nn.functional.logsigmoid(z), -math.inf)
    log_c = torch.where(cum > 0, log_c, 0.0)
    c = torch.exp(log_c)
    q = cum * torch.exp(tau * log_c)  # smin(cum, S)
    q_older = torch.nn.functional.pad(q[..., 1:], (0, 1))  # next older message's prefix; 0 past the oldest
    frac = torch.exp(tau * torch.where(cum > 0, log_c - z, -math.inf))  # (1 - c)^tau: log(1 - c) = log c - z
    return c, frac, x - (q - q_older)


def step_add(z: torch.Tensor, tau: float) -> torch.Tensor:
    """Step ``1[z > 0]`` as ``sigmoid(z / tau)`` (additive temperature, z in natural units).

    Used for the buffer limit (``z = F - 0.5 - n`` messages). Limit ``tau -> 0``: ``1[z > 0]``.
    """
    if is_hard(tau):
        return (z > 0).to(z.dtype)
    return torch.sigmoid(z / tau)


def survival(deadline: torch.Tensor, num_ages: int, tau: float) -> torch.Tensor:
    """Per-step survival factor of a message at each age (additive, control steps).

    The cumulative survival to age ``a`` is ``s(a) = sigmoid((deadline - 0.5 - (a + 1)) / tau)``;
    at the end of a step a message of age ``a`` survives with ``s(a) / s(a - 1)``
    (``s(-1) = 1``), so after ``a + 1`` steps exactly ``s(a)`` of it is left, at every tau.
    The last age slot always times out (the buffer holds ``num_ages`` ages).

    :input deadline: ``[E, R]`` control steps. :output: ``[E, R, num_ages]``.
    Limit ``tau -> 0``: ``1[a + 1 < deadline - 0.5]``.
    """
    ages = torch.arange(num_ages, dtype=deadline.dtype, device=deadline.device)
    z = deadline.unsqueeze(-1) - 0.5 - (ages + 1.0)
    if is_hard(tau):
        keep = (z > 0).to(deadline.dtype)
    else:
        log_s = torch.nn.functional.logsigmoid(z / tau)
        prev = torch.cat([torch.zeros_like(log_s[..., :1]), log_s[..., :-1]], dim=-1)
        keep = torch.exp(log_s - prev)
    last = torch.zeros(num_ages, dtype=deadline.dtype, device=deadline.device)
    last[-1] = 1.0
    return keep * (1.0 - last)


def soft_floor(y: torch.Tensor, n_max: int, tau: float) -> torch.Tensor:
    r"""``min(floor(y), n_max)`` for ``y >= 0`` as a sum of sigmoid steps at the integers (additive).

    .. math:: \lfloor y \rfloor_\tau = \sum_{j=1}^{n_{max}} \sigma((y - j)/\tau)

    Limit ``tau -> 0``: ``sum_j 1[y >= j]``, the floor capped at ``n_max``.
    """
    j = torch.arange(1, n_max + 1, dtype=y.dtype, device=y.device)
    z = y.unsqueeze(-1) - j
    if is_hard(tau):
        return (z >= 0).to(y.dtype).sum(-1)
    return torch.sigmoid(z / tau).sum(-1)


ZETA2 = math.pi**2 / 6.0  # zeta(2) = H'(0)
ZETA3 = 1.2020569031595942  # zeta(3) = -H''(0) / 2


def _harmonic_series_max(x: torch.Tensor) -> float:
    # Below 2 eps, 1 + n rounds to 1 or its next float: digamma(1 + n) + gamma is rounding error
    # (-2.4e-7 for every float32 n < 1.5e-7, where H(n) ~ 1.64 n), and the series is exact to rounding.
    return 2.0 * torch.finfo(x.dtype).eps


def harmonic(n: torch.Tensor) -> torch.Tensor:
    r"""Harmonic number at a real ``n >= 0`` (no temperature): ``H(n) = digamma(n + 1) + gamma``.

    Equals ``sum_{j=1}^{n} 1/j`` at the integers. At ``n`` below twice the dtype's epsilon that
    difference cancels to rounding error, which in float32 is negative (``-2.4e-7`` for every
    ``n < 1.5e-7``, where ``H(n) ~ 1.64 n``): QAD's PF gain times a linear SNR above ~4e6 (66 dB)
    put ``log2(1 + G snr)`` below 0 and every KPI to NaN. There the Taylor series
    ``H(n) = zeta(2) n - zeta(3) n^2`` is used (exact to rounding); above it the plain formula.
    Its derivative is :func:`harmonic_deriv` (what autograd gives through this function).

    :input n: ``[...]`` >= 0. :output: ``[...]``.
    """
    plain = torch.special.digamma(n + 1.0) + EULER_GAMMA
    return torch.where(n < _harmonic_series_max(n), n * (ZETA2 - ZETA3 * n), plain)


def harmonic_deriv(n: torch.Tensor) -> torch.Tensor:
    """``H'(n) = trigamma(n + 1)``, and ``zeta(2) - 2 zeta(3) n`` where :func:`harmonic` takes its
    series (the hand-written adjoint of QAD's fused step). :input n: ``[...]`` >= 0. :output: ``[...]``."""
    return torch.where(n < _harmonic_series_max(n), ZETA2 - 2.0 * ZETA3 * n,
                       torch.special.polygamma(1, n + 1.0))


def soft_empty(mass: torch.Tensor, tau: float) -> torch.Tensor:
    """"Was empty" gate from the soft message count: ``1 - smin(mass, 1)`` (relative).

    1 exactly at ``mass = 0``; ``1 - 2^{-tau}`` at one message. Limit ``tau -> 0``: ``1[mass = 0]``
    for integer counts.
    """
    return 1.0 - smin(mass, 1.0, tau)


def soft_busy(mass: torch.Tensor, tau: float) -> torch.Tensor:
    """Backlog indicator from the soft count of incomplete messages: ``smin(mass, 1)`` (relative).

    At tau = 0 with binary sends it is 1 exactly when some queued message is not yet
    complete, i.e. when the youngest queued byte is not yet served. It weighs the robot
    in the count of backlogged robots ``n`` and in its transmit energy. Counting mass rather
    than bytes keeps the tiny byte remainders that a soft FIFO leaves behind (about
    ``tau cum (cum / S)^{1/tau}``) from counting as a whole backlogged robot.
    """
    return smin(mass, 1.0, tau)


#: The least chance of being backlogged :func:`backlog_closure` gives: a robot with nothing queued is
#: served nothing either way, and its served bytes stay away from exact 0 (log in fifo_serve).
MIN_BUSY = 1e-6

#: The least temperature at which :func:`backlog_closure`'s rollouts have usable gradients. Below it
#: the closure's step expands on some cells (its leading mode the mass of a nearly completed message
#: of a robot holding little): the KPIs turn rough at fine scale and backpropagation through time
#: diverges from their central differences, in float64 as in float32. ``DiffFluid`` warns below it
#: (docs/design.md, section 6).
CLOSURE_MIN_TAU = 0.05


def backlog_closure(mass: torch.Tensor, *, deriv: bool = True):
    """Mean-field sends' backlog closure (``CellConfig.mf_backlog_closure``): a robot holding an
    expected ``mass`` messages as a Poisson count is backlogged with the chance
    ``busy = max(1 - exp(-mass), MIN_BUSY)``, and a backlogged robot shares the band with itself and
    the others' chances, ``n_j = 1 + sum_{k != j} busy_k``. The reference's values and the fused
    node's, with ``d busy / d mass = exp(-mass) = 1 - chance`` (as autograd of ``expm1`` takes it, from
    its result; 0 where the floor holds, as autograd of ``clamp``).

    :input mass: ``[E, R]`` >= 0, a robot's queued messages.
    :output: ``(busy, n, d_busy)``, each ``[E, R]`` (``d_busy`` None without ``deriv``).
    """
    chance = -torch.expm1(-mass)
    busy = torch.clamp(chance, min=MIN_BUSY)
    n = busy.sum(-1, keepdim=True) - busy + 1.0
    if not deriv:
        return busy, n, None
    return busy, n, torch.where(chance >= MIN_BUSY, 1.0 - chance, torch.zeros_like(mass))


def relaxed_bernoulli(p: torch.Tensor, u: torch.Tensor, lam: float) -> torch.Tensor:
    r"""Binary-concrete sample from fixed uniforms ``u`` (pathwise gradient in ``p``).

    .. math:: s = \sigma\bigl((\mathrm{logit}\,p - \mathrm{logit}\,u) / \lambda\bigr)

    Limit ``lam -> 0``: ``1[u < p]``, the binary send from the same uniforms.

    :input p: probabilities in [0, 1]; :input u: uniforms in [0, 1]; :param lam: finite, >= 0.
        Outside these a ValueError (a p of 1.5 is not clamped, a lam < 0 would invert the sends).
    """
    from isaac_net.core import _validate

    lam = _validate.temperature(lam, "lam")
    for name, x in (("p", p), ("u", u)):
        if not isinstance(x, torch.Tensor) or x.is_complex():
            raise TypeError(f"{name}: expected a real tensor, got {type(x).__name__}")
        _validate.check_range(x, name, 0.0, 1.0, "values in [0, 1]")
        if bool(torch.isnan(x).any()):
            raise ValueError(f"{name}: expected values in [0, 1], got NaN")
    try:
        torch.broadcast_shapes(p.shape, u.shape)
    except RuntimeError:
        raise ValueError(f"p, u: expected shapes that broadcast together, got p {list(p.shape)} and "
                         f"u {list(u.shape)}") from None
    if lam == 0:
        return (u < p).to(p.dtype)
    eps = 1e-12 if p.dtype == torch.float64 else 1e-6
    pc = torch.clamp(p, eps, 1.0 - eps)
    uc = torch.clamp(u, eps, 1.0 - eps)
    return torch.sigmoid((torch.logit(pc) - torch.logit(uc)) / lam)


#: Seed of the fixed orders of the load factors of :func:`spread_sends` (one order per cell index).
SPREAD_SEED = 20261206


@functools.lru_cache(maxsize=16)
def _spread_quantiles(T: int, E: int) -> np.ndarray:
    """``[T, E]``: the standard normal's quantiles at ``(k + 1/2) / T``, ``k < T``, in an order of
    cell ``e``'s own (drawn with the seed ``(SPREAD_SEED, e)``, so a cell's order does not depend on
    how many cells are batched with it): one step's draw each, balanced over the horizon."""
    z = np.array([statistics.NormalDist().inv_cdf((k + 0.5) / T) for k in range(T)])
    return np.stack([z[np.random.default_rng([SPREAD_SEED, e]).permutation(T)] for e in range(E)], axis=1)


def spread_sends(p: torch.Tensor, T: int, spread: float) -> torch.Tensor:
    r"""Mean-field sends with the cell's load spread ``[T, E, R]``: each robot's send weight ``p``
    times a factor per step common to its cell.

    With binary sends a cell is offered a binomial number of messages per step, with coefficient of
    variation :math:`c = \sqrt{\sum_i p_i (1 - p_i)} / \sum_i p_i`; mean-field sends (``p`` at every
    step) have none, so a queue's knee in load is sharper than with binary sends, the more so the
    more robots share the cell at a given offered load (docs/design.md section 5). Here step ``t``'s
    factor is lognormal with coefficient of variation ``spread * c``, taken at the normal quantile
    ``z_t`` of :func:`_spread_quantiles` (a fixed order per cell index, the same at every call, so the
    sends are a deterministic, differentiable function of ``p``, through the weight and through ``c``;
    cells of their own orders average over the ways the loads can follow each other) and
    normalised to a mean of exactly 1 over the ``T`` steps; a send is at most 1 (one message a step).

    :input p: ``[E, R]`` send probabilities in [0, 1].
    :param T: control steps, >= 1. :param spread: the scale of ``c``, finite and >= 0 (1: the
        binomial spread; 0: ``p`` at every step).
    :output: ``[T, E, R]``.
    """
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"T: expected an integer >= 1, got {T!r}")
    if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not (
            math.isfinite(spread) and spread >= 0):
        raise ValueError(f"spread: expected a finite number >= 0, got {spread!r}")
    if not isinstance(p, torch.Tensor) or p.dim() != 2:
        raise ValueError(f"p: expected an [E, R] tensor, got {getattr(p, 'shape', type(p).__name__)}")
    if spread == 0:
        return p.unsqueeze(0).expand(T, *p.shape)
    offered = p.sum(-1, keepdim=True)  # [E, 1] expected sends of the cell per step
    var = (p * (1.0 - p)).sum(-1, keepdim=True)
    cv2 = torch.where(offered > 0, var / offered.clamp_min(_tiny(p)) ** 2, 0.0) * spread**2
    # sqrt's slope at 0 is infinite: a cell without spread (every p 0 or 1) gets no gradient through it.
    sigma = torch.sqrt(torch.log1p(cv2).clamp_min(1e-12))  # [E, 1] the lognormal's log-sd
    z = torch.as_tensor(_spread_quantiles(T, p.shape[0]), dtype=p.dtype, device=p.device).unsqueeze(-1)
    factor = T * torch.softmax(sigma * z, dim=0)  # exp(sigma z_t) / its mean over the steps
    return torch.clamp(p * factor, max=1.0)
