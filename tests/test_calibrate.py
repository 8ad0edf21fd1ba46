"""The calibration of the fluid models to L2-legacy (isaac_net.core.diff.calibrate): the fit
recovers constants it can recover, improves held-out points, and the file and apply contracts."""

import dataclasses
import json
import math
import warnings

import pytest
import torch

from isaac_net.core import CellConfig
from isaac_net.core.diff import DiffFluid, calibrate
from isaac_net.core.levels import L2LegacyConfig, make_engine

GRID = calibrate.product_grid([0.3, 0.7], [8000.0, 24000.0], [23.0])
HELD = calibrate.product_grid([0.5], [16000.0], [18.0])
TINY = dict(R=4, envs=3, model_envs=2, T=12, warmup=3,
            search={"rate_factor": (0.4, 0.7, 1.0), "snr_offset_db": (-6.0, 0.0), "sr_slots": {"L1": (0, 16),
                    "QA": (4, 16)}, "refine_top": 1, "refine_evals": 6})


@pytest.fixture(scope="module")
def fitted():
    """One QAD relaxed calibration on the tiny grid (L2-legacy targets measured once)."""
    return calibrate.fit("QA", "relaxed", grid=GRID, heldout=HELD, **TINY)


def test_candidates_through_the_inputs_equal_the_constants():
    """The fit's shortcut: bytes / rate_factor and SNR + offset give the KPIs of the constants (the
    model run on the cell with them, not through model_kpis), also on top of a cfg's own constants."""
    from isaac_net.core.diff.calibrate.evaluate import _rollout_kpis

    prob = calibrate.problem(GRID, R=4, envs=2, T=10, warmup=2, seed=3, dtype=torch.float64)
    for mode in ("L1", "QA"):
        cfg = dataclasses.replace(CellConfig(), **{calibrate.sr_field(mode): 8})
        batched = calibrate.model_kpis(mode, "relaxed", prob, cfg, tau=0.05, lam=0.1,
                                       candidates=[(1.0, 0.0), (0.6, -4.0)])
        stacked = calibrate.model_kpis(mode, "relaxed", prob, dataclasses.replace(cfg, rate_factor=0.75,
                                                                                   snr_offset_db=1.0),
                                       tau=0.05, lam=0.1, candidates=[(0.8, -5.0)])
        with_constants = dataclasses.replace(cfg, rate_factor=0.6, snr_offset_db=-4.0)
        exact = _rollout_kpis(mode, "relaxed", prob, with_constants, prob.p, tau=0.05, lam=0.1)
        for k in calibrate.TARGET_KPIS:
            torch.testing.assert_close(batched[k][1], exact[k], rtol=1e-6, atol=1e-9)
            torch.testing.assert_close(stacked[k][0], exact[k], rtol=1e-6, atol=1e-9)
            assert not torch.allclose(batched[k][0], batched[k][1])  # the candidates do differ


def test_fit_recovers_constants_from_a_calibrated_fluid_target():
    """Targets made by the fluid model itself with known constants: the fit lands on them (loss ~ 0)."""
    truth = dict(rate_factor=0.7, snr_offset_db=-6.0, qa_sr_slots=16)
    prob = calibrate.problem(GRID, R=4, envs=2, T=12, warmup=3, seed=0)
    target = {k: v[0] for k, v in calibrate.model_kpis("QA", "relaxed", prob,
                                                       dataclasses.replace(CellConfig(), **truth),
                                                       tau=0.05, lam=0.1).items()}
    cal = calibrate.fit("QA", "relaxed", grid=GRID, targets=target, **{**TINY, "envs": 2})
    assert cal.sr_slots == 16
    assert cal.rate_factor == pytest.approx(0.7, rel=0.05)
    assert cal.snr_offset_db == pytest.approx(-6.0, abs=0.5)
    assert cal.train_loss < 1e-3 < cal.uncalibrated_train_loss
    assert cal.heldout_loss is None
    assert cal.tau == 0.05 and cal.setup["search"]["tau"] == [0.05]  # no temperatures to search: the fit's
    assert cal.qa_snr_req_db is None and "qa_snr_req_db" not in cal.constants  # not searched: the cell's


@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.xdist_group(f"compiled-{m}"))
                                  for m in ("L1", "QA")])
def test_fit_compiled_chooses_what_the_eager_fit_chooses(mode):
    """compile=True runs the same losses to float rounding: the same latency floor and temperature,
    the constants and losses of the eager fit, and the setup says it was compiled."""
    truth = dict(rate_factor=0.7, snr_offset_db=-6.0, **{calibrate.sr_field(mode): 16})
    prob = calibrate.problem(GRID, R=4, envs=2, T=12, warmup=3, seed=0)
    target = {k: v[0] for k, v in calibrate.model_kpis(mode, "relaxed", prob,
                                                       dataclasses.replace(CellConfig(), **truth),
                                                       tau=0.1, lam=0.1).items()}
    kw = {**TINY, "envs": 2, "search": {**TINY["search"], "tau": (0.05, 0.1)}}
    eager = calibrate.fit(mode, "relaxed", grid=GRID, targets=target, **kw)
    compiled = calibrate.fit(mode, "relaxed", grid=GRID, targets=target, compile=True, **kw)
    assert (compiled.sr_slots, compiled.tau) == (eager.sr_slots, eager.tau) == (16, 0.1)
    assert compiled.rate_factor == pytest.approx(eager.rate_factor, rel=1e-3)
    assert compiled.snr_offset_db == pytest.approx(eager.snr_offset_db, abs=1e-2)
    assert compiled.train_loss == pytest.approx(eager.train_loss, abs=1e-4)
    assert compiled.uncalibrated_train_loss == pytest.approx(eager.uncalibrated_train_loss, rel=1e-5)
    assert compiled.setup["compile"] is True and eager.setup["compile"] is False
    with pytest.raises(TypeError, match="compile"):
        calibrate.fit(mode, "relaxed", grid=GRID, targets=target, compile="yes", **kw)


def test_fit_chooses_the_temperature_and_snr_requirement_of_the_target():
    """Targets made by QAD at tau = 0.2 with known constants and a headroom requirement of 5 dB: from
    the temperatures 0.05 and 0.2 and the requirements 15 and 5 dB the fit takes 0.2 and 5 dB and lands
    on the constants; the plain model's loss stays at the fit's tau and the cell's requirement."""
    truth = dict(rate_factor=0.7, snr_offset_db=-6.0, qa_sr_slots=16, qa_snr_req_db=5.0)
    prob = calibrate.problem(GRID, R=4, envs=2, T=12, warmup=3, seed=0)
    target = {k: v[0] for k, v in calibrate.model_kpis("QA", "relaxed", prob,
                                                       dataclasses.replace(CellConfig(), **truth),
                                                       tau=0.2, lam=0.1).items()}
    search = {**TINY["search"], "tau": (0.05, 0.2), "qa_snr_req_db": (15.0, 5.0)}
    cal = calibrate.fit("QA", "relaxed", grid=GRID, targets=target, **{**TINY, "envs": 2, "search": search})
    assert cal.tau == 0.2 and cal.sr_slots == 16 and cal.qa_snr_req_db == 5.0
    assert cal.rate_factor == pytest.approx(0.7, rel=0.05)
    assert cal.train_loss < 1e-3
    assert cal.setup["tau"] == 0.05 and cal.setup["search"]["tau"] == [0.05, 0.2]
    assert cal.constants["qa_snr_req_db"] == 5.0 and cal.apply(CellConfig()).qa_snr_req_db == 5.0
    plain = calibrate.model_kpis("QA", "relaxed", prob, CellConfig(), tau=0.05, lam=0.1)
    pairs = calibrate.neighbours(GRID)
    uncalibrated = float(calibrate.loss(plain, target, pairs)[0])
    assert cal.uncalibrated_train_loss == pytest.approx(uncalibrated, rel=1e-6)
    assert cal.setup["slope_weight"] == calibrate.SLOPE_WEIGHT and cal.setup["slope_pairs"] == len(pairs) == 4


def test_neighbours_pair_adjacent_points_along_one_coordinate_and_fleet_size():
    """Neighbours differ in one coordinate only, at its next value among the points (not two values
    apart, not in two coordinates), at one fleet size; and each point pairs with itself at the next
    fleet size."""
    points = calibrate.product_grid([0.1, 0.4, 0.8], [6000.0], [23.0, 13.0])
    # (0.1, 23) (0.1, 13) (0.4, 23) (0.4, 13) (0.8, 23) (0.8, 13): p steps 0->2, 2->4, 1->3, 3->5; 13 < 23
    one_size = {(0, 2), (2, 4), (1, 3), (3, 5), (1, 0), (3, 2), (5, 4)}
    assert {tuple(pair) for pair in calibrate.neighbours(points).tolist()} == one_size
    two = {tuple(pair) for pair in calibrate.neighbours(points, 2).tolist()}
    assert two == one_size | {(i + 6, j + 6) for i, j in one_size} | {(i, i + 6) for i in range(6)}
    assert calibrate.neighbours([(0.5, 8000.0, 23.0)]).shape == (0, 2)


def test_loss_adds_the_slope_term_the_error_of_the_changes_between_neighbours():
    """The slope term is the weighted square of the errors' changes between neighbours: a model off by
    the same factor everywhere has slopes right (level term only); one whose error flips sign between
    neighbours has the level term of the first plus the changes' squares."""
    target = {"mean_delay": torch.tensor([1.0, 2.0, 4.0]), "mean_aoi": torch.tensor([3.0, 3.0, 3.0]),
              "mean_energy_j": torch.tensor([1e-3, 2e-3, 3e-3]),
              "delivery_ratio": torch.tensor([1.0, 0.9, 0.5])}
    pairs = torch.tensor([[0, 1], [1, 2]])
    scaled = {**target, "mean_delay": 2.0 * target["mean_delay"]}
    level = float(torch.log(torch.tensor(2.0)) ** 2)
    assert float(calibrate.point_loss(scaled, target).mean()) == pytest.approx(level)
    assert float(calibrate.loss(scaled, target, pairs)) == pytest.approx(level)
    zigzag = {**target, "mean_delay": target["mean_delay"] * torch.tensor([2.0, 0.5, 2.0])}
    slope = float(2 * torch.log(torch.tensor(4.0)) ** 2 / 2)  # changes of log error: -log 4, +log 4
    assert float(calibrate.loss(zigzag, target, pairs)) == pytest.approx(level + slope)
    half = float(calibrate.loss(zigzag, target, pairs, slope_weight=0.5))
    assert half == pytest.approx(level + 0.5 * slope)
    assert float(calibrate.loss(zigzag, target, pairs, slope_weight=0.0)) == pytest.approx(level)
    delivering = {**target, "delivery_ratio": target["delivery_ratio"] + torch.tensor([0.0, 0.1, 0.0])}
    # delivery errors 0, 1, 0 (units of 0.1): level 1/3, changes +1 and -1: slope 1
    assert float(calibrate.loss(delivering, target, pairs)) == pytest.approx(1 / 3 + 1.0)
    none = {**target, "mean_delay": torch.tensor([0.0, 2.0, 4.0])}  # nothing delivered, no delay: infinite
    assert calibrate.loss(none, target, pairs) == math.inf


def test_gradient_check_flags_an_exploding_backpropagation_and_passes_a_stable_one():
    """L1D with mean-field sends and a latency floor of 32 of its 40 slots at tau = 0.05 (constants an
    earlier fit chose): near critical load its state map expands step after step, and the rollout's
    autograd derivative in p is thousands of times the model's own finite difference. The same
    rollout without the floor matches its finite difference."""
    prob = calibrate.problem([(0.5, 20000.0, 23.0)], R=8, envs=2, T=60, warmup=5, seed=0)
    consts = dict(rate_factor=0.569, snr_offset_db=-3.89)
    exploding = calibrate.check_gradients("L1", "mean_field", prob, CellConfig(**consts, l1_sr_slots=32),
                                          tau=0.05, lam=0.1)
    plain = calibrate.check_gradients("L1", "mean_field", prob, CellConfig(**consts), tau=0.05, lam=0.1)
    assert not exploding["stable"] and exploding["worst_error"] > 1e3
    assert abs(exploding["autograd"]) > 1e3 * abs(exploding["fd"])
    assert plain["stable"] and plain["worst_error"] < 0.01
    assert plain["point"] == [0.5, 20000.0, 23.0]
    assert plain["max_error"] == calibrate.SEARCH["gradient_max_error"]


def _fake_check(unstable_floors):
    """``check_gradients`` that declares the QA floors ``unstable_floors`` unusable (the rest as measured)."""
    real = calibrate.check_gradients

    def check(mode, sends, prob, cfg, **kw):
        out = real(mode, sends, prob, cfg, **kw)
        if cfg.qa_sr_slots in unstable_floors:
            out = {**out, "stable": False, "worst_error": 1e6}
        return out
    return check


def test_the_gradient_check_runs_on_the_first_check_envs_cells(monkeypatch):
    """``check_envs`` cells a point in every gradient check (the first of the model's), all
    ``model_envs`` without it; the fitted constants' check is recorded with the count."""
    real, seen = calibrate.check_gradients, []

    def check(mode, sends, prob, cfg, **kw):
        seen.append((prob.envs, prob.p.shape[0]))
        return real(mode, sends, prob, cfg, **kw)

    monkeypatch.setattr(calibrate.search, "check_gradients", check)
    kw = {**TINY, "search": {**TINY["search"], "air_crowd_exp": None}}
    cal = calibrate.fit("QA", "relaxed", grid=GRID, check_envs=1, **kw)
    assert seen and set(seen) == {(1, len(GRID))} and cal.setup["check_envs"] == 1
    seen.clear()
    cal = calibrate.fit("QA", "relaxed", grid=GRID, **kw)
    assert seen and set(seen) == {(2, 2 * len(GRID))} and cal.setup["check_envs"] == 2


def test_fit_sets_aside_a_floor_whose_gradients_explode(monkeypatch):
    """The refined floor with the lowest loss fails the gradient check: the fit refines the next floor
    of the grid's ranking and takes it, recording the rejected floor; with every floor failing, it keeps
    the best fit, flagged, and warns."""
    truth = dict(rate_factor=0.7, snr_offset_db=-6.0, qa_sr_slots=16)
    prob = calibrate.problem(GRID, R=4, envs=2, T=12, warmup=3, seed=0)
    target = {k: v[0] for k, v in calibrate.model_kpis("QA", "relaxed", prob,
                                                       dataclasses.replace(CellConfig(), **truth),
                                                       tau=0.05, lam=0.1).items()}
    kw = {**TINY, "envs": 2, "search": {**TINY["search"], "air_crowd_exp": None}}  # the floors alone
    monkeypatch.setattr(calibrate.search, "check_gradients", _fake_check({16}))
    cal = calibrate.fit("QA", "relaxed", grid=GRID, targets=target, **kw)
    assert cal.sr_slots == 4 and cal.gradient_check["stable"]
    assert [r["sr_slots"] for r in cal.gradient_check["rejected"]] == [16]
    assert cal.gradient_check["rejected"][0]["train_loss"] < 1e-3 < cal.train_loss  # the truth, set aside
    assert cal.setup["gradient_checks"] == 2

    monkeypatch.setattr(calibrate.search, "check_gradients", _fake_check({4, 16}))
    match = "no latency floor of \\[4, 16\\] at a temperature of \\[0.05\\] passes the gradient check"
    with pytest.warns(UserWarning, match=match):
        flagged = calibrate.fit("QA", "relaxed", grid=GRID, targets=target, **kw)
    assert flagged.sr_slots == 16 and not flagged.gradient_check["stable"]
    assert [r["sr_slots"] for r in flagged.gradient_check["rejected"]] == [4]


def test_each_requirement_has_its_best_choices_refined(monkeypatch):
    """The grid ranks a requirement's choices before any is refined: with ``refine_top`` 1 and the two
    best grid choices at 15 dB, the best choice at 5 dB (ranked third) is refined too, and wins when its
    refined loss is the lowest; the 15 dB runner-up is not refined."""
    from isaac_net.core.diff.calibrate import search as S

    coarse = [S._Fitted(1.0, 0.6, 0.0, 8, 0.05, 15.0), S._Fitted(1.1, 0.6, 0.0, 16, 0.05, 15.0),
              S._Fitted(1.2, 0.6, 0.0, 8, 0.05, 5.0), S._Fitted(1.3, 0.6, 0.0, 16, 0.05, 5.0)]
    refined_loss = {(8, 0.05, 15.0): 0.9, (16, 0.05, 15.0): 0.1, (8, 0.05, 5.0): 0.5, (16, 0.05, 5.0): 0.2}
    monkeypatch.setattr(S, "_refine", lambda obj, start, evals, tried, report: start._replace(
        loss=refined_loss[start.choice]))
    monkeypatch.setattr(S, "_check", lambda obj, cand, sp, sizes, report: {"stable": True})
    best, _, refined, _ = S._choose_usable(None, coarse, {"refine_top": 1, "refine_evals": 1}, (8,), None)
    assert [c.choice for c in refined] == [(8, 0.05, 15.0), (8, 0.05, 5.0)]
    assert best.choice == (8, 0.05, 5.0) and best.loss == 0.5


def test_fit_recovers_the_time_on_air_after_the_other_constants():
    """Targets made by QAD with a known time on air (a factor and a crowd exponent) on top of known
    constants: the fit finds the other constants as without it, then the exponent and the factor,
    records the search, and the loss with them is below the loss without."""
    truth = dict(rate_factor=0.7, snr_offset_db=-6.0, qa_sr_slots=16, air_factor=1.6, air_crowd_exp=0.5)
    prob = calibrate.problem(GRID, R=4, envs=2, T=12, warmup=3, seed=0)
    target = {k: v[0] for k, v in calibrate.model_kpis("QA", "relaxed", prob,
                                                       dataclasses.replace(CellConfig(), **truth),
                                                       tau=0.05, lam=0.1).items()}
    # the other constants' search holds the truth alone (Nelder-Mead's one evaluation its start):
    # what is measured is the time on air's search
    exact = {"rate_factor": (0.7,), "snr_offset_db": (-6.0,), "sr_slots": {"QA": (16,)}, "refine_top": 1,
             "refine_evals": 1}
    cal = calibrate.fit("QA", "relaxed", grid=GRID, targets=target, **{**TINY, "envs": 2, "search": exact})
    assert (cal.rate_factor, cal.snr_offset_db, cal.sr_slots) == (0.7, -6.0, 16)
    assert cal.air_crowd_exp == pytest.approx(0.5, abs=0.05)
    assert cal.air_factor == pytest.approx(1.6, rel=0.1)
    rec = cal.setup["air_fit"]
    assert rec["kept"] and rec["gradient_check_stable"] and rec["bounds"] == [-0.5, 1.5]
    assert rec["loss"] == cal.train_loss < 1e-3 < rec["loss_without"]
    assert 3 <= rec["evaluations"] <= calibrate.SEARCH["air_evals"]
    # the search's loss (the recorded energy) is the model's own for the constants it found
    assert rec["basis_loss"] == pytest.approx(rec["loss"], rel=1e-4, abs=1e-9)
    assert cal.apply().air_crowd_exp == cal.air_crowd_exp  # the constants go into the cell
    back = calibrate.Calibration.from_dict(cal.to_dict())
    assert (back.air_factor, back.air_crowd_exp) == (cal.air_factor, cal.air_crowd_exp)
    old = {k: v for k, v in cal.to_dict().items() if k not in ("air_factor", "air_crowd_exp")}
    assert calibrate.Calibration.from_dict(old).constants["air_crowd_exp"] == 0.0  # an older entry: plain
    with pytest.raises(ValueError, match="search\\['air_crowd_exp'\\]: expected None or bounds"):
        calibrate.fit("QA", "relaxed", grid=GRID, targets=target,
                      **{**TINY, "envs": 2, "search": {**exact, "air_crowd_exp": [1.0, 0.0]}})


@pytest.mark.parametrize("mode", ["L1", "QA"])
@pytest.mark.parametrize("sends", ["mean_field", "relaxed"])
@pytest.mark.parametrize("tau", [0.05, 0.4])
def test_air_basis_gives_the_models_kpis_under_any_time_on_air(mode, sends, tau):
    """The time on air's search evaluates the energy recorded from two rollouts: for factors and
    exponents across their range, a cap that binds (factor 20) and the plain rule (1, 0), its KPIs
    are the model's run with the constants (float64: energy to 1e-8 relative, the rest identical)."""
    pts = calibrate.product_grid([0.2, 0.9], [6000.0, 30000.0], [13.0, 23.0])
    prob = calibrate.problem(pts, R=6, envs=2, T=14, warmup=3, seed=5, dtype=torch.float64)
    cfg = dataclasses.replace(CellConfig(), rate_factor=0.5, snr_offset_db=-4.0,
                              **{calibrate.sr_field(mode): 8})
    basis = calibrate.AirBasis.record(mode, sends, prob, cfg, tau=tau, lam=0.1)
    assert basis.tx_s.shape == (11, 2 * len(pts), 6)
    assert float(basis.crowd.min()) > 1.0 - 1e-12 and float(basis.crowd.max()) < 6.5  # smax(n, 1), n <= R
    capped = False
    for factor, exponent in ((0.3, -0.5), (1.0, 0.0), (1.7, 0.6), (5.0, 1.5), (20.0, 1.0)):
        exact = calibrate.model_kpis(mode, sends, prob, dataclasses.replace(
            cfg, air_factor=factor, air_crowd_exp=exponent), tau=tau, lam=0.1)
        got = basis.at(factor, exponent)
        torch.testing.assert_close(got["mean_energy_j"], exact["mean_energy_j"], rtol=1e-8, atol=0.0)
        for k in exact:
            if k != "mean_energy_j":
                assert torch.equal(got[k], exact[k]), k
        if factor == 20.0:  # the cap at the step binds: energy below factor x the plain rule's
            capped = bool((got["mean_energy_j"] < 0.9 * 20.0 * basis.kpis["mean_energy_j"]).any())
    assert capped


def test_fit_on_two_fleet_sizes_recovers_the_constants_and_records_them():
    """Targets made by QAD with known constants on cells of 3 and 5 robots, one size after the other:
    the fit on both lands on the constants; the calibration records both sizes (an old file's single
    R loads as a tuple of one) and warns only at a size it was not fitted for."""
    truth = dict(rate_factor=0.7, snr_offset_db=-6.0, qa_sr_slots=16)
    target = calibrate.concat_points(
        {k: v[0] for k, v in calibrate.model_kpis(
            "QA", "relaxed", calibrate.problem(GRID, R=r, envs=2, T=12, warmup=3, seed=0),
            dataclasses.replace(CellConfig(), **truth), tau=0.05, lam=0.1).items()}
        for r in (3, 5))
    assert target["mean_delay"].shape == (2 * len(GRID),)
    cal = calibrate.fit("QA", "relaxed", grid=GRID, targets=target, **{**TINY, "envs": 2, "R": [3, 5]})
    assert cal.R == (3, 5) and cal.grid == GRID
    assert cal.sr_slots == 16 and cal.rate_factor == pytest.approx(0.7, rel=0.05)
    assert cal.train_loss < 1e-3 < cal.uncalibrated_train_loss
    assert cal.gradient_check["R"] in (3, 5) and cal.gradient_check["stable"]
    assert calibrate.Calibration.from_dict({**cal.to_dict(), "R": 3}).R == (3,)
    assert calibrate.Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cal.apply(CellConfig(), R=5)
    with pytest.warns(UserWarning, match=r"R = 4 \(fitted for 3 and 5\)"):
        cal.apply(CellConfig(), R=4)


def test_fit_improves_the_held_out_points(fitted):
    assert fitted.train_loss < fitted.uncalibrated_train_loss
    assert fitted.heldout_loss < fitted.uncalibrated_heldout_loss
    assert fitted.grid == GRID and fitted.heldout_grid == HELD and fitted.R == (4,)
    assert fitted.l2_config == json.loads(json.dumps(dataclasses.asdict(L2LegacyConfig())))


def test_apply_gives_a_config_the_models_and_levels_accept(fitted):
    cfg = fitted.apply(CellConfig(), R=4, area_m=(40.0, 140.0))
    assert (cfg.rate_factor, cfg.snr_offset_db, cfg.qa_sr_slots) == (fitted.rate_factor, fitted.snr_offset_db,
                                                                     fitted.sr_slots)
    assert cfg.l1_sr_slots == 0  # a QA calibration leaves L1's floor alone
    DiffFluid(2, 4, mode="QA", cfg=cfg)
    make_engine("QA", 2, 4, cfg=cfg)
    net = fitted.model(2, 4, dtype=torch.float64)  # the model as fitted: its mode, temperature and cell
    assert (net.mode, net.tau, net.dtype, net.cfg) == ("QA", fitted.tau, torch.float64, fitted.apply())
    with pytest.raises(TypeError, match="model: mode and tau are the calibration's"):
        fitted.model(2, 4, tau=0.01)
    with pytest.raises(ValueError, match="L2-legacy takes no calibration constants"):
        make_engine("L2-legacy", 2, 4, cfg=dataclasses.replace(fitted.apply(), rate_factor=0.5))


def test_save_load_several_and_clear_errors(fitted, tmp_path):
    path = tmp_path / "cal.json"
    fitted.save(path)
    other = dataclasses.replace(fitted, mode="L1", sends="mean_field", rate_factor=0.5)
    other.save(path)
    fitted.save(path)  # replaces its own entry, keeps the other
    data = json.loads(path.read_text())
    pairs = [(e["mode"], e["sends"]) for e in data["calibrations"]]
    assert pairs == [("L1", "mean_field"), ("QA", "relaxed")]
    assert calibrate.Calibration.load(path, mode="QA", sends="relaxed") == fitted
    assert fitted.gradient_check["stable"] and fitted.gradient_check["worst_error"] >= 0
    old = {**data, "calibrations": [{k: v for k, v in e.items() if k != "gradient_check"}
                                    for e in data["calibrations"]]}
    (tmp_path / "old.json").write_text(json.dumps(old))  # written before the check existed: loads, None
    old_cal = calibrate.Calibration.load(tmp_path / "old.json", mode="QA", sends="relaxed")
    assert old_cal.gradient_check is None
    no_tau = {**data, "calibrations": [{k: v for k, v in e.items() if k != "tau"}
                                       for e in data["calibrations"]]}
    (tmp_path / "no_tau.json").write_text(json.dumps(no_tau))  # before the temperature was fitted: the fit's
    no_tau_cal = calibrate.Calibration.load(tmp_path / "no_tau.json", mode="QA", sends="relaxed")
    assert no_tau_cal.tau == fitted.setup["tau"] == 0.05
    for bad in (0.0, -0.1, float("nan"), "0.1"):
        with pytest.raises(ValueError, match="tau: expected a finite temperature > 0"):
            dataclasses.replace(fitted, tau=bad)
    assert no_tau_cal.qa_snr_req_db is None  # nor the requirement: the cell's own
    for bad in (float("inf"), True, "5"):
        with pytest.raises(ValueError, match="qa_snr_req_db: expected None or, for mode 'QA', a finite"):
            dataclasses.replace(fitted, qa_snr_req_db=bad)
    with pytest.raises(ValueError, match="qa_snr_req_db: expected None or, for mode 'QA'"):
        dataclasses.replace(fitted, mode="L1", qa_snr_req_db=5.0)  # L1D has no headroom rule
    assert calibrate.Calibration.load(path, mode="L1", sends="mean_field").rate_factor == 0.5
    missing = r"no calibration for mode='L1', sends='relaxed'.*\(L1, mean_field\)"
    with pytest.raises(ValueError, match=missing):
        calibrate.Calibration.load(path, mode="L1", sends="relaxed")
    with pytest.raises(ValueError, match="unknown mode 'L3'; expected one of: L1, QA"):
        calibrate.Calibration.load(path, mode="L3", sends="relaxed")
    (tmp_path / "other.json").write_text(json.dumps({"summary": {}}))
    with pytest.raises(ValueError, match="not a calibration file"):
        calibrate.Calibration.load(tmp_path / "other.json", mode="QA", sends="relaxed")
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a calibration file"):
        calibrate.Calibration.load(tmp_path / "garbage.json", mode="QA", sends="relaxed")
    with pytest.raises(ValueError, match="no such calibration file"):
        calibrate.Calibration.load(tmp_path / "missing.json", mode="QA", sends="relaxed")


def test_apply_warns_once_outside_what_it_was_fitted_for_and_refuses_another_l2_config(fitted):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fitted.apply(CellConfig(), R=16, area_m=(100.0, 200.0))
        fitted.apply(CellConfig(), R=16, area_m=(100.0, 200.0))
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and "R = 16 (fitted for 4)" in msgs[0] and "area_m" in msgs[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted.apply(CellConfig(), R=4, l2_config=L2LegacyConfig())  # what it was fitted for: silent
    other_l2 = "l2_config: .*fitted against another L2LegacyConfig .*sr_period_slots"
    with pytest.raises(ValueError, match=other_l2):
        fitted.apply(CellConfig(), l2_config=L2LegacyConfig(sr_period_slots=20))
    with pytest.raises(TypeError, match="cfg: expected a CellConfig"):
        fitted.apply({"rate_factor": 1.0})


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="L3"), "unknown mode 'L3'; expected one of: L1, QA"),
    (dict(sends="binary"), "sends: expected one of"),
    (dict(level="L1"), "level: calibrations are fitted to 'L2-legacy'"),
    (dict(cfg=CellConfig(rate_factor=0.5)), "cfg: expected the plain cell"),
    (dict(model_envs=5), r"model_envs: expected an integer in \[1, envs=3\]"),
    (dict(check_envs=3), r"check_envs: expected None or an integer in \[1, model_envs=2\], got 3"),
    (dict(check_envs=0), r"check_envs: expected None or an integer in \[1, model_envs=2\], got 0"),
    (dict(search={"sr_slots": {"QA": (0, 99)}}), r"search: latency floors must lie in \[0, num_slots=40\]"),
    (dict(search={"tau": (0.05, 0.0)}), r"search: temperatures \(tau\) must be finite and > 0"),
    (dict(search={"qa_snr_req_db": (15.0, float("nan"))}), r"search: SNR requirements \(qa_snr_req_db\)"),
    (dict(grid=()), "grid: expected at least one operating point"),
    (dict(R=0), "R: expected an integer >= 1 or a non-empty sequence"),
    (dict(R=()), "R: expected an integer >= 1 or a non-empty sequence"),
    (dict(R=(4, 2.5)), "R: expected an integer >= 1 or a non-empty sequence"),
    (dict(R=(4, 4)), r"R: expected distinct fleet sizes, got \[4, 4\]"),
    (dict(targets={k: torch.ones(3) for k in calibrate.TARGET_KPIS}), r"targets: expected 4 values per KPI"),
    (dict(targets={"mean_delay": torch.ones(4)}), r"targets: expected the KPIs .* missing"),
    (dict(grid=((1.5, 1000.0, 23.0),)), r"grid: expected points \(p in \[0, 1\]"),
    (dict(slope_weight=-1.0), "slope_weight: expected a finite number >= 0, got -1.0"),
    (dict(slope_weight=float("nan")), "slope_weight: expected a finite number >= 0"),
    (dict(slope_weight="1"), "slope_weight: expected a finite number >= 0"),
])
def test_fit_refuses_bad_arguments(kwargs, match):
    args = {"mode": "QA", "sends": "relaxed", "grid": GRID, **TINY, **kwargs}
    with pytest.raises(ValueError, match=match):
        calibrate.fit(args.pop("mode"), args.pop("sends"), **args)


def test_calibration_constants_are_validated():
    for bad, match in ((dict(rate_factor=0.0), "rate_factor must be a finite number > 0"),
                       (dict(rate_factor=True), "rate_factor must be a finite number > 0"),
                       (dict(snr_offset_db=float("nan")), "snr_offset_db must be a finite number"),
                       (dict(l1_sr_slots=41), r"l1_sr_slots must be an integer in \[0, num_slots\]"),
                       (dict(l1_sr_slots=2.0), r"l1_sr_slots must be an integer"),
                       (dict(load_spread=-0.5), r"load_spread must lie in \[0, 4\]"),
                       (dict(load_spread=float("inf")), "load_spread must be a finite number")):
        with pytest.raises(ValueError, match=match):
            CellConfig(**bad)
    assert not CellConfig().is_calibrated and CellConfig(l1_sr_slots=1).is_calibrated
    assert CellConfig(load_spread=1.0).is_calibrated
    with pytest.raises(ValueError, match="L2-legacy takes no calibration constants"):
        make_engine("L2-legacy", 2, 4, cfg=CellConfig(load_spread=1.0))


def test_a_mean_field_fit_records_its_load_spread_and_the_model_runs_with_it():
    """``fit(load_spread=)``: the calibrated model's mean-field sends spread per step (the record's
    constant, which ``apply`` puts in the cell and a file keeps), the plain model's loss without it;
    refused for relaxed sends, whose own draws spread, and out of range."""
    search = {"rate_factor": (0.7,), "snr_offset_db": (-6.0,), "sr_slots": {"QA": (8,)}, "tau": (0.1,),
              "refine_top": 1, "refine_evals": 1, "air_crowd_exp": None}
    prob = calibrate.problem(GRID, R=4, envs=2, T=12, warmup=3, seed=0)
    target = {k: v[0] for k, v in calibrate.model_kpis("QA", "relaxed", prob, CellConfig(), tau=0.05,
                                                       lam=0.1).items()}
    kw = {**TINY, "envs": 2, "search": search, "targets": target}
    plain, spread = (calibrate.fit("QA", "mean_field", grid=GRID, load_spread=s, **kw) for s in (0.0, 1.0))
    _assert_option_recorded(plain, spread, "load_spread", 1.0, off=0.0)
    with pytest.raises(ValueError, match="load_spread: a load spread of mean-field sends"):
        calibrate.fit("QA", "relaxed", grid=GRID, load_spread=1.0, **kw)
    for bad in (-1.0, 4.5):  # the cell's range, [0, 4], refused before the fit's minutes
        with pytest.raises(ValueError, match=r"load_spread: expected a finite number in \[0, 4\], got "):
            calibrate.fit("QA", "mean_field", grid=GRID, load_spread=bad, **kw)
    relaxed = {**spread.to_dict(), "sends": "relaxed"}
    with pytest.raises(ValueError, match="cal.json: calibration field 'load_spread': a load spread of "
                                         "mean-field sends; expected 0 for sends"):
        calibrate.Calibration.from_dict(relaxed, "cal.json")
    # a file's entry is held to the cell's range by the same check, naming the file and the field
    with pytest.raises(ValueError, match=r"cal.json: calibration field 'load_spread': expected a finite "
                                         r"number in \[0, 4\], got 4.5"):
        calibrate.Calibration.from_dict({**spread.to_dict(), "load_spread": 4.5}, "cal.json")
    # Built directly (not from a file or a fit), the record refuses it too: a relaxed rollout ignores it.
    with pytest.raises(ValueError, match="load_spread: a load spread of mean-field sends; expected 0 for "
                                         "sends='relaxed'"):
        dataclasses.replace(spread, sends="relaxed")
    for bad in (-1.0, 4.5, float("nan"), True, "1"):
        with pytest.raises(ValueError, match=r"load_spread: expected a finite number in \[0, 4\]"):
            dataclasses.replace(spread, load_spread=bad)
    assert dataclasses.replace(spread, load_spread=4.0).apply().load_spread == 4.0  # the range's top
    assert dataclasses.replace(spread, sends="relaxed", load_spread=0.0).load_spread == 0.0


def _assert_option_recorded(plain, fitted, name: str, on, *, off):
    """A fit option ``name`` (a ``CellConfig`` constant the fit holds, not searches): ``fitted`` (with
    ``on``) records it in its constants, ``apply`` and a file, ``plain`` (with ``off``) not; the plain
    model's loss is the same for both, the calibrated one's differs; an entry without it has ``off``."""
    assert (getattr(plain, name), getattr(fitted, name)) == (off, on)
    assert fitted.constants[name] == on and getattr(fitted.apply(), name) == on
    assert fitted.uncalibrated_train_loss == plain.uncalibrated_train_loss  # the plain model: without it
    assert fitted.train_loss != pytest.approx(plain.train_loss, rel=1e-6)
    back = calibrate.Calibration.from_dict(fitted.to_dict())
    assert getattr(back, name) == on and getattr(back.model(2, 4).cfg, name) == on
    older = {k: v for k, v in fitted.to_dict().items() if k != name}
    assert getattr(calibrate.Calibration.from_dict(older), name) == off  # an entry fitted without it


def _one_choice_qad_fit() -> dict:
    """``fit``'s keywords for a QAD fit of one choice (two Nelder-Mead evaluations) on ``GRID`` at
    R = 4, its targets the plain QAD relaxed's KPIs: what a fit option's record is tested on."""
    search = {"rate_factor": (0.7,), "snr_offset_db": (-6.0,), "sr_slots": {"QA": (8,)}, "tau": (0.1,),
              "refine_top": 1, "refine_evals": 1, "air_crowd_exp": None}
    prob = calibrate.problem(GRID, R=4, envs=2, T=12, warmup=3, seed=0)
    target = {k: v[0] for k, v in calibrate.model_kpis("QA", "relaxed", prob, CellConfig(), tau=0.05,
                                                       lam=0.1).items()}
    return {**TINY, "envs": 2, "search": search, "targets": target, "compile": False}


def test_a_qad_fit_records_its_grant_width_and_the_model_runs_with_it():
    """``fit(qa_min_grant_subbands=)``: QAD's calibrated model spreads a robot's power over at least that
    many subbands (the record's constant, which ``apply`` and a file keep; an older entry without it
    has QA's 1), the plain model's loss without it; refused for L1D and outside [1, num_subbands],
    before the fit and in a file."""
    kw = _one_choice_qad_fit()
    plain, wide = (calibrate.fit("QA", "relaxed", grid=GRID, qa_min_grant_subbands=k, **kw)
                   for k in (1.0, 3.0))
    _assert_option_recorded(plain, wide, "qa_min_grant_subbands", 3.0, off=1.0)
    with pytest.raises(ValueError, match="qa_min_grant_subbands: a rule of QA's spectral efficiency; "
                                         "expected 1 for mode 'L1'"):
        calibrate.fit("L1", "relaxed", grid=GRID, qa_min_grant_subbands=3.0, **kw)
    with pytest.raises(ValueError, match=r"qa_min_grant_subbands: expected a number of subbands in \[1, "
                                         r"num_subbands=12\], got 0.5"):
        calibrate.fit("QA", "relaxed", grid=GRID, qa_min_grant_subbands=0.5, **kw)
    words = "a rule of QA's spectral efficiency; expected 1 for mode 'L1'"  # the check's
    with pytest.raises(ValueError, match=f"cal.json: calibration field 'qa_min_grant_subbands': {words}"):
        calibrate.Calibration.from_dict({**wide.to_dict(), "mode": "L1", "qa_snr_req_db": None}, "cal.json")
    with pytest.raises(ValueError, match="qa_min_grant_subbands: expected a number of subbands"):
        dataclasses.replace(wide, qa_min_grant_subbands=20.0)


def test_a_qad_mean_field_fit_records_its_backlog_closure_and_the_model_runs_with_it():
    """``fit(mf_backlog_closure=)``: QAD mean-field's calibrated model serves a robot as whole messages
    (the record's constant, which ``apply`` puts in the cell and a file keeps), the plain model's loss
    without it; refused for relaxed sends and for L1D, before the fit and in a record or a file."""
    kw = _one_choice_qad_fit()
    plain, closed = (calibrate.fit("QA", "mean_field", grid=GRID, mf_backlog_closure=c, **kw)
                     for c in (False, True))
    assert (plain.mf_backlog_closure, closed.mf_backlog_closure) == (False, True)
    assert closed.constants["mf_backlog_closure"] is True and closed.apply().mf_backlog_closure is True
    assert closed.uncalibrated_train_loss == plain.uncalibrated_train_loss  # the plain model: QAD's own
    assert closed.train_loss != pytest.approx(plain.train_loss, rel=1e-6)
    back = calibrate.Calibration.from_dict(closed.to_dict())
    assert back.mf_backlog_closure is True and back.model(2, 4).cfg.mf_backlog_closure is True
    older = {k: v for k, v in closed.to_dict().items() if k != "mf_backlog_closure"}
    assert calibrate.Calibration.from_dict(older).mf_backlog_closure is False  # an entry fitted without it
    for mode, sends in (("QA", "relaxed"), ("L1", "mean_field")):
        with pytest.raises(ValueError, match=f"mf_backlog_closure: QAD's with mean-field sends; expected "
                                             f"False for mode '{mode}' and sends '{sends}'"):
            calibrate.fit(mode, sends, grid=GRID, mf_backlog_closure=True, **kw)
    words = "QAD's with mean-field sends; expected False for mode 'QA' and sends 'relaxed'"  # the check's
    with pytest.raises(ValueError, match=f"cal.json: calibration field 'mf_backlog_closure': {words}"):
        calibrate.Calibration.from_dict({**closed.to_dict(), "sends": "relaxed"}, "cal.json")
    with pytest.raises(ValueError, match="mf_backlog_closure: expected a bool, got 1"):
        dataclasses.replace(closed, mf_backlog_closure=1)
    with pytest.raises(ValueError, match="L2-legacy takes no calibration constants"):
        make_engine("L2-legacy", 2, 4, cfg=CellConfig(mf_backlog_closure=True))


def test_a_qad_fit_records_its_reshared_time_and_the_model_runs_with_it():
    """``fit(qa_reshare=)``: QAD's calibrated model gives the share ``qa_reshare`` of an idle robot's
    time to the others (the record's constant, which ``apply`` and a file keep; an older entry without
    it has none), the plain model's loss without it; refused for L1D, out of [0, 1] and with the
    backlog closure, before the fit and in a file."""
    kw = _one_choice_qad_fit()
    plain, shared = (calibrate.fit("QA", "relaxed", grid=GRID, qa_reshare=a, **kw) for a in (0.0, 0.5))
    _assert_option_recorded(plain, shared, "qa_reshare", 0.5, off=0.0)
    with pytest.raises(ValueError, match="qa_reshare: a share of QA's interval; expected 0 for mode 'L1'"):
        calibrate.fit("L1", "relaxed", grid=GRID, qa_reshare=0.5, **kw)
    with pytest.raises(ValueError, match=r"qa_reshare: expected a finite number in \[0, 1\], got 1.5"):
        calibrate.fit("QA", "relaxed", grid=GRID, qa_reshare=1.5, **kw)
    with pytest.raises(ValueError, match="qa_reshare: expected 0 with mf_backlog_closure"):
        calibrate.fit("QA", "mean_field", grid=GRID, qa_reshare=0.5, mf_backlog_closure=True, **kw)
    words = "a share of QA's interval; expected 0 for mode 'L1'"  # the check's
    with pytest.raises(ValueError, match=f"cal.json: calibration field 'qa_reshare': {words}"):
        calibrate.Calibration.from_dict({**shared.to_dict(), "mode": "L1", "qa_snr_req_db": None}, "cal.json")
    # an entry with the share and the backlog closure: refused when the file is read, not when applied
    closed = {**shared.to_dict(), "sends": "mean_field", "mf_backlog_closure": True}
    with pytest.raises(ValueError, match="cal.json: calibration field 'qa_reshare': expected 0 with "
                                         "mf_backlog_closure"):
        calibrate.Calibration.from_dict(closed, "cal.json")
    with pytest.raises(ValueError, match="qa_reshare: expected 0 with mf_backlog_closure"):
        dataclasses.replace(shared, sends="mean_field", mf_backlog_closure=True)
