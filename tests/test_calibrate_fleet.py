"""Calibrations across fleet sizes (isaac_net.core.diff.calibrate.fleet): the points scaled per
size, the constants interpolated in log R between fitted sizes, the file with one entry per size,
and the fit by continuation recovering constants that change with the size."""

import dataclasses
import math
import warnings

import pytest
import torch

from isaac_net.core import CellConfig
from isaac_net.core.diff import calibrate
from isaac_net.core.diff.calibrate.fleet import _neighbour_search
from isaac_net.core.levels import L2LegacyConfig


def _cal(R: int, *, mode="QA", sends="relaxed", rate_factor=0.6, snr_offset_db=-4.0, sr_slots=8, tau=0.1,
         qa_snr_req_db=5.0, air_factor=1.0, air_crowd_exp=0.0, load_spread=0.0) -> calibrate.Calibration:
    """A calibration entry at one fleet size with the given constants (no fit behind it)."""
    return calibrate.Calibration(
        mode=mode, sends=sends, rate_factor=rate_factor, snr_offset_db=snr_offset_db, sr_slots=sr_slots,
        train_loss=0.5, heldout_loss=0.7, uncalibrated_train_loss=9.0, uncalibrated_heldout_loss=8.0,
        grid=((0.2, 8000.0, 23.0),), heldout_grid=(), R=(R,), area_m=(40.0, 140.0),
        cell=dataclasses.asdict(CellConfig()), l2_config=dataclasses.asdict(L2LegacyConfig()),
        setup={"tau": 0.05}, tau=tau, qa_snr_req_db=qa_snr_req_db if mode == "QA" else None,
        air_factor=air_factor, air_crowd_exp=air_crowd_exp, load_spread=load_spread)


FLEET = calibrate.FleetCalibration("QA", "relaxed", (
    _cal(32, rate_factor=0.3, snr_offset_db=-8.0, sr_slots=24, tau=0.4, qa_snr_req_db=0.0, air_factor=0.25,
         air_crowd_exp=0.1),
    _cal(8, rate_factor=0.6, snr_offset_db=-4.0, sr_slots=8, tau=0.1, qa_snr_req_db=10.0, air_factor=1.0,
         air_crowd_exp=0.4)))


def test_scaled_points_keep_the_offered_bytes_per_cell_and_drop_what_p_cannot_carry():
    pts = calibrate.product_grid([0.1, 0.4, 0.6], [8000.0], [23.0])
    assert calibrate.scaled_points(pts, 8, ref_R=8) == pts
    assert calibrate.scaled_points(pts, 32, ref_R=8) == ((0.025, 8000.0, 23.0), (0.1, 8000.0, 23.0),
                                                         (0.15, 8000.0, 23.0))
    # at 4 robots p doubles: 0.6 -> 1.2 cannot be sent, 0.4 -> 0.8 can
    assert calibrate.scaled_points(pts, 4, ref_R=8) == ((0.2, 8000.0, 23.0), (0.8, 8000.0, 23.0))
    with pytest.raises(TypeError, match="R: expected one fleet size"):
        calibrate.scaled_points(pts, 4.5, ref_R=8)


def test_model_envs_keep_about_model_robots_per_point():
    assert [calibrate.model_envs_for(R, 32, 16) for R in (4, 8, 16, 32, 64)] == [8, 4, 2, 1, 1]
    assert calibrate.model_envs_for(2, 32, 6) == 6  # never more cells than the level ran
    # With a load spread at least SPREAD_MIN_ENVS cells: one cell would be one path of its factors.
    assert calibrate.fleet.SPREAD_MIN_ENVS == 4
    assert [calibrate.model_envs_for(R, 32, 16, 1.0) for R in (4, 8, 16, 32, 64)] == [8, 4, 4, 4, 4]
    assert calibrate.model_envs_for(64, 32, 3, 0.5) == 3  # still at most the level's cells
    assert calibrate.model_envs_for(64, 32, 16, 0.0) == 1


def test_a_size_fitted_with_a_load_spread_runs_its_model_on_at_least_four_cells():
    """``fit_size(load_spread=)`` and ``size_losses`` run the spread model on SPREAD_MIN_ENVS cells a
    point where ``model_robots`` alone would give one, and the forms' own loss is the fit's."""
    grid = calibrate.product_grid([0.2, 0.4], [8000.0], [23.0])
    kw = dict(envs=4, T=12, warmup=3, seed=0, lam=0.1, model_robots=8)
    search = {"rate_factor": (0.7,), "snr_offset_db": (-4.0,), "sr_slots": {"QA": (8,)}, "tau": (0.1,),
              "refine_top": 1, "refine_evals": 2, "air_crowd_exp": None}
    one = calibrate.fit_size("QA", "mean_field", R=8, neighbour=None, grid=grid, search=search,
                             load_spread=1.0, **kw)
    plain = calibrate.fit_size("QA", "mean_field", R=8, neighbour=None, grid=grid, search=search, **kw)
    assert (one.setup["model_envs"], plain.setup["model_envs"]) == (4, 1)
    # the gradient check on the plain rule's cells: the spread's extra cells only average the loss
    assert (one.setup["check_envs"], plain.setup["check_envs"]) == (1, 1)
    assert one.load_spread == 1.0
    targets = {8: calibrate.measure(calibrate.problem(grid, R=8, envs=4, T=12, warmup=3, seed=0),
                                    level="L2-legacy", seed=0)}
    fc = calibrate.FleetCalibration("QA", "mean_field", (one,))
    forms = calibrate.fleet.size_losses(fc, ref_R=8, grids={8: grid}, targets=targets, **kw)
    assert forms[0]["own"] == pytest.approx(one.train_loss, rel=1e-6)


def test_continuation_goes_outwards_from_the_reference_size():
    order = calibrate.continuation_order([64, 4, 16, 8, 32], 8)
    assert order == [(8, None), (16, 8), (32, 16), (64, 32), (4, 8)]
    with pytest.raises(ValueError, match="ref_R: expected one of the fleet sizes"):
        calibrate.continuation_order([4, 8], 16)


def test_the_sizes_that_serve_a_fleet_size_are_those_at_gives_it_from():
    sizes = [64, 4, 16, 8, 32]
    assert calibrate.serving_sizes(sizes, 16) == [16]
    assert calibrate.serving_sizes(sizes, 24) == [16, 32] and calibrate.serving_sizes(sizes, 48) == [32, 64]
    assert calibrate.serving_sizes(sizes, 2) == [4] and calibrate.serving_sizes(sizes, 100) == [64]
    for R in (2, 8, 12, 24, 100):  # the fits named are the only ones at(R) reads
        only = calibrate.FleetCalibration("QA", "relaxed", tuple(
            c for c in FLEET.fits if c.R[0] in calibrate.serving_sizes(FLEET.R, R)))
        assert only.at(R) == FLEET.at(R)
    with pytest.raises(ValueError, match="sizes: expected distinct fleet sizes"):
        calibrate.serving_sizes([8, 8], 8)


def test_the_search_narrows_to_the_neighbouring_sizes_choice():
    search = {**calibrate.SEARCH, "tau": [0.05, 0.1, 0.2, 0.3, 0.4], "qa_snr_req_db": [15.0, 10.0, 5.0, 0.0]}
    got = _neighbour_search(search, _cal(8, sr_slots=0, tau=0.2, qa_snr_req_db=15.0), "QA")
    assert got["sr_slots"] == [0, 8] and got["tau"] == [0.1, 0.2, 0.3] and got["refine_top"] == 1
    assert got["qa_snr_req_db"] == [10.0, 15.0]  # the grid's end: itself and the next
    mid = _neighbour_search(search, _cal(8, qa_snr_req_db=5.0), "QA")
    assert mid["qa_snr_req_db"] == [0.0, 5.0, 10.0]  # within one step, as the floors
    assert _neighbour_search(search, _cal(8, qa_snr_req_db=None), "L1").get("qa_snr_req_db") == \
        search["qa_snr_req_db"]  # L1D has none: the grid passes through; its fit ignores it
    # the capacity factor and offset: the grid's values within one step of the neighbour's (refined,
    # off-grid) ones, 0.6 -> 0.45, 0.6, 0.8 and -4 dB -> -8, -4, 0 dB; at the grid's end two
    assert got["rate_factor"] == [0.45, 0.6, 0.8] and got["snr_offset_db"] == [-8.0, -4.0, 0.0]
    edge = _neighbour_search(search, _cal(8, rate_factor=0.265, snr_offset_db=5.2), "QA")
    assert edge["rate_factor"] == [0.3, 0.45] and edge["snr_offset_db"] == [0.0, 4.0]


def test_at_gives_the_fitted_size_and_interpolates_in_log_R_between():
    assert FLEET.R == (8, 32)
    assert FLEET.at(8) is FLEET.fits[0] and FLEET.at(32) is FLEET.fits[1]
    mid = FLEET.at(16)  # halfway in log R between 8 and 32
    assert mid.R == (16,)
    assert mid.rate_factor == pytest.approx(math.sqrt(0.6 * 0.3))
    assert mid.snr_offset_db == pytest.approx(-6.0)
    assert mid.sr_slots == 16 and mid.tau == pytest.approx(math.sqrt(0.1 * 0.4))
    assert mid.qa_snr_req_db == pytest.approx(5.0)
    # the time on air: its factor geometrically, its exponent linearly
    assert mid.air_factor == pytest.approx(0.5) and mid.air_crowd_exp == pytest.approx(0.25)
    assert mid.train_loss is None and mid.provenance["interpolated_between_R"] == [8, 32]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a size between the fitted ones is what they are for: no warning
        cfg = FLEET.apply(CellConfig(), R=16)
    assert cfg.rate_factor == pytest.approx(mid.rate_factor) and cfg.qa_sr_slots == 16
    assert cfg.qa_snr_req_db == pytest.approx(5.0)
    assert (cfg.air_factor, cfg.air_crowd_exp) == (pytest.approx(0.5), pytest.approx(0.25))
    net = FLEET.model(2, 16)
    assert net.tau == pytest.approx(mid.tau)
    assert mid.load_spread == 0.0  # relaxed sends: none
    mf = calibrate.FleetCalibration("QA", "mean_field", tuple(
        dataclasses.replace(c, sends="mean_field", load_spread=v)
        for c, v in zip(FLEET.fits, (1.0, 0.5), strict=True)))
    assert mf.at(16).load_spread == pytest.approx(0.75)
    assert mf.model(2, 16).cfg.load_spread == pytest.approx(0.75)
    with pytest.raises(AttributeError, match=r"depends on the fleet size; use .at\(R\).tau"):
        _ = FLEET.tau


def test_constants_the_fits_share_are_that_value_exactly_at_every_size_between():
    """A convex combination of two equal constants is that constant, bit for bit: the committed QAD
    mean-field temperatures (0.05 at every fitted size) stay at the closure's least between them."""
    same = calibrate.FleetCalibration("QA", "relaxed", (
        _cal(8, tau=0.05, rate_factor=0.3, snr_offset_db=-7.2, air_factor=0.7, air_crowd_exp=0.3),
        _cal(64, tau=0.05, rate_factor=0.3, snr_offset_db=-7.2, air_factor=0.7, air_crowd_exp=0.3)))
    for R in range(9, 64):
        c = same.at(R)
        assert (c.tau, c.rate_factor, c.snr_offset_db, c.air_factor, c.air_crowd_exp, c.qa_snr_req_db) == \
            (0.05, 0.3, -7.2, 0.7, 0.3, 5.0), R
    # a plain geometric mean of them is not, at some sizes (why the shared value is kept)
    w = [(math.log(R) - math.log(8)) / math.log(8) for R in range(9, 64)]
    assert any(math.exp((1 - x) * math.log(0.05) + x * math.log(0.05)) != 0.05 for x in w)
    # the line in log R through every fit's (the page's parametric form) keeps them too, outside as well
    fits = [_cal(R, tau=0.05, air_crowd_exp=0.3) for R in (4, 8, 16, 32, 64)]
    for R in range(2, 100):
        c = calibrate.fleet._log_linear(fits, R)
        assert (c.tau, c.rate_factor, c.snr_offset_db, c.air_crowd_exp) == (0.05, 0.6, -4.0, 0.3), R


def test_outside_the_fitted_sizes_the_nearest_is_used_with_a_warning():
    assert FLEET.at(100) is FLEET.fits[1] and FLEET.at(4) is FLEET.fits[0]
    with pytest.warns(UserWarning, match=r"used outside what it was fitted for: R = 4 \(fitted for 8\)"):
        cfg = FLEET.apply(CellConfig(), R=4)
    assert cfg.rate_factor == 0.6


def test_a_fleet_calibration_refuses_mixed_models_and_repeated_sizes():
    with pytest.raises(ValueError, match="expected calibrations of \\(QA, relaxed\\) only"):
        calibrate.FleetCalibration("QA", "relaxed", (_cal(8), _cal(16, sends="mean_field")))
    with pytest.raises(ValueError, match="one fit per fleet size"):
        calibrate.FleetCalibration("QA", "relaxed", (_cal(8), _cal(8, rate_factor=0.5)))
    with pytest.raises(TypeError, match="R: expected one fleet size"):
        FLEET.at((8, 16))


def test_a_file_of_several_sizes_loads_as_a_fleet_calibration(tmp_path):
    path = tmp_path / "cal.json"
    FLEET.save(path)
    _cal(8, mode="L1", sends="mean_field", sr_slots=16).save(path)
    got = calibrate.Calibration.load(path, mode="QA", sends="relaxed")
    assert isinstance(got, calibrate.FleetCalibration) and got.R == (8, 32)
    assert got.at(16).rate_factor == pytest.approx(FLEET.at(16).rate_factor)
    one = calibrate.Calibration.load(path, mode="L1", sends="mean_field")
    assert isinstance(one, calibrate.Calibration) and one.at(64) is one  # one fit: the same at every R
    # saving one size again replaces that size's entry only
    _cal(32, rate_factor=0.2).save(path)
    again = calibrate.Calibration.load(path, mode="QA", sends="relaxed")
    assert again.R == (8, 32) and again.at(32).rate_factor == 0.2 and again.at(8).rate_factor == 0.6


def test_several_files_load_as_one_calibration(tmp_path):
    """The pipeline's fit files, one per model and size, load together as the merged file does."""
    paths = []
    for c in FLEET.fits + (_cal(8, mode="L1", sends="mean_field"),):
        paths.append(tmp_path / f"fit_{c.mode}_{c.sends}_R{c.R[0]}.json")
        c.save(paths[-1])
    got = calibrate.Calibration.load(paths, mode="QA", sends="relaxed")
    assert isinstance(got, calibrate.FleetCalibration) and got.R == (8, 32)
    for R in (8, 16, 32):
        assert (got.at(R).constants, got.at(R).tau) == (FLEET.at(R).constants, FLEET.at(R).tau)
    assert calibrate.Calibration.load(paths[2:], mode="L1", sends="mean_field").R == (8,)
    with pytest.raises(ValueError, match=r"no calibration for mode='QA', sends='mean_field'"):
        calibrate.Calibration.load(paths, mode="QA", sends="mean_field")
    with pytest.raises(TypeError, match="path: expected a calibration file's path or a non-empty sequence"):
        calibrate.Calibration.load([], mode="QA", sends="relaxed")


def test_fit_fleet_recovers_constants_that_change_with_the_fleet_size(tmp_path):
    """Targets made by QAD itself with other constants at each size: each size's fit finds its own,
    and the training loss of its own fit is the one size_losses reports."""
    truth = {4: dict(rate_factor=0.8, snr_offset_db=-2.0, qa_sr_slots=4),
             8: dict(rate_factor=0.5, snr_offset_db=-6.0, qa_sr_slots=16)}
    grid = calibrate.product_grid([0.2, 0.4], [8000.0, 24000.0], [23.0])
    grids = {R: calibrate.scaled_points(grid, R, ref_R=4) for R in truth}
    kw = dict(envs=2, T=12, warmup=3, seed=0, lam=0.1)
    targets = {R: {k: v[0] for k, v in calibrate.model_kpis(
        "QA", "relaxed", calibrate.problem(grids[R], R=R, envs=2, T=12, warmup=3, seed=0).first(
            calibrate.model_envs_for(R, 8, 2)),
        dataclasses.replace(CellConfig(), **truth[R]), tau=0.05, lam=0.1).items()} for R in truth}
    search = {"rate_factor": (0.5, 0.8), "snr_offset_db": (-6.0, -2.0), "sr_slots": {"QA": (4, 16)},
              "refine_top": 1, "refine_evals": 6}
    lines = []
    fc = calibrate.fit_fleet("QA", "relaxed", sizes=(4, 8), ref_R=4, grids=grids, targets=targets,
                             model_robots=8, search=search, progress=lines.append, **kw)
    assert fc.R == (4, 8)
    for R, c in zip(fc.R, fc.fits, strict=True):
        assert c.sr_slots == truth[R]["qa_sr_slots"]
        assert c.rate_factor == pytest.approx(truth[R]["rate_factor"], rel=0.05)
        assert c.snr_offset_db == pytest.approx(truth[R]["snr_offset_db"], abs=0.5)
        assert c.train_loss < 1e-3
    assert any(line.startswith("R = 8: ") for line in lines)
    assert fc.fits[0].setup["model_envs"] == 2 and fc.fits[1].setup["model_envs"] == 1
    assert fc.fits[0].setup["continued_from_R"] is None and fc.fits[1].setup["continued_from_R"] == 4
    assert all(c.setup["wall_fit_s"] > 0 for c in fc.fits)
    forms = calibrate.fleet.size_losses(fc, ref_R=4, grids=grids, targets=targets, model_robots=8, envs=2,
                                        T=12, warmup=3, seed=0, lam=0.1)
    assert [f["R"] for f in forms] == [4, 8] and [f["between"] for f in forms] == [None, None]
    assert [f["line"] for f in forms] == [None, None]  # a line through two sizes is the two fits
    for f, c in zip(forms, fc.fits, strict=True):
        assert f["own"] == pytest.approx(c.train_loss, rel=1e-6, abs=1e-9)
    assert forms[1]["ref"] > 10 * forms[1]["own"]  # R = 4's constants do not serve R = 8
    # One size at a time, continued from its neighbour read back from a file (the pipeline's fit
    # jobs): the same constants and losses as the fleet fit.
    path = tmp_path / "fit_R4.json"
    fc.fits[0].save(path)
    prev = calibrate.Calibration.load(path, mode="QA", sends="relaxed")
    one = calibrate.fit_size("QA", "relaxed", R=8, neighbour=prev, grid=grids[8], targets=targets[8],
                             model_robots=8, search=search, **kw)
    keep = ("rate_factor", "snr_offset_db", "sr_slots", "tau", "qa_snr_req_db", "train_loss")
    assert {k: getattr(one, k) for k in keep} == {k: getattr(fc.fits[1], k) for k in keep}
    assert one.setup["continued_from_R"] == 4
    with pytest.raises(TypeError, match="neighbour: expected a Calibration or None"):
        calibrate.fit_size("QA", "relaxed", R=8, neighbour=4, grid=grids[8])


def test_fit_fleet_checks_its_per_size_arguments():
    grid = calibrate.product_grid([0.2], [8000.0], [23.0])
    with pytest.raises(ValueError, match=r"grids: expected a dict with one entry per fleet size \[4, 8\]"):
        calibrate.fit_fleet("QA", "relaxed", sizes=(4, 8), ref_R=4, grids={4: grid})
    with pytest.raises(ValueError, match="sends: expected one of"):
        calibrate.fit_fleet("QA", "binary", sizes=(4,), ref_R=4, grids={4: grid})


def test_a_constant_the_fits_share_stays_exact_between_and_along_the_line():
    """QA's grant width is compared for equality (the fused node runs at exactly 1; L1 takes only 1):
    where every fit has the same width, the interpolated and the log-linear constants have it exactly
    (a line through equal values came out 1.0000000000000002 and refused L1D's entry); different
    widths are interpolated in log R like the other constants."""
    sizes = (4, 8, 16, 32, 64)
    for mode, K in (("L1", 1.0), ("QA", 1.0), ("QA", 3.0)):
        fits = tuple(dataclasses.replace(_cal(R, mode=mode, rate_factor=0.5 - 0.01 * i,
                                              snr_offset_db=-3.0 - i, tau=0.05 + 0.01 * i),
                                         qa_min_grant_subbands=K)
                     for i, R in enumerate(sizes))
        fc = calibrate.FleetCalibration(mode, "relaxed", fits)
        for R in (5, 12, 24, 48):
            assert fc.at(R).qa_min_grant_subbands == K, (mode, K, R)
            assert calibrate.fleet._log_linear(fits, R).qa_min_grant_subbands == K, (mode, K, R)
    lo, hi = (dataclasses.replace(_cal(R), qa_min_grant_subbands=K) for R, K in ((8, 2.0), (32, 4.0)))
    between = calibrate.FleetCalibration("QA", "relaxed", (lo, hi)).at(16)
    assert between.qa_min_grant_subbands == pytest.approx(3.0)


def test_interpolated_constants_match_a_fit_only_where_they_should():
    """size_losses' ``between``: at a size with fitted neighbours, interpolated constants, scored on
    that size's own points (here the truth is log-linear in R, so interpolation is exact)."""
    fits = (_cal(4, rate_factor=0.8, snr_offset_db=0.0, sr_slots=0, tau=0.05, qa_snr_req_db=None),
            _cal(8, rate_factor=0.4, snr_offset_db=-4.0, sr_slots=8, tau=0.05, qa_snr_req_db=None),
            _cal(16, rate_factor=0.2, snr_offset_db=-8.0, sr_slots=16, tau=0.05, qa_snr_req_db=None))
    fc = calibrate.FleetCalibration("QA", "relaxed", fits)
    grid = calibrate.product_grid([0.3], [8000.0, 24000.0], [23.0])
    grids = {R: calibrate.scaled_points(grid, R, ref_R=8) for R in fc.R}
    kw = dict(envs=2, T=10, warmup=2, seed=1, lam=0.1, model_robots=8)
    targets = {R: {k: v[0] for k, v in calibrate.model_kpis(
        "QA", "relaxed", calibrate.problem(grids[R], R=R, envs=2, T=10, warmup=2, seed=1).first(
            calibrate.model_envs_for(R, 8, 2)), c.apply(CellConfig()), tau=0.05, lam=0.1).items()}
        for R, c in zip(fc.R, fits, strict=True)}
    forms = calibrate.fleet.size_losses(fc, ref_R=8, grids=grids, targets=targets, **kw)
    assert [f["between"] is None for f in forms] == [True, False, True]
    assert forms[1]["own"] < 1e-9 and forms[1]["between"] < 1e-9  # log-linear truth: interpolation exact
    assert max(f["line"] for f in forms) < 1e-9  # ... and so is the line through all three
    assert forms[0]["ref"] > 1e-3 and forms[2]["ref"] > 1e-3
    torch.testing.assert_close(torch.tensor(forms[1]["own"]), torch.tensor(forms[1]["ref"]))
