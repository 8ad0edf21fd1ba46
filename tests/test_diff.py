"""DiffFluid (L1D, QAD): equivalence at tau = 0, conservation, gradients, edges, API."""

import dataclasses
import functools
import json
import math

import pytest
import torch
from problems import DEVICES, TOL, random_scenario, seed_scenario

from isaac_net.core import CellConfig
from isaac_net.core.diff import DiffFluid, relax, rollout
from isaac_net.core.diff.reference import discrete_rollout
from isaac_net.core.kpi import BATCH_KEYS

F64 = torch.float64
MODES = ["L1", "QA"]
COUNTS = ("offered", "delivered", "timeouts", "overflow", "queued_msgs", "aoi")


def both(s, mode, tau=0.0, dtype=F64, device="cpu"):
    s = s.to(dtype, device)
    ref = discrete_rollout(mode, s.T, s.p, s.B, snr_db=s.snr_db, u=s.u, deadline=s.deadline,
                           cfg=s.cfg, dtype=dtype, device=device)
    net = DiffFluid(s.E, s.R, device, mode=mode, tau=tau, cfg=s.cfg, dtype=dtype)
    out = rollout(net, s.T, s.p, s.B, snr_db=s.snr_db, u=s.u, deadline=s.deadline, sends="binary")
    return ref, out


def assert_equivalent(ref, out):
    for k in COUNTS:
        assert torch.equal(ref[k], out[k]), k
    torch.testing.assert_close(out["delay_sum"], ref["delay_sum"], rtol=TOL["delay_sum_rel"], atol=1e-9)
    torch.testing.assert_close(out["energy_j"], ref["energy_j"], rtol=TOL["energy_rel"], atol=1e-12)
    torch.testing.assert_close(out["throughput_bytes_per_s"], ref["throughput_bytes_per_s"],
                               rtol=TOL["throughput_rel"], atol=1e-9)


# ----------------------------------------------------------------------------- equivalence
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["normal", "overload", "calibrated"])
def test_equivalence_at_tau_zero_seed_cases(mode, case):
    ref, out = both(seed_scenario(case), mode)
    assert_equivalent(ref, out)
    if case == "overload":  # both the buffer and the deadline bind
        assert ref["overflow"].sum() > 0 and ref["timeouts"].sum() > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("calibrated", [False, True], ids=["plain", "calibrated"])
@pytest.mark.parametrize("seed", range(6))
def test_equivalence_at_tau_zero_random_scenarios(mode, seed, calibrated):
    assert_equivalent(*both(random_scenario(seed, calibrated), mode))


@pytest.mark.parametrize("mode", MODES)
def test_calibration_constants_change_the_discrete_level_as_documented(mode):
    """Each constant moves the discrete level the way it says: less capacity or a latency
    floor raise the delay, a higher SNR offset lowers it, and none changes the energy's power
    (the same busy time costs the same joules)."""
    s = seed_scenario("normal")
    base = both(s, mode)[0]

    def run(**constants):
        cfg = dataclasses.replace(s.cfg, **constants)
        return discrete_rollout(mode, s.T, s.p, s.B, snr_db=s.snr_db, u=s.u, deadline=s.deadline, cfg=cfg)

    def delay(r):
        return float(r["mean_delay"])

    assert delay(run(rate_factor=0.5)) > 1.2 * delay(base)
    assert delay(run(snr_offset_db=6.0)) < delay(base)
    floor = "l1_sr_slots" if mode == "L1" else "qa_sr_slots"
    late = run(**{floor: 20})
    assert delay(late) > delay(base) + 0.3  # 20 of 40 slots: half a step later for a robot that was empty
    # Energy: the power is the true one; only the busy time changes.
    assert float(run(snr_offset_db=6.0)["mean_energy_j"]) < float(base["mean_energy_j"])
    torch.testing.assert_close(run(rate_factor=1.0, snr_offset_db=0.0)["energy_j"], base["energy_j"],
                               rtol=0, atol=0)
    # The time on air: a factor scales the energy where the cap does not bind (below 1 it never does), a
    # crowd exponent raises it (robots share the cell), the cap keeps every robot within its power for
    # the whole step.
    torch.testing.assert_close(run(air_factor=0.5)["energy_j"], 0.5 * base["energy_j"], rtol=1e-6, atol=0)
    crowded = run(air_crowd_exp=0.5)
    assert float(crowded["mean_energy_j"]) > 1.2 * float(base["mean_energy_j"])
    assert bool((crowded["energy_j"] >= base["energy_j"]).all())
    capped = run(air_factor=100.0)["energy_j"]
    power_w = 10.0 ** ((s.cfg.tx_dbm - 30.0) / 10.0)  # energy_j: a robot's mean per step
    assert float(capped.max()) <= power_w * s.cfg.step_s * (1 + 1e-6)
    assert float(capped.max()) > 0.5 * power_w * s.cfg.step_s  # on air the whole step when it sends


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_equivalence_float32(mode, device):
    ref, out = both(seed_scenario("normal"), mode, dtype=torch.float32, device=device)
    for k in ("offered", "delivered", "timeouts", "overflow"):
        assert torch.equal(ref[k], out[k]), k


# ----------------------------------------------------------------------------- conservation
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tau", [0.0, 0.01, 0.05, 0.2])
@pytest.mark.parametrize("sends", ["mean_field", "relaxed"])
@pytest.mark.parametrize("case", ["overload", "calibrated"])
def test_mass_conservation_every_step(mode, tau, sends, case):
    s = seed_scenario(case, E=4, T=30)
    net = DiffFluid(s.E, s.R, mode=mode, tau=tau, cfg=s.cfg, dtype=F64)
    total = 0
    for t in range(s.T):
        send = s.p if sends == "mean_field" else torch.sigmoid((torch.logit(s.p) - torch.logit(s.u[t])) / 0.3)
        out = net.step(send, s.B, snr_db=s.snr_db, deadline=s.deadline + 0.3 * (s.deadline < 6))
        total = total + out["offered"] - out["delivered"] - out["timeouts"] - out["overflow"]
        torch.testing.assert_close(total, out["queued_msgs"], rtol=0, atol=TOL["mass_abs"])
        assert bool((net.state.w >= 0).all()) and bool((net.state.x >= -1e-6).all())


# ----------------------------------------------------------------------------- gradients
def tiny_problem(mode, calibrated: bool = False):
    cfg = CellConfig(num_slots=4, buffer_msgs=2, timeout_steps=3, qa_sr_slots=1)
    if calibrated:  # the latency floor and SR offset cover half the slots
        cfg = dataclasses.replace(cfg, rate_factor=0.7, snr_offset_db=3.0, l1_sr_slots=2, qa_sr_slots=2)
    g = torch.Generator().manual_seed(5)
    E, R = 2, 3
    p = (0.3 + 0.5 * torch.rand(E, R, generator=g, dtype=F64)).requires_grad_()
    B = (60e3 + 120e3 * torch.rand(E, R, generator=g, dtype=F64)).requires_grad_()
    tx = (5.0 + 10 * torch.rand(E, R, generator=g, dtype=F64)).requires_grad_()
    pos = (60 + 80 * torch.rand(E, R, 2, generator=g, dtype=F64)).requires_grad_()
    dl = (2.2 + 0.6 * torch.rand(E, R, generator=g, dtype=F64)).requires_grad_()
    return cfg, (p, B, tx, pos, dl)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("calibrated", [False, True], ids=["plain", "calibrated"])
def test_gradcheck_float64(mode, calibrated):
    cfg, inputs = tiny_problem(mode, calibrated)

    def kpis(p, B, tx, pos, dl):
        net = DiffFluid(2, 3, mode=mode, tau=0.1, cfg=cfg, dtype=F64)
        k = rollout(net, 4, p, B, pos=pos, tx_dbm=tx, deadline=dl)
        return torch.stack([k["mean_delay"], k["delivery_ratio"], k["mean_aoi"], 1e4 * k["mean_energy_j"],
                            1e-6 * k["mean_throughput_bytes_per_s"]])

    out = kpis(*inputs)
    assert bool(torch.isfinite(out).all())
    assert torch.autograd.gradcheck(kpis, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


def kpi_mix(k):
    return k["mean_delay"] + 0.5 * k["mean_aoi"] + 50.0 * k["mean_energy_j"] - k["delivery_ratio"]


def kpis_and_grads(net, T, p, B, **kw) -> tuple:
    """``kpi_mix`` and the mean throughput (its scale is kpi_mix's x 1e4: a KPI of its own) of
    ``rollout(net, T, p, B, **kw)`` from a reset ``net``, each with its gradient in ``p``: what the
    compile tests compare. One rollout per gradient: a compiled backward donates its buffers (no
    ``retain_graph``)."""
    out = []
    for kpi in (kpi_mix, lambda k: k["mean_throughput_bytes_per_s"]):
        net.reset()
        y = kpi(rollout(net, T, p, B, **kw))
        out.append((y.detach(), torch.autograd.grad(y, p)[0]))
    (mix, g_mix), (tput, g_tput) = out
    return mix, tput, g_mix, g_tput


def assert_compiled_equals_eager(eager: tuple, compiled: tuple) -> None:
    """``kpis_and_grads`` of the compiled path against the eager's: values to 1e-10, gradients to 1e-8
    (relative); every gradient nonzero."""
    for name, a, b, rtol, atol in zip(("kpi_mix", "throughput", "grad kpi_mix", "grad throughput"),
                                      compiled, eager, (1e-10, 1e-10, 1e-8, 1e-8), (0, 0, 1e-12, 1e-12),
                                      strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")
    assert float(eager[1]) > 0 and all(float(g.abs().max()) > 0 for g in eager[2:])


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_directional_derivative_matches_central_differences(mode):
    g = torch.Generator().manual_seed(11)
    E, R, T = 32, 8, 60
    x0 = {
        "p": 0.2 + 0.5 * torch.rand(E, R, generator=g, dtype=F64),
        "B": 4000 + 26000 * torch.rand(E, R, generator=g, dtype=F64),
        "tx_dbm": 15 + 10 * torch.rand(E, R, generator=g, dtype=F64),
        "pos": 40 + 100 * torch.rand(E, R, 2, generator=g, dtype=F64),
    }
    scale = {"p": 0.1, "B": 1000.0, "tx_dbm": 1.0, "pos": 1.0}

    def f(x):
        net = DiffFluid(E, R, mode=mode, tau=0.05, dtype=F64)
        return kpi_mix(rollout(net, T, x["p"], x["B"], pos=x["pos"], tx_dbm=x["tx_dbm"], warmup=5))

    leaves = {k: v.clone().requires_grad_() for k, v in x0.items()}
    f(leaves).backward()
    h = 1e-5
    for name in x0:
        d = scale[name] * torch.randn(x0[name].shape, generator=g, dtype=F64)
        ad = (leaves[name].grad * d).sum().item()
        with torch.no_grad():
            fp = f({**x0, name: x0[name] + h * d}).item()
            fm = f({**x0, name: x0[name] - h * d}).item()
        fd = (fp - fm) / (2 * h)
        assert abs(fd - ad) <= TOL["fd_rel"] * abs(ad), (name, ad, fd)


@pytest.mark.parametrize("mode", MODES)
def test_error_shrinks_as_tau_goes_to_zero(mode):
    s = seed_scenario("normal", E=16, R=8, T=60)
    ref, _ = both(s, mode)
    err = {}
    for tau in (0.2, 0.02, 0.002):
        _, out = both(s, mode, tau=tau)
        err[tau] = max(abs(out[k] - ref[k]).item() / ref[k].item() for k in ("mean_delay", "mean_aoi"))
    assert err[0.2] > err[0.02] > err[0.002]
    assert err[0.002] < 0.01


def test_physical_signs():
    E, R, T = 8, 4, 40
    g = torch.Generator().manual_seed(3)
    for mode in MODES:
        p = torch.full((E, R), 0.5, dtype=F64, requires_grad=True)
        B = torch.full((E, R), 20_000.0, dtype=F64, requires_grad=True)
        tx = torch.full((E, R), 20.0, dtype=F64, requires_grad=True)
        pos = 60 + 80 * torch.rand(E, R, 2, generator=g, dtype=F64)
        k = rollout(DiffFluid(E, R, mode=mode, dtype=F64), T, p, B, pos=pos, tx_dbm=tx, warmup=5)
        dp, dB, dtx = torch.autograd.grad(k["mean_delay"], (p, B, tx), retain_graph=True)
        assert dp.sum() > 0 and dB.sum() > 0 and dtx.sum() < 0, mode
        (de,) = torch.autograd.grad(k["mean_energy_j"], tx)
        assert de.sum() > 0, mode


# ----------------------------------------------------------------------------- state control
def test_detach_cuts_the_graph():
    p1 = torch.full((2, 3), 0.6, dtype=F64, requires_grad=True)
    p2 = torch.full((2, 3), 0.6, dtype=F64, requires_grad=True)
    for cut in (False, True):
        net = DiffFluid(2, 3, mode="L1", dtype=F64)
        for _ in range(3):
            net.step(p1, 200_000.0, snr_db=5.0)
        if cut:
            net.detach()
        out = net.step(p2, 200_000.0, snr_db=5.0)
        g1, g2 = torch.autograd.grad(out["delay_sum"].sum(), (p1, p2), allow_unused=True)
        if cut:
            assert g1 is None and g2.abs().sum() > 0
        else:
            assert g1.abs().sum() > 0


@pytest.mark.parametrize("mode", MODES)
def test_reset_leaves_other_envs_and_their_gradients(mode):
    s = seed_scenario("normal", E=3, R=4, T=12)
    res = []
    for reset in (False, True):
        p = s.p.clone().requires_grad_()
        net = DiffFluid(3, 4, mode=mode, dtype=F64)
        total = 0
        for t in range(s.T):
            if reset and t == 6:
                net.reset([1])
            out = net.step(p, s.B, snr_db=s.snr_db)
            total = total + out["delay_sum"] + out["aoi"]
        (g,) = torch.autograd.grad(total[[0, 2]].sum(), p)
        res.append((total.detach(), g))
    assert torch.equal(res[0][0][[0, 2]], res[1][0][[0, 2]])
    assert torch.equal(res[0][1], res[1][1])
    assert not torch.equal(res[0][0][1], res[1][0][1])


def test_tau_can_change_between_steps():
    net = DiffFluid(1, 2, mode="QA", tau=0.2)
    net.step(0.5, 1e4, snr_db=10.0)
    net.tau = 0.02
    assert net.tau == 0.02 and net.tau_n == 0.02
    net.step(0.5, 1e4, snr_db=10.0)


# ----------------------------------------------------------------------------- edges
@pytest.mark.parametrize("mode", MODES)
def test_gradients_finite_at_the_edges(mode):
    E, R = 2, 4
    p = torch.tensor([[0.0, 1.0, 0.5, 0.3], [0.0, 0.0, 0.9, 1.0]], dtype=F64, requires_grad=True)
    B = torch.full((E, R), 30_000.0, dtype=F64, requires_grad=True)
    pos = torch.tensor([[[0.3, 0.2], [0.0, 0.0], [50, 0], [400, 300]]] * 2, dtype=F64, requires_grad=True)
    dl = torch.full((E, R), 10.0, dtype=F64, requires_grad=True)  # deadline = timeout
    for tau in (1e-4, 0.05):
        net = DiffFluid(E, R, mode=mode, tau=tau, dtype=F64)
        k = rollout(net, 15, p, B, pos=pos, tx_dbm=23.0, deadline=dl)
        grads = torch.autograd.grad(kpi_mix(k), (p, B, pos, dl))
        for gr in grads:
            assert bool(torch.isfinite(gr).all())
        assert grads[2][0, :2].abs().max() == 0  # inside 1 m: clamped, zero gradient


def test_quick_start_runs_as_written():
    E, R, T = 64, 8, 100
    p = torch.full((E, R), 0.4, requires_grad=True)
    B = torch.full((E, R), 12_000.0, requires_grad=True)
    tx = torch.full((E, R), 23.0, requires_grad=True)
    pos = (40 + 100 * torch.rand(E, R, 2, generator=torch.Generator().manual_seed(0))).requires_grad_()
    net = DiffFluid(E, R, "cpu", mode="L1", tau=0.05)
    kpi = rollout(net, T, p, B, pos=pos, tx_dbm=tx, warmup=10)
    loss = kpi["mean_delay"] + 0.5 * kpi["mean_aoi"] + 50.0 * kpi["mean_energy_j"]
    loss.backward()
    for x in (p, B, tx, pos):
        assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    assert B.grad.sum() > 0  # bigger messages: longer delay
    assert tx.grad.sum() < 0  # more power: shorter delay, outweighs its energy at weight 50
    assert 0.9 < kpi["delivery_ratio"].item() <= 1.0


# ----------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(send=1.2), r"send: expected send weights in \[0, 1\]"),
        (dict(send=torch.full((3, 2), 0.5)), r"send: expected shape \[2, 3\]"),
        (dict(msg_bytes=0.0), "msg_bytes"),
        (dict(msg_bytes=float("nan")), "msg_bytes: expected finite"),
        (dict(deadline=10.5), r"deadline: expected values in \[1, timeout_steps=10\]"),
        (dict(pos=torch.zeros(2, 3, 2)), "exactly one"),
    ],
)
def test_bad_step_inputs(kwargs, match):
    net = DiffFluid(2, 3)
    args = dict(send=0.5, msg_bytes=1000.0, snr_db=10.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        net.step(args.pop("send"), args.pop("msg_bytes"), **args)


def test_bad_constructor_and_rollout_inputs():
    with pytest.raises(ValueError, match="unknown mode 'L2'; expected one of: L1, QA"):
        DiffFluid(1, 1, mode="L2")
    with pytest.raises(ValueError, match="tau"):
        DiffFluid(1, 1, tau=-0.1)
    net = DiffFluid(2, 3)
    with pytest.raises(ValueError, match=r"p: expected probabilities in \[0, 1\]"):
        rollout(net, 5, 1.5, 1000.0, snr_db=10.0)
    with pytest.raises(ValueError, match="unknown sends"):
        rollout(net, 5, 0.5, 1000.0, snr_db=10.0, sends="poisson")
    with pytest.raises(ValueError, match="u: expected uniforms of shape"):
        rollout(net, 5, 0.5, 1000.0, snr_db=10.0, sends="binary", u=torch.rand(4, 2, 3))
    with pytest.raises(ValueError, match="warmup"):
        rollout(net, 5, 0.5, 1000.0, snr_db=10.0, warmup=5)


def test_config_changes_are_respected():
    cfg = dataclasses.replace(CellConfig(), timeout_steps=4)
    net = DiffFluid(1, 1, cfg=cfg)
    assert net.state.x.shape == (1, 1, 4)


@pytest.mark.parametrize("keep_tape", [False, True], ids=["recompute", "tape"])
def test_l1_slot_loop_backward_equals_autograd_of_the_recursion(keep_tape):
    """The node's forward and hand-written backward against autograd of ``model._l1_slot``."""
    from isaac_net.core.diff._l1_loop import L1SlotLoop
    from isaac_net.core.diff.model import _l1_slot

    g = torch.Generator().manual_seed(2)
    E, R, A, K, tau = 3, 5, 6, 12, 0.07
    w = torch.rand(E, R, A, generator=g, dtype=F64).requires_grad_()
    log_cum = (torch.log(1e3 + 3e4 * torch.rand(E, R, A, generator=g, dtype=F64)) / tau).requires_grad_()
    snr = (10 ** (3 * torch.rand(E, R, generator=g, dtype=F64))).requires_grad_()
    c0 = torch.zeros(E, R, A, dtype=F64)
    consts = (12.0, 5.5, 90.0)
    outs = L1SlotLoop.apply(w, log_cum, snr, c0, tau, K, *consts, keep_tape)
    c, c_sum = c0, torch.zeros_like(c0)
    served = torch.zeros(E, R, dtype=F64)
    tau_t = torch.tensor(tau, dtype=F64)
    for _ in range(K):
        served = _l1_slot(w, w.sum(-1), c, served, snr, tau_t, consts)
        c_sum = c_sum + c
        c = torch.sigmoid(relax._log_pos(served).unsqueeze(-1) / tau_t - log_cum)
    ref = (served, c_sum)
    for a, b in zip(outs, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    weights = [torch.randn(o.shape, generator=g, dtype=F64) for o in outs]
    inputs = (w, log_cum, snr)
    ga = torch.autograd.grad(sum((wt * o).sum() for wt, o in zip(weights, outs, strict=True)), inputs)
    gb = torch.autograd.grad(sum((wt * o).sum() for wt, o in zip(weights, ref, strict=True)), inputs)
    for a, b in zip(ga, gb, strict=True):
        assert float(b.abs().max()) > 0
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("sends", ["mean_field", "relaxed"])
def test_l1_latency_floor_keeps_gradients_of_the_plain_models_scale(sends):
    """With mean-field sends a queue is nearly empty most of the time (mass ~ 1e-3 left over): the
    floor's mixture keeps the gradients finite and of the size of the model without a floor (a
    rate scaled by the "not empty" weight put log(served) near 0 and blew them up by ~1e6)."""
    g = torch.Generator().manual_seed(4)
    E, R, T = 6, 8, 30
    p0 = torch.full((E, R), 0.5, dtype=F64)
    B0 = torch.full((E, R), 20e3, dtype=F64)
    snr = 12 + 15 * torch.rand(E, R, generator=g, dtype=F64)
    u = torch.rand(T, E, R, generator=g, dtype=F64)
    grads = {}
    for L in (0, 16, 32, 40):
        p, B = p0.clone().requires_grad_(), B0.clone().requires_grad_()
        net = DiffFluid(E, R, mode="L1", tau=0.05, cfg=CellConfig(l1_sr_slots=L), dtype=F64)
        k = rollout(net, T, p, B, snr_db=snr, warmup=5, sends=sends, u=u if sends == "relaxed" else None)
        kpi_mix(k).backward()
        grads[L] = (float(p.grad.abs().mean()), float(B.grad.abs().mean()))
        assert all(math.isfinite(v) for v in grads[L])
    for L in (16, 32, 40):
        for v, ref in zip(grads[L], grads[0], strict=True):
            assert ref / 20 < v < 20 * ref, (L, grads)


def _qa_step_inputs(cfg, g, tau, tau_n, zero_factor: bool):
    """Inputs of one QAD step ``[E=3, R=4, A]`` in float64 with the edges: empty old slots, empty
    robots that send and that do not, a send of 1 and, with ``zero_factor``, a whole message fully
    served (done = w c = 1 exactly, a zero factor of the AoI's cumprod)."""
    from isaac_net.core.diff import relax
    from isaac_net.core.diff.model import qa_headroom

    E, R, A = 3, 4, cfg.timeout_steps
    x = 1e3 + 3e4 * torch.rand(E, R, A, generator=g, dtype=F64)
    w = torch.rand(E, R, A, generator=g, dtype=F64)
    x[0, 0, 2:], w[0, 0, 2:] = 0.0, 0.0
    x[2, 3], w[2, 3] = 0.0, 0.0
    x[2, 2], w[2, 2] = 0.0, 0.0  # empty, and it sends: with the SR filling the step nothing is served
    if zero_factor:
        x[1, 1], w[1, 1] = 0.0, 0.0
        x[1, 1, 2], w[1, 1, 2] = 1.0, 1.0  # one byte, one whole message: served at once
    aoi = 5 * torch.rand(E, R, generator=g, dtype=F64)
    send = torch.rand(E, R, generator=g, dtype=F64)
    send[0, 1], send[2, 3] = 1.0, 0.0
    if zero_factor:
        send[1, 1] = 0.0  # so that the robot's delivered mass is that message alone
    B = 1e3 + 3e4 * torch.rand(E, R, generator=g, dtype=F64)
    snr = 10 ** (3 * torch.rand(E, R, generator=g, dtype=F64))
    tx_w = 0.2 * torch.rand(E, R, generator=g, dtype=F64)
    keep = relax.survival(1 + (A - 1) * torch.rand(E, R, generator=g, dtype=F64), A, tau_n)
    m = qa_headroom(snr, cfg, tau, tau_n)
    return [t.requires_grad_() for t in (x, w, aoi, send, B, snr, tx_w, keep, m)]


# A calibrated time on air whose cap binds for some robots of _qa_step_inputs and not for others.
AIR = dict(air_factor=4.0, air_crowd_exp=0.8)


# A wider grant than QA's (power spread over at least 3 subbands): _qa_step_inputs' headroom lies on
# both sides of it.
GRANT = dict(qa_min_grant_subbands=3.0)
# Mean-field sends' backlog closure (a robot's own count and busy chance); with the crowd's time on air
# too (a robot's own crowd), as the calibrated QAD mean-field cell has both.
CLOSURE = dict(mf_backlog_closure=True)
CLOSURE_AIR = dict(mf_backlog_closure=True, **AIR)
STEP_RULES = pytest.mark.parametrize(
    "air", [{}, AIR, GRANT, CLOSURE, CLOSURE_AIR],
    ids=["plain-air", "crowd-air", "wide-grant", "closure", "closure-crowd-air"])


@pytest.mark.parametrize("zero_factor", [False, True], ids=["no-zero-factor", "zero-factor"])
@pytest.mark.parametrize("sr_slots", [1, 4], ids=["sr-1", "sr-fills-step"])
@STEP_RULES
def test_qa_step_backward_equals_autograd_of_the_step(zero_factor, sr_slots, air):
    """The fused QAD step (hand-written backward) against autograd of ``model._step``, float64; with a
    calibrated time on air (its crowd factor and cap), with a wider grant and with the backlog closure
    (and it with the crowd's time on air) too."""
    from isaac_net.core.diff._qa_step import qa_step
    from isaac_net.core.diff.model import _step

    cfg = CellConfig(num_slots=4, qa_sr_slots=sr_slots, timeout_steps=5, buffer_msgs=3, **air)
    tau, tau_n = 0.07, 0.2
    g = torch.Generator().manual_seed(3 + sr_slots)
    inputs = _qa_step_inputs(cfg, g, tau, tau_n, zero_factor)
    if air is GRANT:  # robots granted fewer subbands than the width and more (share 12 / n >= 3)
        m = inputs[8].detach()
        assert float(m.min()) < 3.0 < float(m.max())
    outs = qa_step(*inputs, tau, tau_n, cfg)
    ref = _step(*inputs, tau, tau_n, cfg, "QA")
    for a, b in zip(outs, ref, strict=True):  # bytes up to ~3e4: a remainder x - q + q_older rounds at ~1e-12
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-9)
    if zero_factor:
        assert float(ref[3][1, 1].detach()) == 1.0  # the whole message was delivered: done = 1
    if air.get("mf_backlog_closure"):  # the empty robot that does not send sits on the chance's floor
        assert float(ref.w[2, 3].detach().sum()) == 0.0
    if air is AIR:  # the cap binds somewhere (the energy near tx_w step) and not everywhere
        share = (outs.energy_j / (inputs[6] * cfg.step_s)).detach()
        assert float(share.max()) > 0.9 and float(share[share > 0].min()) < 0.5
    weights = [torch.randn(o.shape, generator=g, dtype=F64) for o in outs]
    ga = torch.autograd.grad(sum((wt * o).sum() for wt, o in zip(weights, outs, strict=True)), inputs)
    gb = torch.autograd.grad(sum((wt * o).sum() for wt, o in zip(weights, ref, strict=True)), inputs)
    for name, a, b in zip("x w aoi send bytes snr tx_w keep headroom".split(), ga, gb, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=name)
        assert b.abs().sum() > 0, name


@STEP_RULES
def test_qa_step_gradcheck(air):
    from isaac_net.core.diff._qa_step import qa_step

    cfg = CellConfig(num_slots=4, qa_sr_slots=1, timeout_steps=4, buffer_msgs=3, **air)
    g = torch.Generator().manual_seed(5)
    inputs = [t.detach().clone() for t in _qa_step_inputs(cfg, g, 0.1, 0.2, zero_factor=False)]
    inputs[0][0, 0, 2:], inputs[1][0, 0, 2:] = 500.0, 0.3  # interior points: no empty slot ...
    inputs[0][2, 2:], inputs[1][2, 2:] = 700.0, 0.5
    inputs[3][0, 1], inputs[3][2, 3] = 0.9, 0.1  # ... and no send on the edge of [0, 1]
    inputs = [t.requires_grad_() for t in inputs]
    step = functools.partial(qa_step, tau=0.1, tau_n=0.2, cfg=cfg)
    assert torch.autograd.gradcheck(step, inputs, eps=1e-4, atol=1e-5, rtol=1e-3)


def test_qa_node_refuses_a_backward_after_an_input_changed_in_place():
    """The fused QAD node saves the caller's tensors with ``save_for_backward``: changing one in place
    between forward and backward raises, as for autograd's own nodes, instead of giving wrong gradients."""
    from isaac_net.core.diff._qa_step import qa_step

    cfg = CellConfig(num_slots=4, qa_sr_slots=1, timeout_steps=4, buffer_msgs=3)
    inputs = _qa_step_inputs(cfg, torch.Generator().manual_seed(6), 0.1, 0.2, zero_factor=False)
    snr_lin = inputs[5].detach().clone()  # a tensor the caller owns (no grad of its own)
    out = qa_step(*inputs[:5], snr_lin, *inputs[6:], tau=0.1, tau_n=0.2, cfg=cfg)
    loss = out.delay_sum.sum() + out.energy_j.sum()
    snr_lin.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def _rollout_by_steps(net, T, p, B, snr_db, deadline, sends, u, warmup):
    """``rollout`` as a loop of ``advance``: QAD's fused step one node per step (from the state the
    net holds, as a constant, as ``rollout`` starts). Mean-field ``p`` may be ``[T, E, R]``, a send
    weight per step (``relax.spread_sends``)."""
    from isaac_net.core.diff import relax
    from isaac_net.core.kpi import KpiAccumulator

    inputs = net.inputs(B, snr_db=snr_db, deadline=deadline)
    net.detach()
    acc = KpiAccumulator(warmup)
    for t in range(T):
        if sends == "mean_field":
            send = p[t] if p.dim() == 3 else p
        else:
            send = relax.relaxed_bernoulli(p, u[t], 0.1)
        acc.add(net.advance(send, inputs))
    return acc.result()


@pytest.mark.parametrize("sends", ["mean_field", "relaxed"])
@pytest.mark.parametrize("air", [{}, AIR], ids=["plain-air", "crowd-air"])
def test_qa_rollout_node_steps_and_autograd_agree(sends, air):
    """QAD's rollout as one node, the same steps one node each, and autograd through every op of
    ``model._step`` (``slot_grad="autograd"``) give one model: values and gradients over two rollouts
    in a row (the second continues from the first's state, as a constant) with a warm-up, float64."""
    s = seed_scenario("overload", E=3, R=4, T=12)
    u = torch.rand(s.T, 3, 4, generator=torch.Generator().manual_seed(4), dtype=F64)
    out = {}
    for how in ("rollout", "steps", "autograd"):
        p, B, snr, dl = (t.clone().requires_grad_() for t in (s.p, s.B, s.snr_db, s.deadline))
        net = DiffFluid(3, 4, mode="QA", tau=0.05, cfg=dataclasses.replace(s.cfg, **air), dtype=F64)
        if how == "autograd":
            net.slot_grad = "autograd"
        assert net.fused_rollout == (how != "autograd")
        total = 0.0
        for _ in range(2):
            if how == "steps":
                k = _rollout_by_steps(net, s.T, p, B, snr, dl, sends, u, warmup=3)
            else:
                k = rollout(net, s.T, p, B, snr_db=snr, deadline=dl, sends=sends,
                            u=None if sends == "mean_field" else u, warmup=3)
            total = total + kpi_mix(k) + k["timeouts"].sum() + k["overflow"].sum() + k["queued_msgs"].sum()
        out[how] = (total.detach(), *torch.autograd.grad(total, (p, B, snr, dl)))
    # the same ops step by step: equal to rounding; autograd of _step sums in another order (relaxed
    # sends near 0 and 1 cancel more): ~5e-9 relative at most here
    for how, rtol in (("steps", 1e-12), ("autograd", 1e-7)):
        for name, a, b in zip(("value", "p", "B", "snr", "deadline"), out["rollout"], out[how], strict=True):
            torch.testing.assert_close(a, b, rtol=rtol, atol=1e-12, msg=f"{how}: {name}")
    assert all(g.abs().sum() > 0 for g in out["rollout"][1:])


@pytest.mark.parametrize("mode", MODES)
def test_a_cells_load_spread_is_the_rollouts_mean_field_sends_per_step(mode):
    """``CellConfig.load_spread`` gives a mean-field rollout the sends ``relax.spread_sends``: the same
    KPIs and gradients as the steps run with those sends (QAD's fused node included), other KPIs than
    without it, mass conserved and delivery in [0, 1]; relaxed sends have their own spread and ignore it."""
    s = seed_scenario("overload", E=3, R=4, T=12)
    spread = dataclasses.replace(s.cfg, load_spread=1.0)
    out = {}
    for how, cfg in (("rollout", spread), ("steps", s.cfg), ("plain", s.cfg)):
        p, B = s.p.clone().requires_grad_(), s.B.clone().requires_grad_()
        net = DiffFluid(3, 4, mode=mode, tau=0.05, cfg=cfg, dtype=F64)
        if how == "steps":  # the plain cell, stepped with the spread sends
            k = _rollout_by_steps(net, s.T, relax.spread_sends(p, s.T, 1.0), B, s.snr_db, s.deadline,
                                  "mean_field", None, warmup=3)
        else:
            k = rollout(net, s.T, p, B, snr_db=s.snr_db, deadline=s.deadline, warmup=3)
        total = kpi_mix(k)
        out[how] = (total.detach(), *torch.autograd.grad(total, (p, B)))
        assert 0.0 <= float(k["delivery_ratio"].detach()) <= 1.0
        left = k["delivered"] + k["timeouts"] + k["overflow"] + k["queued_msgs"]
        torch.testing.assert_close(left.detach(), k["offered"].detach(), rtol=0, atol=TOL["mass_abs"])
    for a, b in zip(out["rollout"], out["steps"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert abs(float(out["rollout"][0] - out["plain"][0])) > 1e-3  # the spread moves the KPIs
    assert float(out["rollout"][1].abs().sum()) > 0
    u = torch.rand(s.T, 3, 4, generator=torch.Generator().manual_seed(4), dtype=F64)
    relaxed = [kpi_mix(rollout(DiffFluid(3, 4, mode=mode, tau=0.05, cfg=c, dtype=F64), s.T, s.p, s.B,
                               snr_db=s.snr_db, deadline=s.deadline, sends="relaxed", u=u, warmup=3))
               for c in (spread, s.cfg)]
    assert torch.equal(relaxed[0], relaxed[1])


@pytest.mark.parametrize("mode", ["L1", "QA"])
def test_on_step_sees_every_step_and_keeps_the_rollouts_kpis(mode):
    """``rollout(on_step=...)`` gets each step's per-robot KPIs, the warm-up's too: their sums over the
    counted steps are the rollout's totals, and the KPIs are those of the rollout without it (QAD's
    fused node against its steps: to rounding)."""
    s = seed_scenario("overload", E=3, R=4, T=10)
    seen = []
    kw = dict(snr_db=s.snr_db, deadline=s.deadline, warmup=3)
    with_steps = rollout(DiffFluid(3, 4, mode=mode, tau=0.05, cfg=s.cfg, dtype=F64), s.T, s.p, s.B,
                         on_step=seen.append, **kw)
    plain = rollout(DiffFluid(3, 4, mode=mode, tau=0.05, cfg=s.cfg, dtype=F64), s.T, s.p, s.B, **kw)
    assert len(seen) == s.T and seen[0]["energy_j"].shape == (3, 4)
    for k, per_step in (("delivered", 1), ("timeouts", 1), ("energy_j", 7)):  # energy_j: a mean of 7 steps
        torch.testing.assert_close(sum(out[k] for out in seen[3:]), with_steps[k] * per_step)
    for k in ("mean_delay", "delivery_ratio", "mean_aoi", "mean_energy_j"):
        torch.testing.assert_close(with_steps[k], plain[k], rtol=1e-12, atol=0.0)
    with pytest.raises(TypeError, match="on_step: expected None or a callable"):
        rollout(DiffFluid(3, 4, mode=mode, dtype=F64), 2, s.p, s.B, snr_db=s.snr_db, on_step=3)


def test_qa_rollout_node_frees_its_steps_unless_the_graph_is_retained():
    s = seed_scenario("normal", E=2, R=3, T=6)
    p = s.p.clone().requires_grad_()
    net = DiffFluid(2, 3, mode="QA", tau=0.05, dtype=F64)
    k = rollout(net, s.T, p, s.B, snr_db=s.snr_db)
    node = k["aoi"].grad_fn  # aoi / steps: the division's input is the rollout node's aoi total
    while type(node).__name__ != "QARolloutBackward":
        node = node.next_functions[0][0]
    assert len(node.tape) == s.T
    k["mean_aoi"].backward(retain_graph=True)
    assert len(node.tape) == s.T and all(step is not None for step in node.tape)
    g = p.grad.clone()
    k["mean_aoi"].backward()
    assert node.tape is None
    torch.testing.assert_close(p.grad, 2 * g)


COMPILE_CFG = CellConfig(num_slots=4, qa_sr_slots=1, timeout_steps=4)  # the compile tests share its graphs
# Under pytest-xdist (make test) the tests of one mode's compiled graphs run in one worker, which
# compiles them once; the L1 and QA groups compile side by side.
COMPILED_MODES = [pytest.param(m, marks=pytest.mark.xdist_group(f"compiled-{m}")) for m in ("L1", "QA")]


@pytest.mark.slow
@pytest.mark.parametrize("mode", COMPILED_MODES)
def test_compiled_equals_eager(mode):
    """The compiled step, in a step loop (on the CPU QAD's fused node with its forward compiled),
    equals the eager model's rollout, values and gradients, and a new temperature compiles nothing."""
    cfg = COMPILE_CFG
    s = seed_scenario("normal", E=2, R=3, T=5)
    out = []
    for compiled in (False, True):
        p = s.p.clone().requires_grad_()
        net = DiffFluid(2, 3, mode=mode, tau=0.05, cfg=cfg, dtype=F64, compile=compiled)
        out.append(kpis_and_grads(net, s.T, p, s.B, snr_db=s.snr_db, step_by_step=compiled))
        net.tau = 0.02  # a new temperature is a new input value, not a new graph
        with torch._dynamo.config.patch(error_on_recompile=compiled):
            rollout(net, 2, p, s.B, snr_db=s.snr_db, step_by_step=compiled)
    assert_compiled_equals_eager(*out)


@pytest.mark.xdist_group("compiled-L1")
@pytest.mark.parametrize("floor", [False, True], ids=["plain", "floor"])
def test_compiled_slot_loop_equals_the_eager_node(floor):
    """The compiled path's slot-loop operator (one compiled kernel per slot, forward and adjoint)
    against the eager node, values and gradients, float64, at two batch sizes of one kernel
    (R = 3 robots and A = 4 ages: the kernels of COMPILE_CFG's steps, compiled once for all);
    with a floor's gate and a start of its own (``served0``), the gated kernels and every gradient."""
    from isaac_net.core.diff import _l1_loop

    g = torch.Generator().manual_seed(5)
    compiles = None
    for E in (3, 7):
        R, A, K, tau = 3, COMPILE_CFG.timeout_steps, 6, 0.07
        w = torch.rand(E, R, A, generator=g, dtype=F64).requires_grad_()
        log_cum = (torch.log(1e3 + 3e4 * torch.rand(E, R, A, generator=g, dtype=F64)) / tau).requires_grad_()
        snr = (10 ** (3 * torch.rand(E, R, generator=g, dtype=F64))).requires_grad_()
        c0 = torch.zeros(E, R, A, dtype=F64)
        inputs = [w, log_cum, snr]
        gate = served0 = None
        if floor:
            c0 = (0.3 * torch.rand(E, R, A, generator=g, dtype=F64)).requires_grad_()
            gate = torch.rand(E, R, generator=g, dtype=F64).requires_grad_()
            served0 = (2e3 * torch.rand(E, R, generator=g, dtype=F64)).requires_grad_()
            inputs += [c0, gate, served0]
        consts = (12.0, 5.5, 90.0)
        eager = _l1_loop.L1SlotLoop.apply(w, log_cum, snr, c0, tau, K, *consts, False, gate, served0)
        flip = _l1_loop._flip_dims
        comp = _l1_loop.compiled_slot_loop(flip(w), flip(log_cum), flip(snr), flip(c0),
                                           torch.tensor(tau, dtype=F64), torch.tensor(consts, dtype=F64), K,
                                           *((flip(gate), flip(served0)) if floor else ()))
        comp = [flip(t) for t in comp[:2]]
        for a, b in zip(comp, eager, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-9)
        weights = [torch.randn(o.shape, generator=g, dtype=F64) for o in eager]
        ga, gb = (torch.autograd.grad(sum((wt * o).sum() for wt, o in zip(weights, outs, strict=True)),
                                      inputs) for outs in (comp, eager))
        for a, b in zip(ga, gb, strict=True):
            assert float(b.abs().max()) > 0
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        kernels = ((_l1_loop.SLOT_FORWARD_GATED, _l1_loop.SLOT_ADJOINT_GATED) if floor
                   else (_l1_loop.SLOT_FORWARD, _l1_loop.SLOT_ADJOINT))
        counts = tuple(k.num_compiles for k in kernels)
        assert compiles is None or counts == compiles, "a new batch size compiled the slot kernels again"
        compiles = counts


@pytest.mark.slow
@pytest.mark.parametrize("mode", COMPILED_MODES)
def test_compiled_step_compiles_once_for_every_batch_size(mode):
    """One compile serves E = 8 ... 256, R = 3 and 5 robots per cell and both radio inputs (snr_db, or
    pos + tx_dbm); grad mode is the one other thing that compiles again. The step is compiled ahead
    of its call (or loaded from the store an earlier process left), never by dynamo's fallback."""
    from isaac_net.core.diff import _l1_loop, _qa_step, model

    # QAD on the CPU: the fused node's forward kernel (the compiled step is not built)
    step = (model._compiled_step(mode, "recompute") if mode == "L1"
            else _qa_step.forward_kernel(COMPILE_CFG))
    g = torch.Generator().manual_seed(6)
    first, kernels, steps = True, None, None
    for R, radio in ((3, "pos"), (3, "snr"), (5, "pos"), (5, "snr")):
        for E in (8, 16, 24, 64, 256):
            p = torch.rand(E, R, generator=g, dtype=F64).requires_grad_()
            net = DiffFluid(E, R, mode=mode, tau=0.05, cfg=COMPILE_CFG, dtype=F64, compile=True)
            if radio == "pos":
                pos = 40 + 100 * torch.rand(E, R, 2, generator=g, dtype=F64)
                kw = dict(pos=pos, tx_dbm=torch.full((E, R), 20.0, dtype=F64, requires_grad=True))
            else:
                kw = dict(snr_db=5 + 20 * torch.rand(E, R, generator=g, dtype=F64))
            with torch._dynamo.config.patch(error_on_recompile=not first):  # step loops: QAD's too
                k = rollout(net, 3, p, torch.full((E, R), 8000.0, dtype=F64), step_by_step=True, **kw)
                (kpi_mix(k) + 1e-4 * k["mean_throughput_bytes_per_s"]).backward()
            assert float(p.grad.abs().sum()) > 0
            counts = (_l1_loop.SLOT_FORWARD.num_compiles, _l1_loop.SLOT_ADJOINT.num_compiles)
            assert kernels is None or counts == kernels, (radio, E)
            step_counts = (step.num_compiles, step.num_loads)
            assert sum(step_counts) >= 1 and (steps is None or step_counts == steps), (radio, E)
            assert getattr(step, "num_fallbacks", 0) == 0
            first, kernels, steps = False, counts, step_counts


@pytest.mark.slow
@pytest.mark.xdist_group("compiled-QA")
@pytest.mark.parametrize("closure", [False, True], ids=["plain", "backlog-closure"])
def test_qad_compiled_rollout_is_its_fused_node_with_the_forward_compiled(closure):
    """On the CPU ``compile=True`` runs QAD's rollout as its fused node, whose forward is one compiled
    kernel a step (``FORWARD_KERNELS``; with mean-field sends' backlog closure a kernel of its own)
    and whose backward is the hand-written adjoint: the values and gradients of the eager node
    (float64), at two batch sizes of one compile, and no compiled step is built, loaded or traced."""
    from isaac_net.core.diff import _qa_step, model

    cfg = dataclasses.replace(COMPILE_CFG, mf_backlog_closure=closure)
    kernel = _qa_step.forward_kernel(cfg)
    before = {k: (f.num_compiles, f.num_loads, f.num_fallbacks) for k, f in model._COMPILED_STEPS.items()}
    counts = None
    for E in (3, 7):
        s = seed_scenario("normal", E=E, R=4, T=6)
        out = []
        for compiled in (False, True):
            p = s.p.clone().requires_grad_()
            net = DiffFluid(E, 4, mode="QA", tau=0.05, cfg=cfg, dtype=F64, compile=compiled)
            assert net.fused_rollout
            with torch._dynamo.config.patch(error_on_recompile=counts is not None):
                out.append(kpis_and_grads(net, s.T, p, s.B, snr_db=s.snr_db))
        assert_compiled_equals_eager(*out)
        now = (kernel.num_compiles, kernel.num_loads)
        assert sum(now) >= 1 and (counts is None or now == counts), E
        counts = now
    after = {k: (f.num_compiles, f.num_loads, f.num_fallbacks) for k, f in model._COMPILED_STEPS.items()}
    assert after == before
    assert not DiffFluid(3, 4, mode="L1", compile=True).fused_rollout
    with pytest.raises(TypeError, match="step_by_step: expected a bool"):
        rollout(net, 2, s.p, s.B, snr_db=s.snr_db, step_by_step="yes")


def _kernel_body(a, b):
    """A kernel's function (module level: the store's key names its module and qualified name)."""
    return a * b + 1.0, torch.exp(-a) * b


def test_a_kernel_compiled_once_is_loaded_by_a_later_process(tmp_path, monkeypatch):
    """A Kernel keeps what inductor compiled on disk; a new Kernel of the same function (as in a new
    process: nothing in memory) loads it for any batch size instead of tracing again, and a
    damaged store file is compiled again, not trusted."""
    from isaac_net.core import _kernels

    monkeypatch.setattr(_kernels, "_store", lambda: tmp_path)
    g = torch.Generator().manual_seed(9)
    a, b = (torch.rand(3, 5, generator=g, dtype=F64) for _ in range(2))
    first = _kernels.Kernel(_kernel_body)
    torch.testing.assert_close(first(a, b), _kernel_body(a, b), rtol=1e-12, atol=0)
    assert (first.num_compiles, first.num_loads) == (1, 0)
    kept = sorted(f.suffix for f in tmp_path.iterdir() if f.name != "vec_isa.json")
    assert kept == [".json", ".py"]

    a2, b2 = (torch.rand(3, 11, generator=g, dtype=F64) for _ in range(2))  # another batch size
    second = _kernels.Kernel(_kernel_body)
    torch.testing.assert_close(second(a2, b2), _kernel_body(a2, b2), rtol=1e-12, atol=0)
    assert (second.num_compiles, second.num_loads) == (0, 1)

    (kept_json,) = (f for f in tmp_path.glob("*.json") if f.name != "vec_isa.json")
    kept_json.write_text('{"spec": [[0, null]], "stat')  # a write cut short
    third = _kernels.Kernel(_kernel_body)
    torch.testing.assert_close(third(a, b), _kernel_body(a, b), rtol=1e-12, atol=0)
    assert (third.num_compiles, third.num_loads) == (1, 0)


def test_a_loaded_kernel_is_checked_to_its_operands_float_error_not_finer():
    """The check of a loaded kernel against the function run eagerly accepts what a fused kernel's
    other order of float32 operations gives (an ulp of operands of 1e4 in a value of 0.1: what
    QAD's forward gave, so its kept kernel was compiled again in every process) and refuses an
    output off by a share of its tensor's scale, or of another shape."""
    from isaac_net.core._kernels import _matches_eager

    g = torch.Generator().manual_seed(4)
    eager = (2.3 * torch.rand(10, 16, 8, generator=g), 6e5 * torch.rand(16, 8, generator=g))
    eager[0][3, 4, 5] = 0.1182
    ulp = eager[0].clone()
    ulp[3, 4, 5] += 2.0 ** -10  # an ulp of 1.2e4, 8e-3 of the value
    assert _matches_eager((ulp, eager[1].clone()), eager)
    off = eager[0].clone()
    off[3, 4, 5] += 0.02  # 1e-2 of the tensor's scale
    assert not _matches_eager((off, eager[1].clone()), eager)
    assert not _matches_eager((eager[0],), eager)  # an output missing
    assert not _matches_eager((eager[0][:5], eager[1]), eager)  # another shape
    nan = eager[1].clone()
    nan[0, 0] = float("nan")
    assert _matches_eager((eager[0], nan.clone()), (eager[0], nan))  # NaN where eager has NaN
    e64 = torch.rand(6, 5, generator=g, dtype=F64)
    assert _matches_eager((e64 + 1e-11,), (e64,)) and not _matches_eager((e64 + 1e-7,), (e64,))


def test_qads_forward_kernel_is_loaded_by_a_later_process(tmp_path, monkeypatch):
    """QAD's compiled forward kernel, kept by one process, is loaded by the next (a new Kernel of
    the same function: nothing in memory) and gives the same rollout."""
    from isaac_net.core import _kernels
    from isaac_net.core.diff import _qa_step

    monkeypatch.setattr(_kernels, "_store", lambda: tmp_path)
    E, R, T = 16, 8, 3  # 30 kB messages: the queue's bytes of 1e4 and more, in differences of 0.1
    g = torch.Generator().manual_seed(0)
    p, B = torch.full((E, R), 0.4), torch.full((E, R), 30000.0)
    pos = 40 + 100 * torch.rand(E, R, 2, generator=g)

    def run():
        net = DiffFluid(E, R, "cpu", mode="QA", tau=0.05, compile=True)
        with torch.no_grad():
            return rollout(net, T, p, B, pos=pos, tx_dbm=torch.full((E, R), 23.0))

    for first in (True, False):
        kernel = _kernels.Kernel(_qa_step._forward_kernel, dim=(-2, -1))
        monkeypatch.setitem(_qa_step.FORWARD_KERNELS, (False, False), kernel)
        out = run()
        assert (kernel.num_compiles, kernel.num_loads) == ((1, 0) if first else (0, 1))
        if first:
            kept = out
    for k, v in out.items():
        torch.testing.assert_close(v, kept[k], rtol=0, atol=0)


@pytest.mark.slow
def test_the_slot_kernels_compile_in_another_process_while_the_step_compiles(tmp_path, monkeypatch):
    """Before a cold compile of L1D's step its slot kernels are compiled in a background process
    into the same store; the first slot loop waits for it and loads them (nothing compiled here),
    with the outputs and gradients of the eager node."""
    from isaac_net.core import _kernels
    from isaac_net.core.diff import _l1_loop

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # the background process's store too
    fresh = {name: _kernels.Kernel(getattr(_l1_loop, name).fn, dim=getattr(_l1_loop, name).dim)
             for name in ("SLOT_FORWARD", "SLOT_ADJOINT")}
    for name, kernel in fresh.items():  # as in a new process: nothing compiled in memory
        monkeypatch.setattr(_l1_loop, name, kernel)
    E, R, A, K, tau = 5, 3, COMPILE_CFG.timeout_steps, 4, 0.07
    g = torch.Generator().manual_seed(11)
    _l1_loop.slot_kernels_in_background(torch.zeros(E, R, A, dtype=F64), 0, K, True)
    assert len(_kernels._BACKGROUND) == 1
    w = torch.rand(E, R, A, generator=g, dtype=F64).requires_grad_()
    log_cum = torch.log(1e3 + 3e4 * torch.rand(E, R, A, generator=g, dtype=F64)) / tau
    snr = 10 ** (3 * torch.rand(E, R, generator=g, dtype=F64))
    c0 = torch.zeros(E, R, A, dtype=F64)
    consts = (12.0, 5.5, 90.0)
    flip = _l1_loop._flip_dims
    tau_t, consts_t = torch.tensor(tau, dtype=F64), torch.tensor(consts, dtype=F64)
    args = (flip(w), flip(log_cum), flip(snr), flip(c0), tau_t, consts_t, K)
    served, c_sum, _ = _l1_loop.compiled_slot_loop(*args)
    assert not _kernels._BACKGROUND  # waited for
    eager = _l1_loop.L1SlotLoop.apply(w, log_cum, snr, c0, tau, K, *consts, False, None, None)
    torch.testing.assert_close(flip(served), eager[0], rtol=1e-12, atol=1e-9)
    (gw,) = torch.autograd.grad((flip(served) * flip(c_sum).sum(-1)).sum(), w)
    (gw_eager,) = torch.autograd.grad((eager[0] * eager[1].sum(-1)).sum(), w)
    torch.testing.assert_close(gw, gw_eager, rtol=1e-10, atol=1e-12)
    assert [(k.num_compiles, k.num_loads) for k in fresh.values()] == [(0, 1), (0, 1)]


def test_the_store_keeps_inductors_answer_on_the_cpus_vector_instructions(tmp_path, monkeypatch):
    """Inductor probes which vector instructions it can build for once per process (a compile and a
    new Python process per candidate); the store keeps its answer for this machine, and a later
    process loading kept code is told it instead, only where the answer is for the same machine and
    every candidate worked."""
    import torch._inductor.config as inductor_config
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    from isaac_net.core import _kernels

    monkeypatch.setattr(_kernels, "_store", lambda: tmp_path)
    monkeypatch.setattr(_kernels, "_isa_told", False)
    monkeypatch.setattr(_kernels, "_isa_kept", False)
    valid = [str(isa) for isa in valid_vec_isa_list()]  # this process's own probe
    _kernels._remember_isa()
    record = json.loads((tmp_path / "vec_isa.json").read_text())
    assert record == {"machine": json.loads(json.dumps(_kernels._isa_machine())), "valid": valid}
    with _kernels._known_isa():  # probed already in this process: nothing to tell
        assert inductor_config.cpp.vec_isa_ok is None

    def told() -> bool | None:
        valid_vec_isa_list.cache_clear()  # as in a new process
        with _kernels._known_isa():
            inside = inductor_config.cpp.vec_isa_ok
        assert inductor_config.cpp.vec_isa_ok is None  # only while loading
        return inside

    assert told() is (True if valid == _kernels._isa_candidates() else None)
    monkeypatch.setattr(_kernels, "_isa_told", False)
    for machine, valid_kept in ((record["machine"][:-2] + [[1, 2], None], valid),  # another compiler file
                                (record["machine"], valid[:-1] + ["no_such_isa"])):  # a candidate failed
        (tmp_path / "vec_isa.json").write_text(json.dumps({"machine": machine, "valid": valid_kept}))
        assert told() is None
    (tmp_path / "vec_isa.json").write_text('{"machine": [')  # a write cut short: probe
    assert told() is None
    valid_vec_isa_list.cache_clear()  # the next compile probes for itself


def test_a_cold_compile_starts_inductors_vector_probe_on_another_core_once(tmp_path, monkeypatch):
    """probe_isa_in_background starts one process per process on the CPU, where nothing is known
    yet and no other background compile runs; the probe walks the candidates in the reverse of
    inductor's order (a compiling process walking its own meets it in the middle), told they work
    as the compile is (what inductor builds even then), and keeps no answer."""
    import subprocess

    from torch._inductor import cpu_vec_isa

    from isaac_net.core import _kernels

    started = []
    monkeypatch.setattr(_kernels, "compile_in_background",
                        lambda target, spec, wait=True: started.append((target, spec, wait)))
    monkeypatch.setattr(_kernels, "_store", lambda: tmp_path)
    monkeypatch.setattr(_kernels, "_isa_started", False)
    monkeypatch.setattr(_kernels, "_BACKGROUND", [])
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", functools.cache(lambda: []))
    _kernels.probe_isa_in_background(torch.device("cuda"))  # no CPU kernels: nothing to probe
    _kernels.probe_isa_in_background(None)  # no tensor argument
    assert started == []
    running = subprocess.Popen(["sleep", "5"])
    _kernels._BACKGROUND.append(running)  # a background compile probes as it compiles
    _kernels.probe_isa_in_background(torch.device("cpu"))
    running.kill()
    running.wait()
    assert started == []
    _kernels.probe_isa_in_background(torch.device("cpu"))
    _kernels.probe_isa_in_background(torch.device("cpu"))
    assert started == [("isaac_net.core._kernels:_probe_isa", {}, False)]  # not waited for
    monkeypatch.setattr(_kernels, "_isa_started", False)
    (tmp_path / "vec_isa.json").write_text("{}")  # an answer kept: loads are told, compiles probe
    _kernels.probe_isa_in_background(torch.device("cpu"))
    assert len(started) == 1

    probed = []

    class FakeIsa:
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return self.name

        def __bool__(self):
            import torch._inductor.config as inductor_config

            assert inductor_config.cpp.vec_isa_ok is True
            probed.append(self.name)
            return True

    isas = [FakeIsa(name) for name in ("amx", "vnni", "avx2", "neon")]
    monkeypatch.setattr(cpu_vec_isa, "supported_vec_isa_list", isas)
    monkeypatch.setattr(_kernels, "_isa_candidates", lambda: ["vnni", "avx2"])
    monkeypatch.setattr(_kernels, "_remember_isa", lambda: probed.append("kept"))
    threads = torch.get_num_threads()
    _kernels._probe_isa({"threads": threads})  # told they work, as the compile is
    assert probed == ["avx2", "vnni"]  # and no answer kept: the compile's kernel is the test


def test_a_cold_compile_trusts_the_cpus_vector_instructions_and_probes_where_that_fails(tmp_path,
                                                                                       monkeypatch):
    """Where a process knows nothing of its vector instructions, a compile on the CPU runs with
    inductor told they all work (no probe); where that compile fails, inductor's list is cleared
    (it probes) and the compile runs again, warned. No trust on a GPU, where this process knows
    already, or where the store says a candidate failed on this machine."""
    import torch._inductor.config as inductor_config
    from torch._inductor import cpu_vec_isa

    from isaac_net.core import _kernels

    monkeypatch.setattr(_kernels, "_store", lambda: tmp_path)
    known = functools.cache(lambda: ["told"])
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", known)
    around = []  # the background probe before each compile, the answer kept after each one that succeeds
    monkeypatch.setattr(_kernels, "probe_isa_in_background", lambda device: around.append(("probe", device)))
    monkeypatch.setattr(_kernels, "_remember_isa", lambda: around.append("kept"))
    calls = []

    def compile_fn(fail: bool = False):
        calls.append(inductor_config.cpp.vec_isa_ok)
        known()  # inductor asks for its list while it compiles
        if fail and len(calls) == 1:
            raise RuntimeError("no such instruction")
        return "compiled"

    assert _kernels._compile_trusting_isa(torch.device("cpu"), compile_fn) == "compiled"
    assert calls == [True] and inductor_config.cpp.vec_isa_ok is None
    assert around == [("probe", torch.device("cpu")), "kept"]
    assert _kernels._compile_trusting_isa(torch.device("cpu"), compile_fn) == "compiled"  # knows now
    assert calls == [True, None]
    for device in (torch.device("cuda"), None):  # nothing of inductor's C++ to build
        known.cache_clear()
        calls.clear()
        _kernels._compile_trusting_isa(device, compile_fn)
        assert calls == [None]
    known.cache_clear()
    calls.clear()
    _kernels._warn_once.cache_clear()
    with pytest.warns(UserWarning, match="trusted failed .*no such instruction.*probes them"):
        assert _kernels._compile_trusting_isa(torch.device("cpu"), lambda: compile_fn(True)) == "compiled"
    assert calls == [True, None]
    record = {"machine": _kernels._isa_machine(), "valid": ["avx2"]}
    (tmp_path / "vec_isa.json").write_text(json.dumps(record))
    monkeypatch.setattr(_kernels, "_isa_candidates", lambda: ["avx512", "avx2"])  # one failed here
    known.cache_clear()
    calls.clear()
    _kernels._compile_trusting_isa(torch.device("cpu"), compile_fn)
    assert calls == [None]


def test_a_kernel_takes_its_batch_dimension_where_it_is_told(tmp_path, monkeypatch):
    """``Kernel(dim=-2)``: the second-to-last dimension of every tensor of rank > 1 is symbolic, so
    new sizes there compile nothing; a dim that is not a negative int is refused."""
    from isaac_net.core import _kernels

    monkeypatch.setattr(_kernels, "_store", lambda: tmp_path)
    kernel = _kernels.Kernel(_kernel_body, dim=-2)
    g = torch.Generator().manual_seed(12)
    for E in (2, 5, 9):
        a, b = (torch.rand(3, E, 4, generator=g, dtype=F64) for _ in range(2))
        for got, want in zip(kernel(a, b), _kernel_body(a, b), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert kernel.num_compiles + kernel.num_loads == 1
    for bad in (0, 1, -1.0, "last", (), (-1, -1), (-1, 0), (-1, True)):
        with pytest.raises(ValueError, match="dim must be a negative int"):
            _kernels.Kernel(_kernel_body, dim=bad)


def test_a_kernel_with_two_symbolic_dimensions_serves_every_pair_of_sizes(tmp_path, monkeypatch):
    """``dim=(-1, -2)``: one graph serves every pair of the last two sizes, also when the two were
    equal when it was traced (each keeps a symbol of its own); a size of 1 is specialised (a graph
    of its own); 1-d arguments stay static."""
    from isaac_net.core import _kernels

    monkeypatch.setattr(_kernels, "_store", lambda: tmp_path)
    kernel = _kernels.Kernel(_kernel_body, dim=(-1, -2))
    g = torch.Generator().manual_seed(13)
    for R, E in ((4, 4), (3, 7), (6, 2), (5, 5)):
        a, b = (torch.rand(2, R, E, generator=g, dtype=F64) for _ in range(2))
        for got, want in zip(kernel(a, b), _kernel_body(a, b), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert (kernel.num_compiles, kernel.num_loads, len(kernel._graphs)) == (1, 0, 1)
    a, b = (torch.rand(2, 1, 3, generator=g, dtype=F64) for _ in range(2))
    torch.testing.assert_close(kernel(a, b)[0], _kernel_body(a, b)[0], rtol=1e-12, atol=0)
    assert kernel.num_compiles == 2  # R = 1: dynamo specialises a size of one
    for bad in (-1, (0, -1), (0, 0), "first"):
        with pytest.raises(ValueError, match="dim must be a non-negative int"):
            _kernels.Precompiled(_precompiled_body, dim=bad)


def test_a_kernel_of_a_function_without_a_source_file_compiles_and_keeps_nothing(tmp_path, monkeypatch):
    """A function defined by ``exec`` (or at a prompt) has no file to hash: nothing would tell a
    changed one from a kept one, so it is compiled in each process and nothing is stored."""
    from isaac_net.core import _kernels

    monkeypatch.setattr(_kernels, "_store", lambda: tmp_path)
    space = {"torch": torch}
    exec("def body(a, b):\n    return (a * b - 2.0,)\n", space)
    assert _kernels._source_key(space["body"]) is None and _kernels._source_key(_kernel_body) is not None
    g = torch.Generator().manual_seed(13)
    a, b = (torch.rand(3, 5, generator=g, dtype=F64) for _ in range(2))
    for kernel in (_kernels.Kernel(space["body"]), _kernels.Kernel(space["body"])):  # as two processes
        (got,) = kernel(a, b)
        torch.testing.assert_close(got, a * b - 2.0, rtol=1e-12, atol=0)
        assert (kernel.num_compiles, kernel.num_loads) == (1, 0)
    assert sorted(f.name for f in tmp_path.iterdir() if f.name != "vec_isa.json") == []


def _precompiled_body(a, b, how: str):
    """A precompiled function (module level, as the store's key names it): tensors and a constant."""
    return (a * b + 1.0 if how == "affine" else a - b), torch.exp(-a) * b


def test_a_precompiled_function_is_loaded_by_a_later_process(tmp_path, monkeypatch):
    """A Precompiled function is compiled once ahead of its call for every batch size and kept on
    disk; a new Precompiled of it (as in a new process) loads it without compiling, its forward and
    backward equal to the function's; a damaged file is compiled again, not trusted."""
    from isaac_net.core import _kernels

    monkeypatch.setattr(_kernels, "_store", lambda: tmp_path)
    g = torch.Generator().manual_seed(10)

    def check(fn, E):
        a, b = (torch.rand(E, 3, generator=g, dtype=F64).requires_grad_() for _ in range(2))
        got, want = fn(a, b, "affine"), _precompiled_body(a, b, "affine")
        grads = [torch.autograd.grad(sum(o.sum() for o in out), (a, b)) for out in (got, want)]
        for x, y in zip((*got, *grads[0]), (*want, *grads[1]), strict=True):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=0)

    first = _kernels.Precompiled(_precompiled_body, tag=("test",))
    for E in (4, 9):
        check(first, E)
    assert (first.num_compiles, first.num_loads, first.num_fallbacks) == (1, 0, 0)
    (kept,) = tmp_path.glob("*.aot")
    second = _kernels.Precompiled(_precompiled_body, tag=("test",))
    check(second, 6)
    assert (second.num_compiles, second.num_loads, second.num_fallbacks) == (0, 1, 0)
    kept.write_bytes(kept.read_bytes()[:1000])  # a write cut short
    third = _kernels.Precompiled(_precompiled_body, tag=("test",))
    check(third, 6)
    assert (third.num_compiles, third.num_loads, third.num_fallbacks) == (1, 0, 0)


def test_a_second_rollout_backpropagates_without_the_first_ones_graph():
    """rollout() starts a graph of its own (the state it starts from is a constant): backpropagating
    a second rollout after the first one's backward works and equals a rollout from that state."""
    p = torch.full((2, 3), 0.6, dtype=F64, requires_grad=True)
    args = (6, p, 200_000.0)  # a queue that does not empty: the second rollout starts from a backlog
    net = DiffFluid(2, 3, mode="L1", tau=0.05, dtype=F64)
    kpi_mix(rollout(net, *args, snr_db=5.0)).backward()
    start = net.state
    p.grad = None
    kpi_mix(rollout(net, *args, snr_db=5.0)).backward()
    g_second = p.grad.clone()
    fresh = DiffFluid(2, 3, mode="L1", tau=0.05, dtype=F64)
    fresh.state = start.detach()
    p.grad = None
    kpi_mix(rollout(fresh, *args, snr_db=5.0)).backward()
    torch.testing.assert_close(g_second, p.grad, rtol=1e-12, atol=0)
    assert float(start.w.sum()) > 1.0


@pytest.mark.slow
@pytest.mark.xdist_group("compiled-L1")
def test_compiled_l1_with_a_latency_floor_equals_eager():
    """A calibrated L1D compiles too (its floor's slots through the gated kernels): values and
    gradients as eager, float64."""
    cfg = dataclasses.replace(COMPILE_CFG, l1_sr_slots=2)
    s = seed_scenario("normal", E=2, R=3, T=5)
    out = []
    for compiled in (False, True):
        p = s.p.clone().requires_grad_()
        net = DiffFluid(2, 3, mode="L1", tau=0.05, cfg=cfg, dtype=F64, compile=compiled)
        k = kpi_mix(rollout(net, s.T, p, s.B, snr_db=s.snr_db))
        out.append((k.detach(), *torch.autograd.grad(k, p)))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-10, atol=0)
    assert float(out[0][1].abs().max()) > 0
    torch.testing.assert_close(out[0][1], out[1][1], rtol=1e-8, atol=1e-12)
    from isaac_net.core.diff import model

    assert model._compiled_step("L1", "recompute").num_fallbacks == 0


@pytest.mark.parametrize("sends", ["mean_field", "relaxed"])
@pytest.mark.parametrize("L", [1, 7, 39, 40])
def test_l1_latency_floor_nodes_equal_the_per_slot_recursion(L, sends):
    """With a latency floor the slot loop is two nodes (the floor's L slots, gated, then the rest
    from the expected bytes offered): values and gradients as autograd through every slot of
    ``_service_l1``'s recursion, float64, at the floor's edges (1, K - 1 and K slots)."""
    g = torch.Generator().manual_seed(11 + L)
    E, R, T = 3, 4, 8
    cfg = CellConfig(l1_sr_slots=L, rate_factor=0.6)
    p0 = 0.2 + 0.6 * torch.rand(E, R, generator=g, dtype=F64)
    B0 = 4e3 + 3e4 * torch.rand(E, R, generator=g, dtype=F64)
    snr0 = 5 + 20 * torch.rand(E, R, generator=g, dtype=F64)
    u = torch.rand(T, E, R, generator=g, dtype=F64)
    res = {}
    for slots in ("autograd", "recompute", "tape"):
        leaves = [t.clone().requires_grad_() for t in (p0, B0, snr0)]
        net = DiffFluid(E, R, mode="L1", tau=0.05, cfg=cfg, dtype=F64)
        net.slot_grad = slots
        k = rollout(net, T, leaves[0], leaves[1], snr_db=leaves[2], warmup=2, sends=sends,
                    u=u if sends == "relaxed" else None)
        loss = kpi_mix(k) + k["delivery_ratio"]
        res[slots] = (loss.detach(), *torch.autograd.grad(loss, leaves))
    for slots in ("recompute", "tape"):
        torch.testing.assert_close(res[slots][0], res["autograd"][0], rtol=1e-12, atol=0)
        for a, b in zip(res[slots][1:], res["autograd"][1:], strict=True):
            assert float(b.abs().max()) > 0
            torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-12)


def test_slot_loop_variants_agree_in_a_rollout():
    """The checkpointed node, the taped node and autograd through every slot give one model."""
    s = seed_scenario("normal", E=3, R=4, T=8)
    out = {}
    for slots in ("recompute", "tape", "autograd"):
        p = s.p.clone().requires_grad_()
        B = s.B.clone().requires_grad_()
        net = DiffFluid(3, 4, mode="L1", tau=0.05, dtype=F64)
        net.slot_grad = slots
        k = rollout(net, s.T, p, B, snr_db=s.snr_db)
        out[slots] = (kpi_mix(k).detach(), *torch.autograd.grad(kpi_mix(k), (p, B)))
    for slots in ("tape", "autograd"):
        for a, b in zip(out["recompute"], out[slots], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert out["recompute"][1].abs().sum() > 0


def test_checkpoint_default_keeps_the_tape_only_when_small():
    assert DiffFluid(16, 8).slot_grad == "tape"
    assert DiffFluid(1024, 8).slot_grad == "recompute"  # 12 E R K float32 = 15.7 MiB per step
    assert DiffFluid(16, 8, checkpoint=True).slot_grad == "recompute"
    assert DiffFluid(1024, 8, checkpoint=False).slot_grad == "tape"
    with pytest.raises(TypeError, match="checkpoint: expected True, False or None, got 'yes'"):
        DiffFluid(4, 2, checkpoint="yes")


def test_full_reset_starts_a_fresh_graph():
    p = torch.full((2, 3), 0.5, dtype=F64, requires_grad=True)
    net = DiffFluid(2, 3, dtype=F64)
    for _ in range(2):
        net.reset()
        k = rollout(net, 4, p, 30_000.0, snr_db=10.0)
        k["mean_delay"].backward()  # a second backward through an old graph would raise
    assert torch.isfinite(p.grad).all()


def test_advance_on_checked_inputs_equals_step():
    """``rollout``'s loop (inputs checked once, radio resolved once) is ``step``."""
    g = torch.Generator().manual_seed(4)
    pos = 40 + 100 * torch.rand(2, 3, 2, generator=g, dtype=F64)
    a, b = DiffFluid(2, 3, dtype=F64), DiffFluid(2, 3, dtype=F64)
    inputs = b.inputs(20_000.0, pos=pos, tx_dbm=20.0, deadline=7.0)
    for _ in range(4):
        send = torch.rand(2, 3, generator=g, dtype=F64)
        ka = a.step(send, 20_000.0, pos=pos, tx_dbm=20.0, deadline=7.0)
        kb = b.advance(send, inputs)
        for key in ka:
            torch.testing.assert_close(ka[key], kb[key], rtol=0, atol=0)
    assert float(ka["delivered"].sum()) > 0


@pytest.mark.parametrize("mode", ["L1", "QA"])
def test_advance_follows_the_temperature_its_inputs_were_not_built_at(mode):
    """Inputs built once, then ``tau`` / ``tau_n`` annealed: the step uses the new temperatures
    (survival and headroom recomputed), as ``step`` does; a stale ``StepInputs`` is refused by
    ``fluid_step``."""
    from isaac_net.core.diff.model import fluid_step

    g = torch.Generator().manual_seed(5)
    a, b = DiffFluid(2, 3, mode=mode, dtype=F64), DiffFluid(2, 3, mode=mode, dtype=F64)
    inputs = b.inputs(150_000.0, snr_db=12.0, deadline=2.6)  # queues build up and time out
    timeouts = 0.0
    for tau, tau_n in ((0.05, None), (0.2, 0.5), (0.02, 0.1)):
        for net in (a, b):
            net.tau, net.tau_n = tau, tau_n
        for _ in range(3):
            send = torch.rand(2, 3, generator=g, dtype=F64)
            ka = a.step(send, 150_000.0, snr_db=12.0, deadline=2.6)
            kb = b.advance(send, inputs)
            for key in ka:
                torch.testing.assert_close(ka[key], kb[key], rtol=0, atol=0)
            timeouts += float(ka["timeouts"].sum())
    assert timeouts > 0.5
    with pytest.raises(ValueError, match=r"inputs: built at \(tau, tau_n\) = \(0.05, 0.05\)"):
        fluid_step(b.state, send, inputs, cfg=b.cfg, mode=mode, tau=0.02, tau_n=0.1)
    with pytest.raises(TypeError, match="inputs: expected DiffFluid.inputs' StepInputs"):
        b.advance(send, (20_000.0, 12.0))


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["L1", "QA"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_diff_fluid_on_cuda_in_float32_matches_cpu(mode, compiled, device="cuda"):
    s = seed_scenario("normal", E=4, R=5, T=12)
    out = {}
    for dev in ("cpu", device):
        p = s.p.to(dev).float().requires_grad_()
        net = DiffFluid(4, 5, dev, mode=mode, tau=0.05, compile=compiled and dev != "cpu")
        got = kpis_and_grads(net, s.T, p, s.B.to(dev).float(), snr_db=s.snr_db.to(dev).float())
        out[dev] = [t.cpu() for t in got]  # kpi_mix, throughput and their gradients
    for i, (rtol, atol) in enumerate(((1e-4, 1e-5), (1e-4, 1e-2), (1e-3, 1e-5), (1e-3, 1e-2))):
        torch.testing.assert_close(out[device][i], out["cpu"][i], rtol=rtol, atol=atol)


def test_the_backlog_closure_serves_a_mean_field_robot_as_whole_messages():
    """``CellConfig.mf_backlog_closure``: a lone mean-field robot sending p = 0.3 of a 12 kB message is
    backlogged with the chance b = 1 - exp(-0.3) of a Poisson count and then holds 0.3 / b = 1.157
    messages, so the message it delivers in the first step finishes when 1.157 whole messages sent by
    a binary robot would (the same rate: one robot in the cell either way); without the closure the
    fractional message finishes in well under half a whole message's time."""
    cfg = CellConfig(qa_sr_slots=0)
    on = dataclasses.replace(cfg, mf_backlog_closure=True)
    B = torch.full((1, 1), 12_000.0, dtype=F64)
    snr = torch.full((1, 1), 20.0, dtype=F64)

    def first_step(c, send):
        net = DiffFluid(1, 1, mode="QA", tau=0.002, cfg=c, dtype=F64)
        out = net.step(torch.full((1, 1), send, dtype=F64), B, snr_db=snr)
        return float(out["delivered"]), float(out["delay_sum"])

    whole_delivered, whole_delay = first_step(cfg, 1.0)
    assert whole_delivered == pytest.approx(1.0, abs=1e-6) and 0.05 < whole_delay < 0.95
    delivered, delay_sum = first_step(on, 0.3)
    assert delivered == pytest.approx(0.3, rel=1e-6)
    held = 0.3 / (1.0 - math.exp(-0.3))  # messages held while backlogged
    assert delay_sum / delivered == pytest.approx(held * whole_delay, rel=1e-3)
    plain_delivered, plain_delay = first_step(cfg, 0.3)
    # without it the fractional message finishes early: 0.3 of a whole message's bytes, at a rate a
    # little lower (the PF gain of 0.3 robots backlogged), 0.40 of the whole message's time here
    assert plain_delivered == pytest.approx(0.3, rel=1e-6)
    assert 0.3 * whole_delay < plain_delay / plain_delivered < 0.5 * whole_delay


def test_the_backlog_closure_counts_the_robots_a_backlogged_robot_shares_with():
    """The closure's busy chance and count (``relax.backlog_closure``): 1 - exp(-m) per robot, and
    for each robot 1 plus the others' chances (a robot with nothing queued counts ~0 for the others);
    the chance's derivative exp(-m), 0 on its floor, as autograd's."""
    from isaac_net.core.diff.relax import backlog_closure

    mass = torch.tensor([[0.3, 1.5, 0.0, 2e-7]], dtype=F64, requires_grad=True)  # [E=1, R=4]
    busy, n, d_busy = backlog_closure(mass)
    expect = [1.0 - math.exp(-0.3), 1.0 - math.exp(-1.5), 1e-6, 1e-6]
    torch.testing.assert_close(busy, torch.tensor([expect], dtype=F64), rtol=1e-12, atol=0.0)
    others = [sum(expect) - b for b in expect]
    torch.testing.assert_close(n, 1.0 + torch.tensor([others], dtype=F64), rtol=1e-12, atol=0.0)
    torch.testing.assert_close(d_busy, torch.tensor([[math.exp(-0.3), math.exp(-1.5), 0.0, 0.0]], dtype=F64),
                               rtol=1e-12, atol=0.0)
    grad, = torch.autograd.grad(busy.sum(), mass)
    torch.testing.assert_close(d_busy, grad, rtol=1e-12, atol=0.0)


def _calibrated_rule_checks(s, cfg: CellConfig, seed: int, tau: float = 0.1, fused: bool = False):
    """QAD with ``cfg`` (a calibrated rule) on scenario ``s`` in float64: it runs on the fused node
    (``fused``) or through autograd of ``_step`` (a rule the node has not), conserves mass, keeps
    delivery in [0, 1], has d kpi_mix / d p equal to central differences along a random direction, and
    KPIs other than the plain cell's. Returns the kpi_mix of a rollout ``p -> float`` with ``cfg``
    replaced."""
    E, R = s.p.shape

    def run(c, p):
        return rollout(DiffFluid(E, R, mode="QA", tau=tau, cfg=c, dtype=F64), s.T, p, s.B.to(F64),
                       snr_db=s.snr_db.to(F64), warmup=2)

    assert DiffFluid(E, R, mode="QA", tau=tau, cfg=cfg, dtype=F64).fused_rollout == fused
    p = s.p.to(F64).clone().requires_grad_()
    k = run(cfg, p)
    assert 0.0 <= float(k["delivery_ratio"]) <= 1.0
    left = k["delivered"] + k["timeouts"] + k["overflow"] + k["queued_msgs"]
    torch.testing.assert_close(left.detach(), k["offered"].detach(), rtol=0, atol=TOL["mass_abs"])
    g, = torch.autograd.grad(kpi_mix(k), p)
    d = torch.randn(p.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    h = 1e-6

    def mix(c, x):
        return float(kpi_mix(run(c, x)))

    fd = (mix(cfg, s.p.to(F64) + h * d) - mix(cfg, s.p.to(F64) - h * d)) / (2 * h)
    assert float((g * d).sum()) == pytest.approx(fd, rel=TOL["fd_rel"], abs=1e-8)
    assert abs(mix(s.cfg, s.p.to(F64)) - float(kpi_mix(k))) > 1e-6
    return mix


def _fused_equals_autograd(s, cfg: CellConfig, tau: float = 0.1) -> None:
    """QAD's rollout with ``cfg`` on scenario ``s`` on the fused node equals autograd of ``_step``
    (``slot_grad="autograd"``) in float64: every batch KPI and d kpi_mix / d p."""
    E, R = s.p.shape
    outs, grads = [], []
    for slot_grad in ("recompute", "autograd"):
        net = DiffFluid(E, R, mode="QA", tau=tau, cfg=cfg, dtype=F64)
        net.slot_grad = slot_grad
        assert net.fused_rollout == (slot_grad == "recompute")
        p = s.p.to(F64).clone().requires_grad_()
        k = rollout(net, s.T, p, s.B.to(F64), snr_db=s.snr_db.to(F64), warmup=2)
        outs.append(torch.stack([k[name].detach() for name in BATCH_KEYS]))
        grads.append(torch.autograd.grad(kpi_mix(k), p)[0])
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_the_backlog_closure_runs_on_the_fused_node_as_its_reference_does(seed):
    """With the closure QAD runs on the fused node: mass conserved and delivery in [0, 1] on random
    scenarios, gradients equal to central differences in float64, other KPIs than without it, KPIs
    and d kpi_mix / d p equal to autograd of ``_step``; at tau = 0 (the hard path) the closure is off,
    so the discrete equivalence is untouched; and sampled sends with it are refused."""
    s = random_scenario(seed)
    on = dataclasses.replace(s.cfg, mf_backlog_closure=True)
    E, R = s.p.shape
    _calibrated_rule_checks(s, on, seed, fused=True)
    _fused_equals_autograd(s, on)
    hard = [rollout(DiffFluid(E, R, mode="QA", tau=0.0, cfg=c, dtype=F64), s.T, s.p.to(F64), s.B.to(F64),
                    snr_db=s.snr_db.to(F64), warmup=2) for c in (on, s.cfg)]
    assert float(kpi_mix(hard[0])) == float(kpi_mix(hard[1]))
    with pytest.raises(ValueError, match="sends: the cell's mf_backlog_closure is mean-field sends'"):
        rollout(DiffFluid(E, R, mode="QA", tau=0.1, cfg=on, dtype=F64), s.T, s.p, s.B, snr_db=s.snr_db,
                sends="relaxed", u=s.u)


def test_the_backlog_closure_must_be_a_bool():
    with pytest.raises(ValueError, match="CellConfig.mf_backlog_closure must be a bool, got 1"):
        CellConfig(mf_backlog_closure=1)


@pytest.mark.parametrize("a", [0.3, 1.0])
@pytest.mark.parametrize("case", ["normal", "overload", "calibrated"])
def test_qa_reshared_time_equals_the_discrete_level_at_tau_zero(case, a):
    """QAD with ``qa_reshare`` at tau = 0 (``model._level_hard``: the levels from the knots of the
    sums, no sort) against the QA level's closed form (``qa._level_of``: sorted needs), on the seed's
    cases; the re-shared time moves the delays (more messages delivered in the overload, where every
    robot stays backlogged)."""
    s = seed_scenario(case)
    s = dataclasses.replace(s, cfg=dataclasses.replace(s.cfg, qa_reshare=a))
    ref, out = both(s, "QA")
    assert_equivalent(ref, out)
    static = discrete_rollout("QA", s.T, s.p, s.B, snr_db=s.snr_db, u=s.u, deadline=s.deadline,
                              cfg=dataclasses.replace(s.cfg, qa_reshare=0.0), dtype=F64)
    assert (ref["delay_sum"] - static["delay_sum"]).abs().max() > 1e-3  # steps


@pytest.mark.parametrize("seed", range(3))
def test_finish_time_sums_by_sorted_prefix_sums_equal_the_sums_over_robot_pairs(seed):
    """``model._served_at`` (sorted prefix sums) against the sums over robot pairs it replaces,
    ``sum_j b_j ((1 - e_j) min(V_j, l) + e_j min(V_j, (l - L_s)+))``, in value and in the gradients
    of a random weighting with respect to V, b, e, the levels and L_s (float64; ties in V and
    levels at a V included, where both sides take the same one-sided slope)."""
    from isaac_net.core.diff.model import _served_at

    g = torch.Generator().manual_seed(seed)
    E, R, A = 5, 7, 4
    V = torch.rand(E, R, generator=g, dtype=F64)
    V[:, 1] = V[:, 0]  # a tie
    b, e = torch.rand(E, R, generator=g, dtype=F64), torch.rand(E, R, generator=g, dtype=F64)
    levels = 1.2 * torch.rand(E, R, A, generator=g, dtype=F64)
    levels[:, 0, 0] = V[:, 2] + 1e-3  # just above a robot's need
    L_s = 0.3 * torch.rand(E, 1, generator=g, dtype=F64)
    w = torch.randn(E, R, A, generator=g, dtype=F64)
    args = [t.clone().requires_grad_() for t in (V, b, e, levels, L_s)]

    def pairs(V, b, e, levels, L_s):
        q, Vw, bw, ew = levels.unsqueeze(-1), V[:, None, None, :], b[:, None, None, :], e[:, None, None, :]
        late = torch.minimum(Vw, torch.clamp(q - L_s[:, None, None, :], min=0.0))
        return (bw * ((1.0 - ew) * torch.minimum(Vw, q) + ew * late)).sum(-1)

    got = _served_at(*args)
    ref = pairs(*args)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)
    g_got = torch.autograd.grad((w * got).sum(), args)
    g_ref = torch.autograd.grad((w * ref).sum(), args)
    for a_, b_ in zip(g_got, g_ref, strict=True):
        torch.testing.assert_close(a_, b_, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_qa_reshared_time_conserves_mass_with_central_difference_gradients(seed):
    """With ``qa_reshare`` QAD runs through autograd of ``_step`` (the fused node has no re-shared
    time), its levels from Newton steps and one differentiable step at the root (the implicit
    gradient): mass conserved and delivery in [0, 1] on random scenarios, d kpi_mix / d p equal to
    central differences in float64, and at a share of 1e-9 the static share's KPIs."""
    s = random_scenario(seed)
    mix = _calibrated_rule_checks(s, dataclasses.replace(s.cfg, qa_reshare=0.6), seed)
    tiny = mix(dataclasses.replace(s.cfg, qa_reshare=1e-9), s.p.to(F64))
    assert tiny == pytest.approx(mix(s.cfg, s.p.to(F64)), rel=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_qa_grant_width_runs_on_the_fused_node_as_its_reference_does(seed):
    """With ``qa_min_grant_subbands`` > 1 QAD's rollout runs on the fused node: mass conserved, delivery
    in [0, 1], d kpi_mix / d p equal to central differences, KPIs other than QA's rule (K = 1), and its
    KPIs and d kpi_mix / d p equal autograd of ``_step`` (``slot_grad="autograd"``) in float64; just
    above 1 the width gives QA's rule's KPIs."""
    s = random_scenario(seed)
    s = dataclasses.replace(s, cfg=dataclasses.replace(s.cfg, num_subbands=max(s.cfg.num_subbands, 4)))
    wide = dataclasses.replace(s.cfg, qa_min_grant_subbands=3.0)
    mix = _calibrated_rule_checks(s, wide, seed, fused=True)
    _fused_equals_autograd(s, wide)
    near = mix(dataclasses.replace(s.cfg, qa_min_grant_subbands=1.0 + 1e-9), s.p.to(F64))
    assert near == pytest.approx(mix(s.cfg, s.p.to(F64)), rel=1e-6)  # just above 1: QA's rule


def test_qa_grant_width_is_qas_and_refused_elsewhere():
    with pytest.raises(ValueError, match="L2-legacy takes no calibration constants"):
        from isaac_net.core import make_engine

        make_engine("L2-legacy", 2, 4, cfg=CellConfig(qa_min_grant_subbands=3.0))
    for bad in (0.5, 13.0):
        with pytest.raises(ValueError, match=r"CellConfig.qa_min_grant_subbands must lie in \[1, "):
            CellConfig(qa_min_grant_subbands=bad)
    assert CellConfig(qa_min_grant_subbands=3.0).is_calibrated and not CellConfig().is_calibrated


def test_qa_reshare_is_a_share_and_not_with_the_backlog_closure():
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="CellConfig.qa_reshare must"):
            CellConfig(qa_reshare=bad)
    with pytest.raises(ValueError, match="CellConfig.qa_reshare must be 0 with mf_backlog_closure"):
        CellConfig(qa_reshare=0.5, mf_backlog_closure=True)
    with pytest.raises(ValueError, match="L2-legacy takes no calibration constants"):
        from isaac_net.core import make_engine

        make_engine("L2-legacy", 2, 4, cfg=CellConfig(qa_reshare=0.5))
