"""Reliability (issue 36): finite, physical results at the edges of every valid input, and loaded
files checked field by field. Randomised over instances (seeds, sizes, SNRs) with seeded draws
(hypothesis is not a dependency); each test asserts values, not only that the code runs."""

import dataclasses
import glob
import json
import math
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from isaac_net.core import CellConfig, radio
from isaac_net.core.config import PHYSICAL_RANGES
from isaac_net.core.diff import DiffFluid, calibrate, relax, rollout
from isaac_net.core.diff import proxy as px
from isaac_net.core.levels import make_engine

REPO = Path(__file__).resolve().parents[1]
CALIBRATION = REPO / "benchmarks" / "diff" / "results" / "full" / "calibration.json"
F32, F64 = torch.float32, torch.float64
SENDS = ("mean_field", "relaxed", "binary")
KPIS = ("mean_delay", "delivery_ratio", "mean_aoi", "mean_energy_j")


def _draw(seed: int):
    g = torch.Generator().manual_seed(seed)
    return g, int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(1, 6, (1,), generator=g))


# ------------------------------------------------------------------ QAD / L1D at high SNR (item 1)
def test_harmonic_is_its_series_where_digamma_cancels_and_unchanged_elsewhere():
    """H(n) at tiny n: digamma(n + 1) + gamma is rounding error there (-2.4e-7 in float32, below 0);
    the series is used and matches float64's exact value; above the switch nothing changed."""
    n64 = torch.logspace(-30, -1, 200, dtype=F64)
    exact = torch.special.digamma(n64 + 1.0) + relax.EULER_GAMMA
    exact = torch.where(n64 < 1e-8, relax.ZETA2 * n64 - relax.ZETA3 * n64 * n64, exact)
    for dt, rtol in ((F32, 2e-6), (F64, 1e-12)):
        n = n64.to(dt)
        h = relax.harmonic(n)
        assert bool((h > 0).all())
        plain = n >= 2 * torch.finfo(dt).eps
        torch.testing.assert_close(h[~plain].double(), exact[~plain], rtol=rtol, atol=0.0)
        assert torch.equal(h[plain], (torch.special.digamma(n + 1.0) + relax.EULER_GAMMA)[plain])
        d = relax.harmonic_deriv(n)
        assert torch.equal(d[plain], torch.special.polygamma(1, n + 1.0)[plain])
        torch.testing.assert_close(d.double(), torch.special.polygamma(1, n64 + 1.0), rtol=1e-5, atol=0.0)
    # autograd through harmonic (the reference model's path) gives harmonic_deriv (the fused node's)
    n = torch.tensor([1e-12, 1e-7, 0.3, 2.0], dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(relax.harmonic(n).sum(), n)
    torch.testing.assert_close(g, relax.harmonic_deriv(n.detach()), rtol=1e-12, atol=0.0)


def test_issue_reproducers_give_the_saturated_kpis():
    """The issue's cases: a robot 2 m from the gNB with relaxed sends (every KPI was NaN), and a
    step with no send at 90 dB (NaN gradient). Above ~60 dB the spectral efficiency is at its cap,
    so the KPIs equal those of the same robot at 60 dB."""
    pos = torch.tensor([[[50.0, 50.0], [2.0, 0.0]]])
    near = rollout(DiffFluid(1, 2, mode="QA"), 20, torch.full((1, 2), 0.3), 12000.0, pos=pos, sends="relaxed",
                   generator=torch.Generator().manual_seed(1))
    snr = radio.snr_db(pos, 23.0, CellConfig())
    assert float(snr[0, 1]) > 80.0
    capped = rollout(DiffFluid(1, 2, mode="QA"), 20, torch.full((1, 2), 0.3), 12000.0,
                     snr_db=torch.stack([snr[0, 0], torch.tensor(60.0)]).unsqueeze(0), sends="relaxed",
                     generator=torch.Generator().manual_seed(1))
    for k in KPIS:
        assert math.isfinite(near[k].item()), k
        torch.testing.assert_close(near[k], capped[k], rtol=1e-5, atol=0.0)
    assert 0.0 <= near["delivery_ratio"].item() <= 1.0
    for step_by_step in (False, True):
        for slots in ("recompute", "autograd"):
            snr = torch.tensor([[90.0]], requires_grad=True)
            net = DiffFluid(1, 1, mode="QA")
            net.slot_grad = slots
            out = rollout(net, 3, 0.0, 12000.0, snr_db=snr, step_by_step=step_by_step)
            out["mean_aoi"].backward()
            assert out["mean_aoi"].item() == 2.0  # no send: the AoI of a fresh cell grows 1, 2, 3
            assert float(snr.grad) == 0.0  # and does not depend on the SNR


# (mode, sends, cell): each send model of both models, and QAD mean-field's backlog closure (its own count
# and busy chance, on the fused node).
CLOSED = CellConfig(mf_backlog_closure=True)
SNR_CASES = [pytest.param(m, s, CellConfig(), id=f"{m}-{s}") for m in ("L1", "QA") for s in SENDS]
SNR_CASES.append(pytest.param("QA", "mean_field", CLOSED, id="QA-mean_field-backlog-closure"))


@pytest.mark.filterwarnings("ignore:tau. QAD with mean-field sends' backlog closure")  # finite below it too
@pytest.mark.parametrize(("mode", "sends", "cfg"), SNR_CASES)
def test_snr_up_to_120_db_gives_finite_kpis_and_gradients_in_float32(mode, sends, cfg):
    """Random cells with SNRs from -20 to 120 dB (one robot at 120 dB), random loads, sizes and
    temperatures, float32: finite KPIs with 0 <= delivery <= 1, AoI >= 1, energy >= 0, and finite
    gradients in the SNR and p."""
    for seed in range(4):
        g, E, R = _draw(seed)
        snr = torch.rand(E, R, generator=g) * 140.0 - 20.0
        snr[0, 0] = 120.0
        snr.requires_grad_()
        p = torch.rand(E, R, generator=g).requires_grad_()
        B = float(torch.rand(1, generator=g)) * 5e4 + 500.0
        tau = float(torch.rand(1, generator=g)) * 0.3 + 0.02
        out = rollout(DiffFluid(E, R, mode=mode, tau=tau, cfg=cfg), 6, p, B, snr_db=snr, sends=sends,
                      generator=torch.Generator().manual_seed(seed))
        vals = torch.stack([out[k] for k in KPIS])
        assert bool(torch.isfinite(vals).all()), (seed, vals)
        assert 0.0 <= out["delivery_ratio"].item() <= 1.0
        assert out["mean_aoi"].item() >= 1.0 and out["mean_energy_j"].item() >= 0.0
        vals.sum().backward()
        assert bool(torch.isfinite(snr.grad).all())
        assert p.grad is None or bool(torch.isfinite(p.grad).all())


@pytest.mark.parametrize("mode", ["L1", "QA"])
def test_steps_without_sends_have_finite_zero_gradients_at_any_snr(mode):
    """With no send at all the KPIs do not depend on the radio: at any SNR (-150 .. 150 dB, the
    validated range) and either dtype the gradients are finite and 0."""
    for seed in range(3):
        g, E, R = _draw(seed)
        for dt in (F32, F64):
            snr = (torch.rand(E, R, generator=g, dtype=dt) * 300.0 - 150.0).requires_grad_()
            out = rollout(DiffFluid(E, R, mode=mode, dtype=dt), 4, 0.0, 8000.0, snr_db=snr)
            (out["mean_aoi"] + out["mean_energy_j"] + out["mean_delay"]).backward()
            assert out["mean_aoi"].item() == 2.5  # 1, 2, 3, 4
            assert bool(torch.isfinite(snr.grad).all()) and float(snr.grad.abs().max()) == 0.0


@pytest.mark.parametrize(("sends", "cfg"), [("relaxed", CellConfig()), ("mean_field", CLOSED)],
                         ids=["relaxed", "mean_field-backlog-closure"])
def test_fused_and_autograd_qad_agree_at_high_snr(sends, cfg):
    """The fused node and autograd of the reference step call the same functions: the same KPIs and
    gradients at 70-120 dB with relaxed sends, and with mean-field sends' backlog closure (float64)."""
    g, E, R = _draw(7)
    snr0 = torch.rand(E, R, generator=g, dtype=F64) * 50.0 + 70.0
    res = []
    for slots in ("recompute", "autograd"):
        snr = snr0.clone().requires_grad_()
        net = DiffFluid(E, R, mode="QA", dtype=F64, cfg=cfg)
        net.slot_grad = slots
        assert net.fused_rollout == (slots == "recompute")
        out = rollout(net, 8, 0.4, 9000.0, snr_db=snr, sends=sends,
                      generator=torch.Generator().manual_seed(3))
        sum(out[k] for k in KPIS).backward()
        res.append((torch.stack([out[k].detach() for k in KPIS]), snr.grad))
    torch.testing.assert_close(res[0][0], res[1][0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(res[0][1], res[1][1], rtol=1e-8, atol=1e-12)


def _closure_cell(seed: int):
    """A random cell of 1-64 robots for the closure's temperature checks: p up to 12 / R (light to
    past the knee), SNRs of 0-40 dB, 2-32 kB messages."""
    g = torch.Generator().manual_seed(seed)
    R = int(torch.randint(1, 65, (1,), generator=g))
    p = torch.rand(2, R, generator=g, dtype=F64) * float(torch.rand(1, generator=g)) * min(1.0, 12.0 / R)
    snr = torch.rand(2, R, generator=g, dtype=F64) * 40.0
    return p, snr, float(torch.rand(1, generator=g)) * 3e4 + 2000.0


def _closure_ad_and_fd(seed: int, tau: float, T: int = 60, h: float = 1e-5) -> tuple:
    """d (AoI + delay + 10 delivery) / d (a common relative shift of p) on cell ``seed`` with the
    closure, float64: autograd and the central difference of half step ``h``, both on the same cell."""
    p0, snr, B = _closure_cell(seed)
    cfg = CellConfig(mf_backlog_closure=True)

    def loss(shift):
        net = DiffFluid(*p0.shape, mode="QA", tau=tau, cfg=cfg, dtype=F64)
        k = rollout(net, T, p0 * (1.0 + shift), B, snr_db=snr, sends="mean_field")
        return k["mean_aoi"] + k["mean_delay"] + 10.0 * k["delivery_ratio"]

    shift = torch.zeros((), dtype=F64, requires_grad=True)
    (ad,) = torch.autograd.grad(loss(shift), shift)
    with torch.no_grad():
        fd = (loss(torch.tensor(h, dtype=F64)) - loss(torch.tensor(-h, dtype=F64))) / (2.0 * h)
    return float(ad), float(fd)


def test_the_backlog_closure_has_stable_gradients_from_its_least_temperature_and_warns_below():
    """``relax.CLOSURE_MIN_TAU``: with the closure, QAD's gradients over 60 steps equal central
    differences at that temperature on cells where below it (tau = 0.02) backpropagation through time
    diverges (the step expands; docs/design.md, section 6), in float64; ``DiffFluid`` warns below it,
    at construction and when tau is lowered, and not at it, at tau = 0 or without the closure."""
    assert relax.CLOSURE_MIN_TAU == 0.05
    for seed in (4, 6, 7, 13):  # cells whose gradients diverge at tau = 0.02
        ad, fd = _closure_ad_and_fd(seed, relax.CLOSURE_MIN_TAU)
        assert ad == pytest.approx(fd, rel=1e-4), seed
    with pytest.warns(UserWarning, match=r"unstable gradients below tau = 0\.05 .* got tau = 0\.02"):
        ad, fd = _closure_ad_and_fd(7, 0.02)
    assert abs(ad - fd) > 10.0 * abs(fd)  # why it warns: autograd is off by orders of magnitude
    closure = CellConfig(mf_backlog_closure=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for tau, cfg, mode in ((0.05, closure, "QA"), (0.0, closure, "QA"), (0.02, CellConfig(), "QA"),
                               (0.02, closure, "L1")):
            net = DiffFluid(2, 3, mode=mode, tau=tau, cfg=cfg)
        # the committed QAD mean-field calibration between two sizes fitted at 0.05: its temperature
        # between them is 0.05 exactly (a geometric mean of the two gave one rounding below at R = 20)
        fc = calibrate.Calibration.load(CALIBRATION, mode="QA", sends="mean_field")
        assert [c.tau for c in fc.fits if c.R[0] in (16, 32)] == [0.05, 0.05]
        assert fc.at(20).tau == 0.05
        fc.model(2, 20)
    with pytest.warns(UserWarning, match="got tau = 0.01"):
        net = DiffFluid(2, 3, mode="QA", tau=0.1, cfg=closure)
        net.tau = 0.01  # annealing below it


# ------------------------------------------------------------------ small edges (items 6, 12)
@pytest.mark.parametrize("which", ["DiffFluid", "L1", "QA", "L2-legacy"])
def test_reset_of_an_empty_list_is_a_no_op(which):
    net = DiffFluid(2, 3) if which == "DiffFluid" else make_engine(which, 2, 3)
    if which == "DiffFluid":
        net.step(torch.full((2, 3), 0.7), 1e6, snr_db=10.0)  # a message too large to leave in one step
        before = [t.clone() for t in (net.state.x, net.state.w, net.state.aoi)]
    else:
        net.step(torch.ones(2, 3), 9000.0, snr_db=10.0)
        before = {k: v.clone() for k, v in net.state().items()} if hasattr(net, "state") else None
    for empty in ([], (), torch.zeros(0, dtype=torch.long)):
        net.reset(empty)
    if which == "DiffFluid":
        for a, b in zip(before, (net.state.x, net.state.w, net.state.aoi), strict=True):
            assert torch.equal(a, b) and bool((b != 0).any())
    elif before is not None:
        after = net.state()
        assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(TypeError, match="env_ids: expected integer env indices"):
        net.reset([0.5])


def test_small_edges_are_clear():
    with pytest.raises(ValueError, match=r"warmup: expected an integer in \[0, T=5\), got True"):
        rollout(DiffFluid(1, 2), 5, 0.3, 1000.0, snr_db=10.0, warmup=True)
    shapes = r"p, u: expected shapes that broadcast together, got p \[2, 3\] and u \[4\]"
    with pytest.raises(ValueError, match=shapes):
        relax.relaxed_bernoulli(torch.full((2, 3), 0.5), torch.rand(4), 0.1)
    a, b = DiffFluid(2, 3, mode="QA"), DiffFluid(4, 3, mode="QA")
    with pytest.raises(ValueError, match=r"inputs: built for another net \(E 4 \(this net: 2\)\)"):
        a.advance(torch.full((2, 3), 0.5), b.inputs(1000.0, snr_db=10.0))
    c = DiffFluid(2, 3, mode="QA", dtype=F64)
    with pytest.raises(ValueError, match="dtype torch.float32 .this net: torch.float64."):
        c.advance(torch.full((2, 3), 0.5, dtype=F64), a.inputs(1000.0, snr_db=10.0))
    with pytest.raises(ValueError, match="inputs: built for another net"):
        a.advance_rollout(torch.full((2, 3), 0.5), DiffFluid(2, 3, mode="L1").inputs(1000.0, snr_db=10.0),
                          2, 0)


def test_snr_is_finite_and_decreasing_at_any_finite_distance():
    """Where the squared norm overflows (beyond 1.8e19 m in float32) the distance is taken in the log
    domain: the SNR keeps falling 35.3 dB per decade, finite, with finite gradients; nearer, the
    values are the plain formula's, unchanged."""
    cfg = CellConfig()
    for dt in (F32, F64):
        d = torch.logspace(0, 38, 39, dtype=dt)
        pos = torch.stack([d, torch.zeros_like(d)], -1).requires_grad_()
        snr = radio.snr_db(pos, 23.0, cfg)
        assert bool(torch.isfinite(snr).all()) and bool((snr.diff() < 0).all())
        torch.testing.assert_close(snr.diff().double(), torch.full((38,), -35.3, dtype=F64), rtol=1e-4,
                                   atol=0.0)
        snr.sum().backward()
        assert bool(torch.isfinite(pos.grad).all())
        near = pos.detach()[:15]
        plain = 23.0 - (22.4 + 35.3 * torch.log10(radio.distance_m(near)) + 21.3 * math.log10(cfg.fc_ghz)) \
            - cfg.noise_dbm
        assert torch.equal(radio.snr_db(near, 23.0, cfg), plain)
    far = rollout(DiffFluid(1, 2, mode="QA"), 4, 0.5, 1000.0, pos=torch.tensor([[[1e30, 0.0], [50.0, 0.0]]]))
    assert all(math.isfinite(far[k].item()) for k in KPIS)


# ------------------------------------------------------------------ CellConfig ranges (item 10)
def _cells(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "cell" and isinstance(v, dict):
                yield v
            else:
                yield from _cells(v)
    elif isinstance(node, list):
        for v in node:
            yield from _cells(v)


def test_every_committed_config_and_calibration_is_within_the_physical_ranges():
    cells = [c for f in sorted(glob.glob(str(REPO / "config" / "*.yaml")))
             for c in _cells(yaml.safe_load(open(f)))]
    assert len(cells) >= 4
    cal = json.loads(CALIBRATION.read_text())["calibrations"]
    for c in cells + [e["cell"] for e in cal]:
        CellConfig(**c)
    for e in cal:
        consts = calibrate.Calibration.from_dict(e, str(CALIBRATION)).constants
        dataclasses.replace(CellConfig(), **consts)


@pytest.mark.parametrize("name", sorted(PHYSICAL_RANGES))
def test_cell_constants_outside_their_physical_range_are_refused_naming_the_field(name):
    lo, hi, _ = PHYSICAL_RANGES[name]
    cfg = CellConfig(qa_sr_slots=0) if name == "num_slots" else CellConfig()
    integer = isinstance(getattr(cfg, name), int)
    outside = [hi + 1 if integer else hi * 10 if hi > 0 else hi + 100, 10**9 if integer else 1e300]
    if lo > 0 or name in ("noise_figure_db",):
        outside.append(lo - 1 if integer or lo <= 0 else lo / 10)
    else:
        outside.append(lo - 1 if integer else lo - 100)
    for v in outside:
        with pytest.raises(ValueError, match=rf"CellConfig\.{name} must (lie in|be)"):
            dataclasses.replace(cfg, **{name: v})
    dataclasses.replace(cfg, **{name: lo})
    dataclasses.replace(cfg, **{name: hi})


def test_random_cells_within_the_ranges_give_finite_kpis_and_gradients():
    """Cells drawn at the corners and inside the physical ranges (float32, both models, SNR over its
    whole validated range, sizes to 1 GB): finite KPIs and gradients."""
    names = ["step_s", "subband_hz", "se_max", "fc_ghz", "noise_figure_db", "tx_dbm", "qa_snr_req_db",
             "rate_factor", "snr_offset_db"]
    g = torch.Generator().manual_seed(0)
    for trial in range(8):
        kw = {}
        for n in names:
            lo, hi, _ = PHYSICAL_RANGES[n]
            corner = trial % 2 == 0  # every constant at one end of its range, else inside
            u = float(torch.randint(0, 2, (1,), generator=g)) if corner else float(torch.rand(1, generator=g))
            kw[n] = lo + (hi - lo) * u
        cfg = CellConfig(num_slots=4, qa_sr_slots=1, **kw)
        for mode in ("QA", "L1"):
            snr = (torch.rand(2, 3, generator=g) * 300.0 - 150.0).requires_grad_()
            p = torch.rand(2, 3, generator=g).requires_grad_()
            B = torch.tensor(10 ** (float(torch.rand(1, generator=g)) * 9), requires_grad=True)
            out = rollout(DiffFluid(2, 3, mode=mode, cfg=cfg, tau=0.1), 5, p, B, snr_db=snr, sends="relaxed",
                          generator=torch.Generator().manual_seed(trial))
            v = torch.stack([out[k] for k in KPIS])
            v.sum().backward()
            assert bool(torch.isfinite(v).all()) and 0.0 <= out["delivery_ratio"].item() <= 1.0, (kw, v)
            assert all(bool(torch.isfinite(t.grad).all()) for t in (snr, p, B)), kw


# ------------------------------------------------------------------ calibration (items 7, 8, 9)
@pytest.fixture(scope="module")
def committed():
    e = json.loads(CALIBRATION.read_text())["calibrations"][-1]
    return e, calibrate.Calibration.from_dict(e, str(CALIBRATION))


def test_apply_takes_one_fleet_size(committed):
    _, cal = committed
    with pytest.raises(TypeError, match=r"R: expected one fleet size, an integer >= 1 \(one of the fitted"):
        cal.apply(R=cal.R)
    for bad in (8.5, "8", True, 8.0):
        with pytest.raises(TypeError, match="R: expected one fleet size"):
            cal.apply(R=bad)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="R: expected one fleet size"):
            cal.apply(R=bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cal.apply(R=cal.R[0]).rate_factor == cal.rate_factor


TINY = dict(R=3, envs=2, model_envs=2, T=10, warmup=2,
            search={"rate_factor": (0.6, 1.0), "snr_offset_db": (-4.0, 0.0),
                    "sr_slots": {"L1": (0,), "QA": (4,)},
                    "refine_top": 1, "refine_evals": 4})
GRID = calibrate.product_grid([0.4], [8000.0, 20000.0], [23.0])


@pytest.mark.parametrize("key, value, match", [
    ("rate_factor", (), r"search\['rate_factor'\]: expected a non-empty list"),
    ("snr_offset_db", [], r"search\['snr_offset_db'\]: expected a non-empty list"),
    ("sr_slots", {"QA": ()}, r"search\['sr_slots'\]\['QA'\]: expected a non-empty list"),
    ("sr_slots", {"L1": (0,)}, r"search\['sr_slots'\]: expected latency floors for mode 'QA'"),
    ("tau", (), r"search\['tau'\]: expected a non-empty list or None"),
    ("qa_snr_req_db", [], r"search\['qa_snr_req_db'\]: expected a non-empty list or None"),
    ("rate_factor", (0.5, -1.0), r"search\['rate_factor'\]: expected finite capacity factors > 0"),
    ("rate_factor", "0.5", r"search\['rate_factor'\]: expected a non-empty list of numbers"),
    ("sr_slots", {"QA": (4.5,)}, r"search\['sr_slots'\]\['QA'\]: expected integers"),
    ("refine_top", 0, r"search\['refine_top'\]: expected an integer >= 1"),
    ("gradient_h", 0.0, r"search\['gradient_h'\]: expected a finite number > 0"),
    ("nonsense", 1, r"search: unknown keys \['nonsense'\]"),
])
def test_fit_refuses_bad_search_lists_up_front(key, value, match):
    with pytest.raises((TypeError, ValueError), match=match):
        calibrate.fit("QA", "relaxed", grid=GRID, **{**TINY, "search": {**TINY["search"], key: value}})


def test_the_loss_leaves_out_a_delay_or_energy_the_target_does_not_have():
    """A point where the target delivered and sent nothing (p = 0: delay 0 by convention, energy 0):
    its delay and energy terms, and the slopes to and from it, have no value and are left out; the
    other points' terms are unchanged; a model that delivers nothing where the target does is inf."""
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        n = int(torch.randint(3, 7, (1,), generator=g))
        target = {"mean_delay": torch.rand(n, generator=g, dtype=F64) + 0.5,
                  "mean_aoi": torch.rand(n, generator=g, dtype=F64) * 3 + 1,
                  "mean_energy_j": torch.rand(n, generator=g, dtype=F64) * 1e-3 + 1e-4,
                  "delivery_ratio": torch.rand(n, generator=g, dtype=F64)}
        model = {k: v * (1.0 + 0.3 * torch.rand(n, generator=g, dtype=F64)) for k, v in target.items()}
        pairs = torch.tensor([[i, i + 1] for i in range(n - 1)])
        idle_target = {**target, "mean_delay": target["mean_delay"].clone(),
                       "mean_energy_j": target["mean_energy_j"].clone()}
        idle_target["mean_delay"][0] = 0.0
        idle_target["mean_energy_j"][0] = 0.0
        idle_model = {**model, "mean_delay": model["mean_delay"].clone()}
        idle_model["mean_delay"][0] = 1e-6  # the relaxed model's trickle at p = 0
        full = calibrate.point_loss(model, target)
        left_out = calibrate.point_loss(idle_model, idle_target)
        assert bool(torch.isfinite(left_out).all())
        torch.testing.assert_close(left_out[1:], full[1:], rtol=0, atol=0)
        aoi_err = float(torch.log(model["mean_aoi"][0] / target["mean_aoi"][0]))
        delivery_err = float(model["delivery_ratio"][0] - target["delivery_ratio"][0])
        delivery_err /= calibrate.DELIVERY_UNIT
        expected0 = calibrate.LOSS_WEIGHTS["mean_aoi"] * aoi_err**2 + delivery_err**2
        assert float(left_out[0]) == pytest.approx(expected0, rel=1e-12)
        total = float(calibrate.loss(idle_model, idle_target, pairs))
        assert math.isfinite(total) and total >= float(left_out.mean())
        none = {**model, "mean_delay": model["mean_delay"].clone()}
        none["mean_delay"][1] = 0.0
        assert float(calibrate.loss(none, target, pairs)) == math.inf


def test_fit_with_a_p_zero_point_is_finite_and_its_check_passes():
    """A training point at p = 0 (documented as valid): L2-legacy delivers and sends nothing there. The
    fit's loss stays finite, the gradient check leaves the point out (no central difference) and no
    warning blames it."""
    grid = calibrate.product_grid([0.0, 0.5], [12000.0], [23.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cal = calibrate.fit("L1", "mean_field", grid=grid, **TINY)
    assert math.isfinite(cal.train_loss) and cal.train_loss < 1e3
    assert math.isfinite(cal.uncalibrated_train_loss)
    assert cal.gradient_check["stable"] and cal.gradient_check["skipped"] == [[0.0, 12000.0, 23.0]]
    assert cal.gradient_check["point"] == [0.5, 12000.0, 23.0]


def test_inf_round_trips_through_a_calibration_file(committed, tmp_path):
    _, cal = committed
    inf = dataclasses.replace(cal, train_loss=math.inf, heldout_loss=math.inf,
                              gradient_check={**cal.gradient_check, "worst_error": math.inf})
    inf.save(tmp_path / "c.json")
    back = calibrate.Calibration.load(tmp_path / "c.json", mode=cal.mode, sends=cal.sends)
    assert back == inf and back.train_loss == math.inf and back.gradient_check["worst_error"] == math.inf


def _bad_values(name, value):
    """Wrong types and out-of-range values of a calibration field (null is tried by the caller)."""
    numbers = {"rate_factor": [0.0, -1.0, math.nan, "0.5"], "snr_offset_db": [math.inf, "x", True],
               "sr_slots": [-1, 2.5, "4"], "train_loss": [-1.0, math.nan, "0.1"], "heldout_loss": [-1.0, "x"],
               "tau": [0.0, -0.1, "0.1"], "qa_snr_req_db": [math.nan, "5"],
               "air_factor": [0.0, -1.0, math.nan, "1"], "air_crowd_exp": [math.inf, "x", True],
               # the committed entry is QAD relaxed's: any spread is a mean-field sends' constant
               "load_spread": [-1.0, math.nan, "1", True, 1.0],
               # a bool, and True only for QAD mean-field's: the committed entry is QAD relaxed's
               "mf_backlog_closure": [1, "true", None, True],
               # a share in [0, 1]; the committed entry is QAD relaxed's, which may carry one
               "qa_reshare": [-0.1, 1.5, math.nan, "0.5", True],
               # a number of subbands in [1, num_subbands]; the committed entry is QAD relaxed's
               "qa_min_grant_subbands": [0.5, 13.0, math.nan, "3", True]}
    if name in numbers:
        return numbers[name]
    return {"mode": ["L3", 1], "sends": ["binary", 0],
            "grid": [5, ["abc"], [[0.5, -1.0, 23.0]], [], [[2.0, 1e4, 23.0]]],
            "heldout_grid": [5, [[0.5, 1e4]]], "R": ["8", 0, [8, 8], 2.5], "area_m": [[5.0, 1.0], [1.0], "x"],
            "cell": [5, {"step_s": -1.0}, {"nonsense": 1}], "l2_config": [5, {"nonsense": 1}],
            "setup": [5, []], "gradient_check": [5, "x"], "provenance": [5]}.get(name, [])


def test_every_field_of_a_calibration_file_is_checked_naming_file_and_field(committed, tmp_path):
    entry, _ = committed
    path = tmp_path / "cal.json"

    def load(entries):
        path.write_text(json.dumps({"format": calibrate.FORMAT, "version": calibrate.VERSION,
                                    "calibrations": entries}))
        return calibrate.Calibration.load(path, mode=entry["mode"], sends=entry["sends"])

    load([entry])  # the committed entry loads
    with pytest.raises(TypeError, match=rf"{path}: calibrations\[0\]: expected a calibration entry"):
        load([1])
    # fields that may be null (a loss: none measured, or a strict-JSON writer's inf)
    optional = {"provenance", "gradient_check", "tau", "qa_snr_req_db", "heldout_loss",
                "uncalibrated_heldout_loss", "train_loss", "uncalibrated_train_loss"}
    checked = 0
    for name in entry:
        missing = {k: v for k, v in entry.items() if k != name}
        cases = [(None, name not in optional)] + [(v, True) for v in _bad_values(name, entry[name])]
        # an entry without these loads (tau: the fit's setup; the time on air's and the load
        # spread: the plain rule)
        if name not in ("provenance", "gradient_check", "tau", "qa_snr_req_db", "air_factor",
                        "air_crowd_exp", "load_spread", "mf_backlog_closure", "qa_reshare",
                        "qa_min_grant_subbands"):
            with pytest.raises((TypeError, ValueError)) as err:
                load([missing])
            assert str(path) in str(err.value) and name in str(err.value), (name, str(err.value))
        if name == "provenance":
            cases[0] = (None, True)
        for value, must_fail in cases:
            if not must_fail:
                continue
            with pytest.raises((TypeError, ValueError)) as err:
                load([{**entry, name: value}])
            msg = str(err.value)
            assert str(path) in msg and name in msg, (name, value, msg)
            checked += 1
    assert checked >= 40


# ------------------------------------------------------------------ the proxy (items 2, 11)
@pytest.fixture(scope="module")
def tiny_proxies():
    """A proxy fitted in a second on an L1 collection, and one with random weights and spreads."""
    data = px.collect("L1", 12, 3, 10, warmup=2, seed=0)
    fitted = px.fit(data, hidden=(8, 8), epochs=15, batch_size=16, seed=0)[0]
    torch.manual_seed(1)
    random = px.Proxy(hidden=(16,), fitted_on={"R": 3})
    with torch.no_grad():
        for prm in random.net.parameters():
            prm.mul_(30.0)  # large outputs of either sign
        random.y_mean.copy_(torch.randn(len(px.TARGETS)) * 5)
        random.y_std.copy_(torch.rand(len(px.TARGETS)) * 5 + 0.01)
    return fitted, random.eval()


def test_proxy_predictions_respect_physics_over_its_whole_input_box(tiny_proxies):
    for proxy in tiny_proxies:
        g = torch.Generator().manual_seed(0)
        inp = px.sample_inputs(4000, 3, g, proxy.ranges, dtype=proxy.x_mean.dtype)
        with torch.no_grad():
            k = proxy.predict(inp["p"], inp["msg_bytes"], inp["snr_db"])
        assert all(bool(torch.isfinite(v).all()) for v in k.values())
        assert float(k["energy_j"].min()) >= 0.0 and float(k["delay"].min()) >= 0.0
        assert 0.0 <= float(k["delivery"].min()) and float(k["delivery"].max()) <= 1.0
        assert float(k["aoi"].min()) >= 1.0
    # far above the floors the softplus heads are the affine ones
    fitted = tiny_proxies[0]
    h = torch.full((1, len(px.TARGETS)), 3.0, dtype=fitted.y_mean.dtype)
    out = fitted._decode(h)
    affine = h * fitted.y_std + fitted.y_mean
    for i, name in enumerate(px.TARGETS):
        if name in px.FLOORS and float(affine[0, i]) > px.FLOORS[name] + fitted.y_std[i]:
            torch.testing.assert_close(out[0, i], affine[0, i], rtol=1e-4, atol=0.0)


def test_an_old_format_proxy_file_asks_for_a_refit(tiny_proxies, tmp_path):
    path = tmp_path / "old.pt"
    tiny_proxies[0].save(path)
    blob = torch.load(path, weights_only=True)
    blob = {k: v for k, v in blob.items() if k != "floors"}
    torch.save({**blob, "version": 2}, path)
    with pytest.raises(ValueError, match="proxy format version 2, whose delay, AoI and energy heads .*refit"):
        px.Proxy.load(path)


def test_every_field_of_a_proxy_file_is_checked_naming_file_and_field(tiny_proxies, tmp_path):
    proxy = tiny_proxies[0]
    path = tmp_path / "p.pt"
    proxy.save(path)
    good = torch.load(path, weights_only=True)
    sd = good["state_dict"]
    nan_sd = {**sd, "net.0.weight": torch.full_like(sd["net.0.weight"], math.nan)}
    cases = {
        "hidden": [None, "8", [], [0], [8.5], [True]],
        "ranges": [None, 5, {"p": (0.1, 0.9)}, {**good["ranges"], "p": ("0.1", "0.9")},
                   {**good["ranges"], "p": (0.9, 0.1)}],
        "fitted_on": [None, 5, {**good["fitted_on"], "R": "4"}, {**good["fitted_on"], "T": 0},
                      {**good["fitted_on"], "level": 3}, {**good["fitted_on"], "cfg": {"step_s": -1.0}},
                      {**good["fitted_on"], "extra": 1}],
        "dtype": [None, "float16", 5],
        "state_dict": [None, 5, nan_sd, {**sd, "y_std": torch.zeros_like(sd["y_std"])}],
        "floors": [None, {"delay": 0.0}],
    }
    for field, values in cases.items():
        for value in values + ["<missing>"]:
            if value == "<missing>":
                blob = {k: v for k, v in good.items() if k != field}
            else:
                blob = {**good, field: value}
            torch.save(blob, path)
            with pytest.raises((TypeError, ValueError)) as err:
                px.Proxy.load(path)
            msg = str(err.value)
            assert str(path) in msg and field in msg, (field, value, msg)
    torch.save(good, path)
    px.Proxy.load(path)
