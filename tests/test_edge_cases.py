"""Bad input and edge cases (issue 15): a clear error naming the argument, or a valid, documented
result, at every public entry point; never a silent wrong one. One parametrised test per class."""

import dataclasses
import math
import warnings

import pytest
import torch
from problems import random_scenario, seed_scenario

from isaac_net.core import CellConfig
from isaac_net.core.diff import DiffFluid, relaxed_bernoulli, rollout
from isaac_net.core.diff import proxy as px
from isaac_net.core.diff.reference import discrete_rollout
from isaac_net.core.kpi import KpiAccumulator
from isaac_net.core.levels import L2LegacyConfig, make_engine

F32, F64 = torch.float32, torch.float64
LEVELS = ("L1", "QA", "L2-legacy")
MODELS = [(mode, sends) for mode in ("L1", "QA") for sends in ("mean_field", "relaxed", "binary")]
# float rounding of the relaxed counts (conservation holds to this in float64)
COUNT_TOL = 1e-9


def _quick_start_loss(k):
    return k["mean_delay"] + 0.5 * k["mean_aoi"] + 50.0 * k["mean_energy_j"]


def _assert_kpi_bounds(k, tol=0.0):
    """0 <= delivery <= 1, AoI >= 1, delay >= 0, energy >= 0, batch KPIs finite; per robot NaN only
    where the documented definition says so; the window's counts conserve messages."""
    for name in ("mean_delay", "delivery_ratio", "mean_aoi", "mean_energy_j"):
        assert bool(torch.isfinite(k[name])), name
    assert -tol <= float(k["delivery_ratio"]) <= 1.0 + tol
    assert float(k["mean_aoi"]) >= 1.0 - tol and float(k["mean_delay"]) >= 0.0
    assert float(k["mean_energy_j"]) >= 0.0
    offered, delivered = k["offered"], k["delivered"]
    assert bool((torch.isnan(k["delivery"]) == (offered <= 0)).all())
    assert bool((torch.isnan(k["delay"]) == (delivered <= 0)).all())
    d = k["delivery"][offered > 0]
    assert bool(((d >= -tol) & (d <= 1.0 + tol)).all()), d
    assert bool((k["delay"][delivered > 0] >= 0).all()) and bool((k["aoi"] >= 1.0 - tol).all())
    assert bool((k["energy_j"] >= 0).all())
    balance = delivered + k["timeouts"] + k["overflow"] + k["queued_msgs"]
    torch.testing.assert_close(offered, balance, rtol=0, atol=max(tol, COUNT_TOL) * 10)


# ---------------------------------------------------------------- KPI definitions


def test_the_issue_case_counts_the_queue_at_the_warm_up_as_offered():
    """A message offered at t = 0 and delivered after a 1-step warm-up was inf; it is one of one."""
    k = discrete_rollout("L1", 2, torch.full((1, 1), 0.5), 50e3, snr_db=10.0, warmup=1,
                         u=torch.tensor([[[0.0]], [[0.99]]]))
    assert float(k["offered"]) == 1.0 and float(k["delivered"]) == 1.0 and float(k["delivery_ratio"]) == 1.0


def test_kpi_accumulator_window_starts_with_its_queue():
    acc = KpiAccumulator(warmup=1)
    zero, one = torch.zeros(1, 1), torch.ones(1, 1)
    step = dict(offered=one, delivered=zero, delay_sum=zero, timeouts=zero, overflow=zero, energy_j=zero,
                aoi=one, throughput_bytes_per_s=zero, queued_msgs=one)
    acc.add(step)
    acc.add({**step, "offered": zero, "delivered": one, "delay_sum": 2 * one, "queued_msgs": zero,
             "throughput_bytes_per_s": 8000.0 * one})
    out = acc.result()
    assert float(out["offered"]) == 1.0 and float(out["delivery_ratio"]) == 1.0
    assert float(out["mean_delay"]) == 2.0
    assert float(out["mean_throughput_bytes_per_s"]) == 8000.0  # the window's one step


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("level", LEVELS)
def test_kpi_bounds_every_level(level, seed):
    s = random_scenario(seed)
    warmup = s.T // 3 + seed  # >= 3: messages are queued at the warm-up
    k = discrete_rollout(level, s.T, s.p, s.B, snr_db=s.snr_db, deadline=s.deadline, warmup=warmup, u=s.u,
                         cfg=s.cfg, seed=seed)
    _assert_kpi_bounds(k)
    assert float(k["offered"].sum()) > 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode, sends", MODELS)
def test_kpi_bounds_every_model(mode, sends, seed):
    """DiffFluid, each mode and kind of sends, two rollouts in a row (the second starts from the
    first's queue, with and without a warm-up) and at tau = 0."""
    s = random_scenario(10 + seed)
    for tau in (0.05, 0.0):
        net = DiffFluid(s.E, s.R, mode=mode, tau=tau, cfg=s.cfg, dtype=F64)
        u = None if sends == "mean_field" else s.u
        for warmup in (s.T // 3, 0):
            k = rollout(net, s.T, s.p, s.B, snr_db=s.snr_db, deadline=s.deadline, warmup=warmup,
                        sends=sends, u=u)
            _assert_kpi_bounds(k, tol=1e-9)


@pytest.mark.parametrize("warmup", [0, 2])
def test_qa_rollout_node_counts_the_starting_queue_as_the_steps_do(warmup):
    """The fused QAD rollout adds the window's starting queue to offered in its forward and its
    backward: values and gradients equal autograd through every step, from a non-empty state."""
    s = seed_scenario("overload", E=2, R=3, T=8)
    out = {}
    for how in ("rollout", "autograd"):
        p, B, snr = (t.clone().requires_grad_() for t in (s.p, s.B, s.snr_db))
        net = DiffFluid(2, 3, mode="QA", tau=0.05, cfg=s.cfg, dtype=F64)
        if how == "autograd":
            net.slot_grad = "autograd"
        rollout(net, 5, p, B, snr_db=snr)  # a queue to start from
        k = rollout(net, s.T, p, B, snr_db=snr, warmup=warmup)
        total = k["offered"].sum() + k["delivery_ratio"] + _quick_start_loss(k)
        out[how] = (total.detach(), k["offered"].detach(), *torch.autograd.grad(total, (p, B, snr)))
    for a, b in zip(out["rollout"], out["autograd"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-12)


CASES = {
    "p=0": dict(p=0.0),
    "1 byte": dict(B=1.0),
    "10 MB": dict(B=1e7),
    "SNR -30 dB": dict(snr=-30.0),
    "SNR 60 dB": dict(snr=60.0),
    "random mix": dict(),
}


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("mode", ["L1", "QA"])
@pytest.mark.parametrize("case", list(CASES))
def test_quick_start_gradients_are_finite(case, mode, dtype):
    """mean_delay + 0.5 mean_aoi + 50 mean_energy_j and its gradients stay finite where nothing is
    delivered (p = 0, float32 at -30 dB where deliveries underflow) and at the size and SNR edges."""
    g = torch.Generator().manual_seed(len(case))
    E, R = 3, 4
    c = CASES[case]
    p = torch.rand(E, R, generator=g, dtype=F64) if "p" not in c else torch.full((E, R), c["p"], dtype=F64)
    p[0, 0] = 0.0
    B = torch.full((E, R), c["B"]) if "B" in c else 10.0 ** (7.0 * torch.rand(E, R, generator=g, dtype=F64))
    snr = torch.full((E, R), c["snr"]) if "snr" in c else -30.0 + 90.0 * torch.rand(E, R, generator=g)
    leaves = [t.to(dtype).requires_grad_() for t in (p, B, snr)]
    for sends in ("mean_field", "relaxed"):
        net = DiffFluid(E, R, mode=mode, dtype=dtype)
        k = rollout(net, 6, *leaves[:2], snr_db=leaves[2], warmup=2, sends=sends, generator=g)
        loss = _quick_start_loss(k)
        grads = torch.autograd.grad(loss, leaves)
        assert bool(torch.isfinite(loss)) and all(bool(torch.isfinite(gr).all()) for gr in grads), sends
        _assert_kpi_bounds({kk: v.detach() if isinstance(v, torch.Tensor) else v for kk, v in k.items()},
                           tol=1e-4 if dtype == F32 else 1e-9)
        if case == "p=0" and sends == "mean_field":  # relaxed sends at p = 0 are tiny, not 0
            assert float(k["mean_delay"].detach()) == 0.0 and float(k["delivery_ratio"].detach()) == 0.0


@pytest.mark.parametrize("level", LEVELS)
def test_nothing_offered_gives_the_documented_batch_kpis(level):
    k = discrete_rollout(level, 6, torch.zeros(2, 3), 1e4, snr_db=10.0, warmup=2, seed=0)
    assert float(k["mean_delay"]) == 0.0 and float(k["delivery_ratio"]) == 0.0
    assert bool(torch.isnan(k["delay"]).all()) and bool(torch.isnan(k["delivery"]).all())
    assert float(k["mean_aoi"]) == pytest.approx((3 + 4 + 5 + 6) / 4)


# ---------------------------------------------------------------- validated ranges


def _engines(E=2, R=3):
    yield from ((lvl, make_engine(lvl, E, R, dtype=F64, seed=0)) for lvl in LEVELS)
    for mode in ("L1", "QA"):
        yield mode + "D", DiffFluid(E, R, mode=mode, dtype=F32)


BAD_STEP_INPUTS = [
    (dict(msg_bytes=1e38), ValueError, r"msg_bytes: expected sizes in \(0, 1e\+09\] bytes"),
    (dict(msg_bytes=0.0), ValueError, "msg_bytes: expected sizes > 0"),
    (dict(msg_bytes=float("inf")), ValueError, "msg_bytes: expected finite"),
    (dict(msg_bytes=torch.ones(2, 3, dtype=torch.bool)), TypeError, "msg_bytes: .*got a bool"),
    (dict(msg_bytes=True), TypeError, "msg_bytes: .*got a bool"),
    (dict(tx_dbm=1000.0, snr_db=None, pos=torch.full((2, 3, 2), 50.0)), ValueError,
     r"tx_dbm: expected transmit powers in \[-50.0, 60.0\] dBm"),
    (dict(tx_dbm=-80.0), ValueError, "tx_dbm: expected transmit powers"),
    (dict(snr_db=1e4), ValueError, r"snr_db: expected SNRs in \[-150.0, 150.0\] dB"),
    (dict(snr_db="abc"), TypeError, "snr_db: expected a torch.Tensor or a number"),
]


@pytest.mark.parametrize("kwargs, exc, match", BAD_STEP_INPUTS)
def test_physical_inputs_outside_their_range_are_refused(kwargs, exc, match):
    for name, net in _engines():
        args = dict(send=torch.ones(2, 3), msg_bytes=1e4, snr_db=10.0)
        with pytest.raises(exc, match=match):
            net.step(**{**args, **kwargs})
        assert name


def test_range_edges_are_valid_and_finite():
    for _, net in _engines():
        out = net.step(torch.ones(2, 3), 1e9, snr_db=torch.tensor([[-150.0, 0.0, 150.0]]), tx_dbm=60.0)
        assert all(bool(torch.isfinite(v).all()) for v in out.values())


@pytest.mark.parametrize("env_ids, exc, match", [
    ([0.7], TypeError, "env_ids: expected integer env indices"),
    ([1.5], TypeError, "env_ids: expected integer env indices"),
    ("abc", TypeError, "env_ids: expected integer env indices"),
    (object(), TypeError, "env_ids: expected integer env indices"),
    ([2], ValueError, r"env_ids: expected indices in \[0, 2\)"),
    ([True, False, True], ValueError, "env_ids: expected a bool mask of 2 envs"),
])
def test_reset_takes_integer_ids_or_a_bool_mask(env_ids, exc, match):
    for _, net in _engines():
        with pytest.raises(exc, match=match):
            net.reset(env_ids)
        net.reset([1])
        net.reset(torch.tensor([True, False]))


@pytest.mark.parametrize("value, exc, match", [
    ("abc", TypeError, "tau: expected a real number >= 0.*got 'abc'"),
    (None, TypeError, "tau: expected a real number >= 0, got None"),
    (torch.tensor([0.1, 0.2]), TypeError, r"tau: expected a real number >= 0.*got a tensor of shape \[2\]"),
    (True, TypeError, "tau: expected a real number >= 0.*got True"),
    (-0.1, ValueError, "tau: expected a finite temperature in \\[0, 10\\], got -0.1"),
    (float("nan"), ValueError, "tau: expected a finite temperature in \\[0, 10\\], got nan"),
    (1e40, ValueError, "tau: expected a finite temperature in \\[0, 10\\], got 1e\\+40"),
])
def test_temperatures_are_checked(value, exc, match):
    with pytest.raises(exc, match=match):
        DiffFluid(2, 3, tau=value)
    net = DiffFluid(2, 3)
    with pytest.raises(exc, match=match):
        net.tau = value
    if value is not None:  # tau_n = None: follow tau
        with pytest.raises(exc, match=match.replace("tau:", "tau_n:")):
            net.tau_n = value
    net.tau = torch.tensor(0.2)
    assert net.tau == pytest.approx(0.2) and isinstance(net.tau, float)
    net.tau_n = None
    assert net.tau_n == net.tau


@pytest.mark.parametrize("lam, exc, match", [
    (float("nan"), ValueError, "lam: expected a finite temperature in \\[0, 10\\]"),
    (float("inf"), ValueError, "lam: expected a finite temperature in \\[0, 10\\]"),
    (-0.1, ValueError, "lam: expected a finite temperature in \\[0, 10\\]"),
    ("abc", TypeError, "lam: expected a real number >= 0"),
])
def test_send_relaxation_inputs_are_checked(lam, exc, match):
    net = DiffFluid(2, 3)
    with pytest.raises(exc, match=match):
        rollout(net, 3, 0.5, 1e4, snr_db=10.0, sends="relaxed", lam=lam)
    u = torch.full((2, 3), 0.5)
    with pytest.raises(exc, match=match):
        relaxed_bernoulli(torch.full((2, 3), 0.5), u, lam)


@pytest.mark.parametrize("p, u, match", [
    (1.5, 0.5, r"p: expected values in \[0, 1\]"),
    (-0.1, 0.5, r"p: expected values in \[0, 1\]"),
    (float("nan"), 0.5, r"p: expected values in \[0, 1\], got NaN"),
    (0.5, 2.0, r"u: expected values in \[0, 1\]"),
])
def test_relaxed_bernoulli_refuses_what_it_used_to_clamp(p, u, match):
    with pytest.raises(ValueError, match=match):
        relaxed_bernoulli(torch.full((3,), p), torch.full((3,), u), 0.1)
    assert relaxed_bernoulli(torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5]), 0.1).tolist() == \
        pytest.approx([0.0, 1.0], abs=1e-6)


def test_uniforms_with_mean_field_sends_are_an_error():
    with pytest.raises(ValueError, match="u: mean-field sends use no uniforms"):
        rollout(DiffFluid(2, 3), 3, 0.5, 1e4, snr_db=10.0, u=torch.rand(3, 2, 3))


@pytest.mark.parametrize("build, match", [
    (lambda: CellConfig(step_s=True), "CellConfig.step_s must be a finite number > 0, got True"),
    (lambda: CellConfig(num_slots=True), "CellConfig.num_slots must be an integer >= 1"),
    (lambda: CellConfig(tx_dbm=float("inf")), "CellConfig.tx_dbm must be a finite number"),
    (lambda: L2LegacyConfig(mcs_se=(0.2, math.inf)),
     "L2LegacyConfig.mcs_se must be a non-empty tuple of finite"),
    (lambda: L2LegacyConfig(mcs_se=(0.2, float("nan"))), "L2LegacyConfig.mcs_se"),
    (lambda: L2LegacyConfig(mcs_se=()), "L2LegacyConfig.mcs_se"),
    (lambda: L2LegacyConfig(mcs_se=(0.2, True)), "L2LegacyConfig.mcs_se"),
    (lambda: L2LegacyConfig(olla_up_db=True), "L2LegacyConfig.olla_up_db must be a finite number >= 0"),
    (lambda: L2LegacyConfig(sr_grant_bytes=True),
     "L2LegacyConfig.sr_grant_bytes must be a finite number > 0"),
    (lambda: L2LegacyConfig(pf_beta="x"), r"L2LegacyConfig.pf_beta must be in \[0, 1\)"),
])
def test_configs_refuse_bools_and_non_finite_values(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_a_high_tx_dbm_default_is_refused_by_the_config():
    # CellConfig's physical range of tx_dbm is the one the steps accept (it used to pass the config
    # and be refused at every level's step).
    with pytest.raises(ValueError, match=r"CellConfig\.tx_dbm must lie in \[-50, 60\] dBm, got 1000"):
        dataclasses.replace(CellConfig(), tx_dbm=1000.0)


# ---------------------------------------------------------------- engines, sizes, seeds, devices


@pytest.mark.parametrize("call, match", [
    (lambda: discrete_rollout("L1", 3, 0.5 * torch.ones(2, 3), 1e4, snr_db=10.0,
                              engine=make_engine("QA", 2, 3, dtype=F64)),
     "engine: expected an engine of level 'L1', got 'QA'"),
    (lambda: discrete_rollout("QA", 3, 0.5 * torch.ones(2, 3), 1e4, snr_db=10.0,
                              engine=make_engine("QA", 4, 4, dtype=F64)),
     r"engine: expected an engine of E=2, R=3 \(the inputs' \[E, R\]\), got E=4, R=4"),
    (lambda: discrete_rollout("QA", 3, 0.5 * torch.ones(2, 3), 1e4, snr_db=10.0, cfg=CellConfig(num_slots=8),
                              engine=make_engine("QA", 2, 3, dtype=F64)),
     "engine: built with another CellConfig"),
    (lambda: discrete_rollout("L1", 3, 0.5 * torch.ones(2, 3), torch.full((3, 3), 1e4), snr_db=10.0),
     r"p, B: expected \[E, R\] inputs that broadcast together, got p \[2, 3\], B \[3, 3\]"),
    (lambda: discrete_rollout("L1", 3, 0.5 * torch.ones(2, 3, 1), 1e4, snr_db=10.0),
     r"p: expected \[E, R\] inputs, got p \[2, 3, 1\]"),
    (lambda: rollout(DiffFluid(2, 3), 3, 0.5 * torch.ones(3, 3), 1e4, snr_db=10.0),
     r"p: expected shape \[2, 3\]"),
])
def test_engines_and_shapes_must_match_the_call(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("seed", [2**64, -1, 1.5, True, "0"])
def test_seeds_are_checked(seed):
    for level in LEVELS:
        with pytest.raises(ValueError, match=r"seed: expected an integer in \[0, 2\*\*64 - 1\] or None"):
            make_engine(level, 2, 3, seed=seed)
    assert make_engine("L2-legacy", 2, 3, seed=2**64 - 1).seed == 2**64 - 1


BAD_DEVICES = [("xyz", "device: expected one of cpu, cuda"),
               ("meta", "device: expected one of cpu, cuda, got 'meta'"),
               (torch.device("meta"), "device: expected one of cpu, cuda")]
if not torch.cuda.is_available():
    BAD_DEVICES += [("cuda", "device: 'cuda' requested but CUDA is not available"),
                    ("cuda:7", "device: 'cuda:7' requested but CUDA is not available")]
else:
    BAD_DEVICES += [(f"cuda:{torch.cuda.device_count()}", "device: expected a CUDA index")]


@pytest.mark.parametrize("device, match", BAD_DEVICES)
def test_devices_are_checked(device, match):
    for build in (lambda: make_engine("L1", 2, 3, device), lambda: make_engine("L2-legacy", 2, 3, device),
                  lambda: DiffFluid(2, 3, device),
                  lambda: discrete_rollout("QA", 2, 0.5 * torch.ones(2, 3), 1e4, snr_db=10.0, device=device)):
        with pytest.raises(ValueError, match=match):
            build()


# ---------------------------------------------------------------- the neural proxy


@pytest.fixture(scope="module")
def collected():
    ranges = {"p": (0.2, 0.8), "msg_bytes": (3000.0, 9000.0), "snr_db": (10.0, 20.0)}
    return px.collect("L1", 24, 3, 8, warmup=2, seed=0, ranges=ranges, batch_cells=12)


@pytest.fixture(scope="module")
def small_proxy(collected):
    return px.fit(collected, hidden=(8,), epochs=20, batch_size=16, seed=0)[0]


def test_proxy_remembers_what_it_was_fitted_on(collected, small_proxy, tmp_path):
    assert small_proxy.ranges == {"p": (0.2, 0.8), "msg_bytes": (3000.0, 9000.0), "snr_db": (10.0, 20.0)}
    on = small_proxy.fitted_on
    assert (on["level"], on["R"], on["T"], on["warmup"]) == ("L1", 3, 8, 2)
    assert on["cfg"] == dataclasses.asdict(CellConfig())
    path = tmp_path / "p.pt"
    small_proxy.save(path)
    again = px.Proxy.load(path, level="L1", R=3, cfg=CellConfig())
    assert again.fitted_on == on and again.ranges == small_proxy.ranges
    # raw tensors: the inputs' own extent, the level and R unknown
    raw = px.fit(collected["x"], collected["y"], hidden=(4,), epochs=1)[0]
    assert raw.ranges["p"] == (float(collected["x"][:, 0].min()), float(collected["x"][:, 0].max()))
    assert raw.fitted_on["R"] is None


@pytest.mark.parametrize("call, match", [
    (lambda m, path: m.predict(torch.full((2, 16), 0.5), 5000.0, 15.0),
     "R: the proxy was fitted on cells of R=3"),
    (lambda m, path: m.predict(torch.full((2, 3), 0.5), 5000.0, 15.0, cfg=CellConfig(num_subbands=4)),
     r"cfg: the proxy was fitted on another CellConfig \(differs in \['num_subbands'\]\)"),
    (lambda m, path: px.Proxy.load(path, R=16),
     "R: the proxy was fitted on cells of R=3 robots, load got R=16"),
    (lambda m, path: px.Proxy.load(path, level="L2-legacy"), "level: the proxy was fitted on level 'L1'"),
])
def test_proxy_refuses_another_cell(small_proxy, tmp_path, call, match):
    path = tmp_path / "p.pt"
    small_proxy.save(path)
    with pytest.raises(ValueError, match=match):
        call(small_proxy, path)


def test_proxy_warns_once_outside_its_ranges_and_keeps_delivery_in_0_1(collected):
    proxy = px.fit(collected, hidden=(8,), epochs=2, seed=1)[0]
    p = torch.tensor([[0.0, 1.0, 0.5]])
    warned = r"p: values in \[0, 1\] leave the proxy's training range \[0.2, 0.8\]"
    with pytest.warns(UserWarning, match=warned):
        out = proxy.predict(p, torch.tensor([[1.0, 5e6, 1e9]]), torch.tensor([[-30.0, 60.0, 15.0]]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = proxy.predict(p, torch.tensor([[1.0, 5e6, 1e9]]), torch.tensor([[-30.0, 60.0, 15.0]]))
        proxy.predict(torch.full((1, 3), 0.5), 5000.0, 15.0)
    d = out["delivery"]
    assert bool(((d >= 0) & (d <= 1)).all())


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(epochs=-1), ValueError, "epochs: expected an integer >= 1, got -1"),
    (dict(epochs=0), ValueError, "epochs: expected an integer >= 1"),
    (dict(batch_size=0), ValueError, "batch_size: expected an integer >= 1, got 0"),
    (dict(lr=float("nan")), ValueError, "lr: expected a finite number > 0"),
    (dict(hidden=(0,)), ValueError, "hidden: expected layer widths >= 1"),
    (dict(nan_x=True), ValueError, "x: expected finite raw inputs, got NaN or inf in 1 samples"),
    (dict(inf_y=True), ValueError, "y: expected finite KPIs or NaN"),
    (dict(ranges={"p": (0.0, 1.0), "msg_bytes": (1.0, 2.0), "snr_db": (0.0, 1.0)}), ValueError,
     "ranges: .* differ from the ranges the samples were collected over"),
])
def test_fit_refuses_bad_arguments(collected, kwargs, exc, match):
    data = {**collected, "x": collected["x"].clone(), "y": collected["y"].clone()}
    if kwargs.pop("nan_x", False):
        data["x"][3, 2] = float("nan")
    if kwargs.pop("inf_y", False):
        data["y"][3, 2] = float("inf")
    with pytest.raises(exc, match=match):
        px.fit(data, **{"epochs": 1, **kwargs})


@pytest.mark.parametrize("args, kwargs, match", [
    (("L1", 0, 3, 8), {}, "num_cells: expected an integer >= 1, got 0"),
    (("L1", 4, 0, 8), {}, "R: expected an integer >= 1, got 0"),
    (("L1", 4, 3, 8), dict(batch_cells=0), "batch_cells: expected an integer >= 1 or None"),
    (("L3", 4, 3, 8), {}, "unknown level 'L3'"),
    (("L1", 4, 3, 8), dict(seed=2**64), "seed: expected an integer"),
])
def test_collect_refuses_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        px.collect(*args, **{"warmup": 2, "seed": 0, **kwargs})


def _write(path, kind, proxy):
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(b"not a torch file \x00\x01" * 20)
    elif kind == "truncated":
        proxy.save(path)
        path.write_bytes(path.read_bytes()[:200])
    elif kind == "list":
        torch.save([1, 2, 3], path)
    elif kind == "foreign dict":
        torch.save({"weights": torch.zeros(3)}, path)
    elif kind == "older format":
        blob = {"hidden": [8], "inputs": list(px.INPUTS), "targets": list(px.TARGETS), "dtype": "float32",
                "ranges": {k: list(v) for k, v in px.RANGES.items()}, "state_dict": proxy.state_dict()}
        torch.save(blob, path)
    elif kind == "other hidden sizes":
        proxy.save(path)
        blob = torch.load(path, weights_only=True)
        torch.save({**blob, "hidden": [16]}, path)


@pytest.mark.parametrize("kind, match", [
    ("empty", "not a readable proxy file"),
    ("garbage", "not a readable proxy file"),
    ("truncated", "not a readable proxy file"),
    ("list", "expected a dict written by Proxy.save, got a list"),
    ("foreign dict", "no proxy format tag 'isaac_net.proxy'"),
    ("older format", "no proxy format tag 'isaac_net.proxy'"),
    ("other hidden sizes", r"the stored weights do not fit the stored architecture \(hidden=\[16\]\)"),
])
def test_proxy_load_names_the_file_and_the_problem(small_proxy, tmp_path, kind, match):
    path = tmp_path / f"{kind.replace(' ', '_')}.pt"
    _write(path, kind, small_proxy)
    with pytest.raises(ValueError, match=match) as err:
        px.Proxy.load(path)
    assert str(path) in str(err.value) and "weights_only=False" not in str(err.value)
    assert err.value.__cause__ is None
