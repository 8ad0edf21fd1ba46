"""The KPI registry: each KPI reduced as it declares, and every level and model gives every KPI."""

import pytest
import torch

from isaac_net.core import kpi
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
