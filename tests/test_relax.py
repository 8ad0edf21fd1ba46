"""Each relaxation: its exact hard limit at tau = 0 and its documented properties."""

import math

import numpy as np
import pytest
import torch

from isaac_net.core.diff import relax

F64 = torch.float64
t = lambda *v: torch.tensor(v, dtype=F64)  # noqa: E731


def test_smin_smax_properties():
    a = t(0.0, 1.0, 4_000.0, 30_000.0, 5.0)
    b = t(3.0, 1.0, 4_000.0, 1e9, 0.0)
    assert torch.equal(relax.smin(a, b, 0.0), torch.minimum(a, b))
    s = relax.smin(a, b, 0.05)
    assert s[0] == 0 and s[4] == 0  # exact at 0
    assert s[1].item() == pytest.approx(2 ** -0.05, rel=1e-12)  # crossing point a 2^-tau
    assert s[2].item() == pytest.approx(4000 * 2 ** -0.05, rel=1e-12)  # relative: same for 4 kB
    assert s[3].item() == pytest.approx(30_000.0, rel=1e-12)  # b >> a
    m = relax.smax(a, b, 0.05)
    assert m[0] == 3.0 and m[4] == 5.0
    assert m[1].item() == pytest.approx(2 ** 0.05, rel=1e-12)
    assert torch.equal(relax.smax(a, b, 0.0), torch.maximum(a, b))
    assert (1 - 2 ** -0.05) == pytest.approx(0.034, abs=5e-4)  # the seed's 3.4 %


PAIRS = {"smin": (relax.smin1_vjp, relax.smin_const), "smax": (relax.smax1_vjp, relax.smax_const)}
# The fused QAD node scales by a precomputed 1 / tau where the others divide by tau: equal to rounding.
PAIR_RTOL = {torch.float32: 1e-5, torch.float64: 1e-13}  # a rounding of log(x) / tau, times ~1e3 at x = 1e-40


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("name", PAIRS)
def test_value_derivative_pair_of_the_nodes_is_the_relaxation(name, dtype):
    """``smin(x, 1)`` / ``smax(x, 1)`` as the hand-written nodes call them (``_l1_loop``: a float
    tau; ``_qa_step``: a ``Temperature`` of 0-dim tensors, unclamped where ``x`` is known positive):
    the value is ``relax.smin_const`` / ``smax_const`` and the derivative autograd's of it."""
    pair, const = PAIRS[name]
    tau = 0.07
    x = torch.tensor([0.0, 1e-40, 1e-3, 0.5, 1.0, 2.0, 12.0, 3e4], dtype=dtype).requires_grad_()
    ref = const(x, 1.0, tau)
    (ref_d,) = torch.autograd.grad(ref.sum(), x)
    x = x.detach()
    temp = relax.Temperature.of(tau, dtype, "cpu")
    for form, (val, d) in (("float", pair(x, tau)), ("temperature", pair(x, temp)),
                           ("no-clamp", pair(x[2:], temp, clamp=False))):
        n = len(x) - len(val)
        if form == "float":  # _l1_loop's form is the relaxation's own arithmetic
            assert torch.equal(val, ref.detach()), form
        torch.testing.assert_close(val, ref.detach()[n:], rtol=PAIR_RTOL[dtype], atol=0, msg=form)
        # atol: float32 underflows ~1e-40 derivatives a little differently
        torch.testing.assert_close(d, ref_d[n:], rtol=10 * PAIR_RTOL[dtype], atol=1e-30, msg=form)
    assert pair(x, tau, deriv=False)[1] is None
    assert float(pair(x, tau)[1][0]) == 0.0  # below tiny the clamp holds x: no gradient, as autograd


def test_soft_ge_limits():
    S, cum = t(0.0, 1.0, 2.0, 5.0, 1.0), t(1.0, 1.0, 1.0, 0.0, 2.0)
    assert torch.equal(relax.soft_ge(S, cum, 0.0), t(0, 1, 1, 1, 0))
    c = relax.soft_ge(S, cum, 0.1)
    assert c[0] == 0 and c[3] == 1  # S = 0 < cum, cum = 0
    assert c[1].item() == 0.5
    assert c[2].item() == pytest.approx(1 / (1 + 2 ** -10), rel=1e-12)  # sigmoid(log 2 / 0.1)


def test_fifo_remainder_hard_and_in_range():
    x = t(1000.0, 2000.0, 3000.0)
    cum = t(6000.0, 5000.0, 3000.0)  # FIFO order: slot 2 oldest
    S = t(4000.0)
    assert torch.equal(relax.fifo_remainder(x, cum, S, 0.0), t(1000.0, 1000.0, 0.0))
    r = relax.fifo_remainder(x, cum, S, 0.05)
    assert bool(((r >= 0) & (r <= x)).all())
    assert r.sum().item() == pytest.approx((cum[0] - relax.smin(cum[0], S, 0.05)).item(), rel=1e-12)


@pytest.mark.parametrize("tau", [0.0, 0.02, 0.3])
def test_fifo_serve_is_soft_ge_smin_and_fifo_remainder(tau):
    """The one-pass FIFO service against its three definitions (``smin(cum, S) = cum c^tau``),
    with empty slots (cum = 0) and a robot served nothing (S = 0) among the cases."""
    g = torch.Generator().manual_seed(3)
    x = torch.where(torch.rand(4, 3, 6, generator=g, dtype=F64) < 0.3, 0.0,
                    1e3 + 3e4 * torch.rand(4, 3, 6, generator=g, dtype=F64))
    x[0, 0] = 0.0  # nothing queued
    cum = x.flip(-1).cumsum(-1).flip(-1)
    S = 5e4 * torch.rand(4, 3, 1, generator=g, dtype=F64)
    S[1, 1] = 0.0  # served nothing
    c, frac, rest = relax.fifo_serve(x, cum, S, tau)
    torch.testing.assert_close(c, relax.soft_ge(S, cum, tau), rtol=1e-12, atol=0)
    torch.testing.assert_close(frac * S, relax.smin(cum, S.expand_as(cum), tau), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(rest, relax.fifo_remainder(x, cum, S, tau), rtol=1e-9, atol=1e-7)
    assert bool((c[0, 0] == 1).all()) and bool((frac[0, 0] == 0).all()) and bool((frac[1, 1] == 0).all())
    assert bool((rest[1, 1] == x[1, 1]).all()) and bool(((frac >= 0) & (frac <= 1)).all())


def test_fifo_serve_share_has_a_finite_gradient_at_a_tiny_rate():
    """The QAD finish time ``frac * interval`` replaced ``smin(cum, S) / rate``, whose gradient
    overflowed (``rate**2`` underflows in float32) when no robot was backlogged."""
    rate = torch.tensor([1e-24], requires_grad=True)
    cum = torch.tensor([[3e-3, 1e-3]])
    c, frac, _ = relax.fifo_serve(torch.tensor([[2e-3, 1e-3]]), cum, (rate * 0.02).unsqueeze(-1), 0.05)
    (frac * 0.02).sum().backward()
    assert torch.isfinite(rate.grad).all() and bool(((frac >= 0) & (frac <= 1)).all())


def test_survival_cumulates_to_s_of_age():
    d = t(4.3).reshape(1, 1)
    keep = relax.survival(d, 6, 0.2)[0, 0]
    cumulative = torch.cumprod(keep, 0)
    s = torch.sigmoid((4.3 - 0.5 - torch.arange(1, 7, dtype=F64)) / 0.2)
    assert torch.allclose(cumulative[:-1], s[:-1], rtol=1e-12)
    assert keep[-1] == 0  # the last age slot always times out
    hard = relax.survival(t(4.0).reshape(1, 1), 6, 0.0)[0, 0]
    assert hard.tolist() == [1, 1, 1, 0, 0, 0]  # ages 1, 2, 3 survive; age 4 = deadline drops


def test_step_add_and_soft_floor():
    assert relax.step_add(t(-0.5, 0.5), 0.0).tolist() == [0, 1]
    y = t(0.0, 0.99, 1.0, 3.7, 40.0)
    assert relax.soft_floor(y, 12, 0.0).tolist() == [0, 0, 1, 3, 12]
    assert relax.soft_floor(t(3.5), 12, 0.01).item() == pytest.approx(3.0, abs=1e-12)


def test_harmonic_at_integers_and_between():
    n = t(1.0, 2.0, 3.0, 8.0)
    exact = [sum(1 / j for j in range(1, int(k) + 1)) for k in n.tolist()]
    assert relax.harmonic(n).tolist() == pytest.approx(exact, rel=1e-12)
    assert 1.0 < relax.harmonic(t(1.5)).item() < 1.5


def test_gates_and_relaxed_bernoulli():
    assert relax.soft_empty(t(0.0, 1.0, 2.0), 0.0).tolist() == [1, 0, 0]
    assert relax.soft_empty(t(0.0), 0.05).item() == 1.0
    assert relax.soft_busy(t(0.0, 1.0, 3.0), 0.0).tolist() == [0, 1, 1]
    p, u = t(0.3, 0.3, 0.7), t(0.2, 0.5, 0.6)
    assert relax.relaxed_bernoulli(p, u, 0.0).tolist() == [1, 0, 1]
    s = relax.relaxed_bernoulli(p, u, 0.01)
    assert torch.allclose(s, t(1.0, 0.0, 1.0), atol=1e-3)
    s = relax.relaxed_bernoulli(p.requires_grad_(), u, 0.5)
    (g,) = torch.autograd.grad(s.sum(), p)
    assert bool((g > 0).all()) and bool(torch.isfinite(g).all())


@pytest.mark.parametrize("tau", [0.2, 0.05, 0.01])
def test_relaxations_converge_to_hard(tau):
    g = torch.Generator().manual_seed(0)
    a = 10 ** (4 * torch.rand(1000, generator=g, dtype=F64))
    b = 10 ** (4 * torch.rand(1000, generator=g, dtype=F64))
    err = (relax.smin(a, b, tau) - torch.minimum(a, b)).abs() / torch.minimum(a, b)
    assert err.max().item() <= 1 - 2 ** -tau + 1e-12
    assert math.isfinite(err.max().item())


def test_spread_sends_have_the_cells_binomial_spread_and_mean():
    """Mean-field sends with the load spread: every robot of a cell scaled by one factor per step,
    the factor's mean over the horizon exactly 1 and its coefficient of variation the binomial
    count's, ``sqrt(sum p (1 - p)) / sum p`` (lognormal at T quantiles: within a few % at T = 400)."""
    T = 400
    p = torch.tensor([[0.1] * 64, [0.05] * 32 + [0.1] * 32, [0.0] * 64], dtype=F64)  # [E = 3, R = 64]
    s = relax.spread_sends(p, T, 1.0)
    assert s.shape == (T, 3, 64)
    factor = s[:, :2] / p[:2]
    assert torch.allclose(factor, factor[..., :1].expand_as(factor))  # one factor per cell and step
    assert torch.allclose(s[:, :2].mean(0), p[:2], rtol=1e-12)  # the expected sends over the horizon
    cv = factor[..., 0].std(0, unbiased=False)
    binomial = torch.sqrt((p * (1 - p)).sum(-1)) / p.sum(-1)
    assert cv.tolist() == pytest.approx(binomial[:2].tolist(), rel=0.05)  # 0.375 and 0.437
    assert torch.equal(s[:, 2], torch.zeros(T, 64))  # a cell that sends nothing stays at 0
    # spread 0 is the plain mean-field sends; twice the spread, twice the cv (about)
    assert torch.equal(relax.spread_sends(p, T, 0.0), p.expand(T, 3, 64))
    cv2 = (relax.spread_sends(p, T, 2.0)[:, 0, 0] / 0.1).std(unbiased=False)
    assert cv2.item() == pytest.approx(2 * binomial[0].item(), rel=0.1)


def test_spread_sends_are_deterministic_bounded_and_differentiable():
    g = torch.Generator().manual_seed(0)
    p = (0.98 * torch.rand(5, 8, generator=g, dtype=F64)).requires_grad_()
    a, b = relax.spread_sends(p, 60, 1.0), relax.spread_sends(p.detach(), 60, 1.0)
    assert torch.equal(a.detach(), b)  # the same order of factors at every call
    # the order is the cell's whatever the batch: cell 0 alone gets cell 0's order and sends of the
    # batch (the sends to rounding: one thread's kernels may reduce a batch of one in another order)
    assert np.array_equal(relax._spread_quantiles(60, 1), relax._spread_quantiles(60, 5)[:, :1])
    torch.testing.assert_close(relax.spread_sends(p.detach()[:1], 60, 1.0), b[:, :1], rtol=1e-14, atol=0.0)
    assert float(b.min()) >= 0.0 and float(b.max()) <= 1.0  # at most one message a step
    assert float(b.max()) == 1.0  # p up to 0.98: the cap binds at the high factors
    assert torch.autograd.gradcheck(lambda q: relax.spread_sends(q, 12, 1.0), (p[:2, :3].detach().clone()
                                                                              .requires_grad_(),))
    with pytest.raises(ValueError, match="spread: expected a finite number >= 0"):
        relax.spread_sends(p, 60, -1.0)
    with pytest.raises(ValueError, match="T: expected an integer >= 1"):
        relax.spread_sends(p, 0, 1.0)
    with pytest.raises(ValueError, match=r"p: expected an \[E, R\] tensor"):
        relax.spread_sends(p[0], 60, 1.0)
