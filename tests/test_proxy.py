"""The neural proxy (isaac_net.core.diff.proxy): fit, gradients, save/load, input checks."""

import math

import pytest
import torch

from isaac_net.core.diff import proxy as px


@pytest.fixture(scope="module")
def synthetic():
    """Per-robot KPIs that are smooth known functions of the inputs and the cell context."""
    g = torch.Generator().manual_seed(0)
    inp = px.sample_inputs(128, 4, g)
    x = px.context(inp["p"], inp["msg_bytes"], inp["snr_db"]).reshape(-1, len(px.INPUTS))
    load = x[:, 0] * x[:, 1] / 1000.0 + x[:, 4]
    y = torch.stack([0.1 * load / (1 + x[:, 2] / 10), 1 - 0.002 * load, 1 / x[:, 0], 1e-5 * x[:, 1] / 1000.0],
                    dim=-1)
    return x, y


@pytest.fixture(scope="module")
def fitted(synthetic):
    x, y = synthetic
    return px.fit(x[:384], y[:384], hidden=(32, 32), epochs=60, lr=5e-3, batch_size=64, seed=0)[0]


def test_context_sums_the_other_robots():
    p = torch.tensor([[0.2, 0.4, 0.6]], dtype=torch.float64)
    B = torch.tensor([[1000.0, 2000.0, 3000.0]], dtype=torch.float64)
    snr = torch.tensor([[10.0, 20.0, 30.0]], dtype=torch.float64)
    c = px.context(p, B, snr)
    assert c.shape == (1, 3, len(px.INPUTS))
    torch.testing.assert_close(c[0, 0, 3], torch.tensor(1.0, dtype=torch.float64))  # 0.4 + 0.6
    torch.testing.assert_close(c[0, 0, 4], torch.tensor(0.8 + 1.8, dtype=torch.float64))  # kB per step
    torch.testing.assert_close(c[0, 0, 5], torch.tensor(25.0, dtype=torch.float64))


def test_fit_generalises_on_synthetic_data(synthetic, fitted):
    x, y = synthetic
    quality = px.evaluate(fitted, x[384:], y[384:])
    assert set(quality) == set(px.TARGETS)
    for k, q in quality.items():
        assert q["r2"] > 0.8, (k, q)
        assert math.isfinite(q["mean_rel_err"])


def test_nan_targets_are_left_out():
    g = torch.Generator().manual_seed(1)
    inp = px.sample_inputs(16, 2, g)
    x = px.context(inp["p"], inp["msg_bytes"], inp["snr_db"]).reshape(-1, len(px.INPUTS))
    y = torch.rand(x.shape[0], len(px.TARGETS), generator=g, dtype=torch.float64)
    y[::3, 0] = float("nan")
    proxy, info = px.fit(x, y, hidden=(8,), epochs=3, seed=0)
    assert math.isfinite(info["loss"])
    assert px.evaluate(proxy, x, y)["delay"]["n"] == int(torch.isfinite(y[:, 0]).sum())


def test_gradients_are_finite_and_reach_power_and_position(fitted):
    from isaac_net.core import CellConfig, radio

    p = torch.full((3, 4), 0.5, requires_grad=True)
    B = torch.full((3, 4), 12_000.0, requires_grad=True)
    tx = torch.full((3, 4), 20.0, requires_grad=True)
    pos = (60.0 + 50.0 * torch.rand(3, 4, 2, generator=torch.Generator().manual_seed(0))).requires_grad_()
    kpi = fitted.predict(p, B, radio.snr_db(pos, tx, CellConfig()))
    assert set(kpi) == set(px.TARGETS) and all(v.shape == (3, 4) for v in kpi.values())
    (kpi["delay"].sum() + kpi["aoi"].sum()).backward()
    for t in (p, B, tx, pos):
        assert t.grad is not None and bool(torch.isfinite(t.grad).all())
    assert float(tx.grad.abs().sum()) > 0 and float(pos.grad.abs().sum()) > 0


def test_save_load_round_trip(fitted, synthetic, tmp_path):
    x, _ = synthetic
    path = tmp_path / "proxy.pt"
    fitted.save(path)
    again = px.Proxy.load(path)
    assert again.hidden == fitted.hidden and again.ranges == fitted.ranges
    with torch.no_grad():
        assert torch.equal(again(x), fitted(x))


def test_collect_from_a_discrete_level():
    data = px.collect("L1", 6, 3, 8, warmup=2, seed=0, batch_cells=4)
    assert data["x"].shape == (18, len(px.INPUTS)) and data["y"].shape == (18, len(px.TARGETS))
    assert data["cell"].tolist() == [c for c in range(6) for _ in range(3)]
    y = data["y"]
    assert bool(((y[:, 1] >= 0) | y[:, 1].isnan()).all()) and bool((y[:, 2] > 0).all())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"p": torch.full((2, 3), 1.5)}, "p: expected probabilities"),
        ({"msg_bytes": torch.full((2, 3), -1.0)}, "msg_bytes: expected sizes > 0"),
        ({"snr_db": torch.zeros(2, 3, 2)}, r"expected \[E, R\] inputs"),
    ],
)
def test_predict_rejects_bad_inputs(fitted, kwargs, match):
    args = {"p": torch.full((2, 3), 0.5), "msg_bytes": torch.full((2, 3), 1e4),
            "snr_db": torch.full((2, 3), 20.0)}
    with pytest.raises(ValueError, match=match):
        fitted.predict(**{**args, **kwargs})


def test_bad_ranges_and_shapes_are_rejected():
    with pytest.raises(ValueError, match="ranges"):
        bad = {"p": (0.5, 0.1), "msg_bytes": (1.0, 2.0), "snr_db": (0.0, 1.0)}
        px.sample_inputs(2, 2, torch.Generator(), bad)
    with pytest.raises(ValueError, match="x: expected"):
        px.fit(torch.zeros(4, 3), torch.zeros(4, 4))


def test_load_rejects_another_layout(tmp_path):
    path = tmp_path / "bad.pt"
    torch.save({"format": px.FORMAT, "version": px.FORMAT_VERSION, "inputs": ["a"], "targets": ["b"],
                "hidden": [4], "ranges": {}, "dtype": "float32", "state_dict": {}}, path)
    with pytest.raises(ValueError, match="expected a proxy with inputs"):
        px.Proxy.load(path)
