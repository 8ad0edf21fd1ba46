"""The KPI registry: each KPI reduced as it declares, and every level and model gives every KPI."""

import pytest
import torch

from isaac_net.core import kpi
from isaac_net.core.config import CellConfig
from isaac_net.core.diff import DiffFluid, rollout
from isaac_net.core.diff.calibrate import group_kpis
from isaac_net.core.diff.reference import discrete_rollout
from isaac_net.core.levels import LEVELS, make_engine


def _totals(E=3, R=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    names = {k.total for k in kpi.KPIS} | {k.per for k in kpi.KPIS if k.per}
    t = {n: torch.rand(E, R, generator=g, dtype=torch.float64) * 10 for n in names}
    t["delivered"][0, 0] = 0.0  # a robot that delivered nothing: NaN delay
    return t


def test_registry_is_consistent():
    assert len({k.key for k in kpi.KPIS}) == len(kpi.KPIS)
    assert kpi.BATCH_KEYS == tuple(k.batch_key for k in kpi.KPIS)
    fields = set(kpi.Totals._fields)
    for k in kpi.KPIS:
        assert k.total in fields and (k.per is None or k.per in fields), k
        assert k.loss_weight >= 0 and k.unit is not None and k.label


@pytest.mark.parametrize("entry", kpi.KPIS, ids=lambda k: k.key)
def test_each_kpi_reduced_as_declared(entry):
    t, steps = _totals(), 7
    robot = kpi.per_robot_kpis(t, steps)[entry.key]
    batch = kpi.batch_kpis(t, steps)[entry.batch_key]
    if entry.per is None:  # mean over steps, then over robots
        torch.testing.assert_close(robot, t[entry.total] / steps, rtol=0, atol=0)
        torch.testing.assert_close(batch, (t[entry.total] / steps).mean(), rtol=1e-15, atol=0)
    else:  # totals over totals
        den = t[entry.per]
        want = torch.where(den > 0, t[entry.total] / den, float("nan"))
        torch.testing.assert_close(robot, want, equal_nan=True, rtol=0, atol=0)
        torch.testing.assert_close(batch, t[entry.total].sum() / den.sum(), rtol=1e-15, atol=0)


def test_grouped_reduction_is_calibrations_bit_for_bit():
    """The one batch reduction, grouped, gives calibrate.group_kpis' numbers exactly."""
    t = _totals(E=6)
    res = {**t, **kpi.per_robot_kpis(t, 1)}
    ours, theirs = kpi.grouped_batch_kpis(res, 3), group_kpis(res, 3)
    for key, v in theirs.items():
        assert torch.equal(ours[key], v), key


def test_expected_totals_chain_the_ratios():
    p = torch.tensor([[0.5, 1.0]], dtype=torch.float64)
    pred = {k.key: torch.tensor([[0.5, 0.25]], dtype=torch.float64) for k in kpi.KPIS}
    tot = kpi.expected_totals(p, pred)
    assert torch.equal(tot["delivered"], p * pred["delivery"])
    assert torch.equal(tot["delay_sum"], tot["delivered"] * pred["delay"])


def _inputs(E=2, R=3, T=6, dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    return dict(p=torch.full((E, R), 0.7, dtype=dtype), B=torch.full((E, R), 4000.0, dtype=dtype),
                snr_db=torch.full((E, R), 15.0, dtype=dtype), u=torch.rand(T, E, R, generator=g, dtype=dtype))


def _check_has_every_kpi(res):
    missing = [n for k in kpi.KPIS for n in (k.key, k.batch_key) if n not in res]
    assert not missing, f"a registered KPI is missing from the result: {missing}"


@pytest.mark.parametrize("level", list(LEVELS))
def test_every_level_gives_every_registered_kpi(level):
    x = _inputs()
    _check_has_every_kpi(discrete_rollout(level, 6, x["p"], x["B"], snr_db=x["snr_db"], u=x["u"], seed=0))
    step = make_engine(level, 2, 3, seed=0, dtype=torch.float64).step(x["u"][0] < x["p"], x["B"], x["snr_db"])
    for k in kpi.KPIS:
        assert k.total in step and (k.per is None or k.per in step), k.key


@pytest.mark.parametrize("mode", ["L1", "QA"])
@pytest.mark.parametrize("tau", [0.0, 0.1])
def test_every_model_gives_every_registered_kpi(mode, tau):
    x = _inputs()
    net = DiffFluid(2, 3, mode=mode, tau=tau, dtype=torch.float64)
    _check_has_every_kpi(rollout(net, 6, x["p"], x["B"], snr_db=x["snr_db"]))
    step = net.step(x["p"], x["B"], snr_db=x["snr_db"])
    for k in kpi.KPIS:
        assert k.total in step and (k.per is None or k.per in step), k.key


# ----------------------------------------------------------------------------- throughput
STEP_S = CellConfig().step_s


def _steps(level, sizes, snr_db, send=True):
    """One robot sending a message of ``sizes[t]`` bytes at every step ``t``: the accumulated result."""
    eng = make_engine(level, 1, 1, seed=0, dtype=torch.float64)
    acc = kpi.KpiAccumulator(0)
    for b in sizes:
        acc.add(eng.step(torch.tensor([[send]]), torch.tensor([[b]], dtype=torch.float64),
                         torch.tensor([[snr_db]], dtype=torch.float64)))
    return acc.result()


@pytest.mark.parametrize("level", ["L1", "QA"])
def test_throughput_counts_each_delivered_message_at_its_own_size(level):
    """A strong link delivers each message in its step: 1000 + 3000 + 1000 + 3000 bytes in 4 steps."""
    res = _steps(level, [1000.0, 3000.0, 1000.0, 3000.0], snr_db=40.0)
    assert float(res["delivered"]) == 4.0
    want = 8000.0 / (4 * STEP_S)
    assert float(res["throughput_bytes_per_s"]) == pytest.approx(want, rel=1e-12)
    assert float(res["mean_throughput_bytes_per_s"]) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("level", ["L1", "QA"])
def test_throughput_ignores_undelivered_bytes(level):
    """A link too weak to finish any 200 kB message in the rollout serves bytes but delivers none."""
    res = _steps(level, [2e5] * 3, snr_db=-25.0)
    assert float(res["delivered"]) == 0.0
    assert float(res["throughput_bytes_per_s"]) == 0.0


@pytest.mark.parametrize("level", list(LEVELS))
def test_throughput_is_delivered_messages_times_size_over_time(level):
    """With one size per robot, the goodput is delivered * B over the counted steps' duration."""
    x = _inputs(T=12)
    res = discrete_rollout(level, 12, x["p"], x["B"], snr_db=x["snr_db"], u=x["u"], warmup=2, seed=0)
    assert float(res["delivered"].sum()) > 0
    want = res["delivered"] * x["B"] / (res["num_steps"] * STEP_S)
    torch.testing.assert_close(res["throughput_bytes_per_s"], want, rtol=1e-12, atol=0)
    torch.testing.assert_close(res["mean_throughput_bytes_per_s"], want.mean(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["L1", "QA"])
def test_relaxed_throughput_is_delivered_mass_times_size(mode):
    x = _inputs(T=8)
    net = DiffFluid(2, 3, mode=mode, tau=0.1, dtype=torch.float64)
    res = rollout(net, 8, x["p"], x["B"], snr_db=x["snr_db"], warmup=1)
    want = res["delivered"] * x["B"] / (res["num_steps"] * STEP_S)
    torch.testing.assert_close(res["throughput_bytes_per_s"], want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["L1", "QA"])
def test_throughput_gradient_of_the_hand_written_backward_equals_autograd(mode):
    """d throughput / d (p, B, tx): the fused / slot-loop nodes against autograd through every op."""
    x = _inputs(T=6)

    def grads(slots):
        p, B = x["p"].clone().requires_grad_(), x["B"].clone().requires_grad_()
        net = DiffFluid(2, 3, mode=mode, tau=0.1, dtype=torch.float64)
        net.slot_grad = slots
        res = rollout(net, 6, p, B, snr_db=x["snr_db"])
        return torch.autograd.grad(res["mean_throughput_bytes_per_s"], (p, B))

    for a, b in zip(grads("tape"), grads("autograd"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
        assert b.abs().sum() > 0


def test_throughput_is_not_calibrated_nor_learned_by_the_proxy():
    from isaac_net.core.diff import proxy

    entry = kpi.BY_KEY["throughput_bytes_per_s"]
    assert entry.loss_weight == 0.0 and not entry.proxy_target
    assert proxy.TARGETS == ("delay", "delivery", "aoi", "energy_j")


def test_calibration_figure_reads_its_panels_from_the_registry(tmp_path):
    """The calibration sweep's panels and y-labels come from the registry: on a sweep holding the
    calibration's four KPIs (and throughput), the figure's panels as before (delay, delivery, AoI),
    with the same labels."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "diff"))
    import _plots

    held = [k.batch_key for k in kpi.KPIS]  # the four calibrated KPIs and throughput
    curves = {k: [1.0, 2.0] for k in held}
    sweep = {"points": [[0.2, 4000], [0.6, 4000]], "L2-legacy": curves,
             "models": {"QA_mean_field": {"uncalibrated": curves, "calibrated": curves}}}
    panels = _plots.sweep_kpis(sweep)
    assert [k.batch_key for k in panels] == ["mean_delay", "delivery_ratio", "mean_aoi"]
    labels = [_plots.axis_label(k) for k in panels]
    assert labels == ["mean delay, steps", "delivery ratio", "mean AoI, steps"]
    _plots.calibration_sweep(sweep, str(tmp_path / "sweep.png"), {k.batch_key: k.label for k in kpi.KPIS})
    assert (tmp_path / "sweep.png").stat().st_size > 0
