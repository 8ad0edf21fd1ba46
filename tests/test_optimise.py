"""The optimisation library (isaac_net.optimise): the fleet, the cost, the budgets and the
black-box drivers, on problems with known answers (a separable quadratic per cell stands in for the
packet level where the driver, not the level, is under test)."""

import math
import sys
from pathlib import Path

import pytest
import torch

from isaac_net import optimise as opt
from isaac_net.core.diff.reference import discrete_rollout
from isaac_net.optimise import methods

REPO = Path(__file__).resolve().parents[1]
COST = opt.DEFAULT_COST


class QuadScorer:
    """A scorer whose cost is ``|x - target_e|^2`` on the unit cube, per cell: separable by cell."""

    def __init__(self, decisions, seed=0):
        self.decisions, E, R = decisions, decisions.fleet.E, decisions.fleet.R
        self.target = torch.rand(E, 2 * R, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        self.rollouts = self.heldout_rollouts = 0

    def cost_of(self, x):  # [n E, d] -> [n, E]
        x = torch.as_tensor(x, dtype=torch.float64)
        return ((x.reshape(-1, *self.target.shape) - self.target) ** 2).sum(-1)

    def train(self, dec):
        c = self.cost_of(self.decisions.to_unit(dec))
        self.rollouts += c.numel()
        return c

    def heldout(self, dec):
        return self.cost_of(self.decisions.to_unit(dec))[0]


def small(E=3, R=4, T=12, seed=0, **kw):
    fleet = opt.make_fleet(E, R, T, seed=seed, **kw)
    return fleet, opt.FleetDecisions(fleet)


def test_fleet_classes_sizes_and_distances_follow_their_ranges():
    fleet, _ = small(E=5, R=8)
    assert [sl.stop - sl.start for sl in fleet.class_slices] == [4, 2, 2]
    dist = fleet.pos.norm(dim=-1)
    for cls, sl in zip(fleet.classes, fleet.class_slices, strict=True):
        sizes = fleet.B[:, sl]
        assert cls.size_bytes[0] <= float(sizes.min()) <= float(sizes.max()) <= cls.size_bytes[1]
        assert cls.distance_m[0] - 1e-3 <= float(dist[:, sl].min()) <= float(dist[:, sl].max()) \
            <= cls.distance_m[1] + 1e-3
    assert opt.fleet.class_counts([0.5, 0.25, 0.25], 7) == [3, 2, 2]  # largest remainders


def test_fleet_is_deterministic_per_seed():
    a, b, c = (opt.make_fleet(2, 4, 6, seed=s) for s in (3, 3, 4))
    for key in ("B", "pos", "u_train", "u_test"):
        assert torch.equal(getattr(a, key), getattr(b, key))
        assert not torch.equal(getattr(a, key), getattr(c, key))
    assert not torch.equal(a.u_train, a.u_test)


def test_one_class_recovers_the_plain_cost_and_uniform_policies():
    one = (opt.RobotClass("all", 1.0, (8e3, 8e3), (40.0, 140.0), weight=1.0, delivery_min=0.95),)
    fleet, dec = small(E=2, R=3, classes=one)
    d = dec.uniform([(0.4, 17.0)])
    res = discrete_rollout("L1", 8, d["p"], d["B"], pos=d["pos"], tx_dbm=d["tx_dbm"], warmup=2,
                           u=fleet.u_train[:8], dtype=torch.float32)
    plain = opt.env_cost(opt.env_kpis(res), {**COST, "delivery_min": 0.95})
    assert torch.equal(opt.fleet_cost(res, fleet, COST), plain)
    # a per-robot decision that is the same for every robot is the uniform policy (p on the log scale)
    x = torch.tensor([[math.log(0.4 / 0.02) / math.log(0.98 / 0.02)] * 3 + [17.0 / 23.0] * 3] * 2,
                     dtype=torch.float64)
    for key, v in dec.from_unit(x).items():
        torch.testing.assert_close(v, d[key])


def test_class_weights_and_floors_enter_the_cost():
    fleet, dec = small(E=2, R=4)
    d = dec.uniform([(0.5, 20.0)])
    res = discrete_rollout("L1", 8, d["p"], d["B"], pos=d["pos"], tx_dbm=d["tx_dbm"], warmup=2,
                           u=fleet.u_train[:8], dtype=torch.float32)
    expected = sum(c.weight * opt.env_cost(opt.env_kpis({k: v[:, sl] for k, v in res.items()
                                                             if isinstance(v, torch.Tensor) and v.ndim == 2}),
                                           {**COST, "delivery_min": c.delivery_min})
                   for c, sl in zip(fleet.classes, fleet.class_slices, strict=True))
    torch.testing.assert_close(opt.fleet_cost(res, fleet, COST), expected)


@pytest.mark.parametrize("p_scale", ["log", "linear"])
def test_unit_cube_round_trip(p_scale):
    fleet = opt.make_fleet(2, 4, 12, seed=0)
    dec = opt.FleetDecisions(fleet, p_scale=p_scale)
    x = torch.rand(6, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[0], x[1] = 0.0, 1.0  # the cube's faces
    d = dec.from_unit(x)
    assert d["p"].shape == (6, 4) and d["pos"].shape == (6, 4, 2)
    assert float(d["p"].min()) == pytest.approx(0.02) and float(d["p"].max()) == pytest.approx(0.98)
    assert float(d["tx_dbm"].min()) == 0.0 and float(d["tx_dbm"].max()) == 23.0
    torch.testing.assert_close(dec.to_unit(d), x, atol=1e-6, rtol=0)
    # the start (the gradient's path is the same on both scales) and back
    x0 = dec.to_unit(dec(dec.init()))
    torch.testing.assert_close(dec.from_unit(x0)["p"], torch.full((2, 4), 0.5), atol=1e-6, rtol=0)


def test_unit_cube_maps_p_on_the_log_scale_and_the_power_linearly():
    fleet = opt.make_fleet(1, 4, 12, seed=0)
    log, lin = (opt.FleetDecisions(fleet, p_scale=s) for s in ("log", "linear"))
    assert log.p_scale == "log" and opt.FleetDecisions(fleet).p_scale == "log"  # the default
    mid = torch.full((1, 8), 0.5, dtype=torch.float64)
    # the cube's midpoint: the geometric mean of the bounds on the log scale, the arithmetic on the linear
    torch.testing.assert_close(log.from_unit(mid)["p"], torch.full((1, 4), math.sqrt(0.02 * 0.98)),
                               atol=1e-6, rtol=0)
    assert math.sqrt(0.02 * 0.98) == pytest.approx(0.14)
    torch.testing.assert_close(lin.from_unit(mid)["p"], torch.full((1, 4), 0.5), atol=1e-6, rtol=0)
    for d in (log, lin):  # the power is linear in dBm on both
        torch.testing.assert_close(d.from_unit(mid)["tx_dbm"], torch.full((1, 4), 11.5), atol=1e-6, rtol=0)
    # equal steps in the cube: equal ratios of p (49 ** (1 / 3) a third), equal differences on the linear
    steps = torch.tensor([[0.0, 1 / 3, 2 / 3, 1.0] + [0.5] * 4], dtype=torch.float64)
    p = log.from_unit(steps)["p"][0].double()
    torch.testing.assert_close(p, torch.tensor([0.02, 0.02 * 49 ** (1 / 3), 0.02 * 49 ** (2 / 3), 0.98],
                                               dtype=torch.float64), atol=0, rtol=1e-5)
    torch.testing.assert_close(p[1:] / p[:-1], torch.full((3,), 49.0 ** (1 / 3), dtype=torch.float64),
                               atol=0, rtol=1e-5)
    q = lin.from_unit(steps)["p"][0].double()
    torch.testing.assert_close(q[1:] - q[:-1], torch.full((3,), 0.32, dtype=torch.float64), atol=1e-6, rtol=0)
    # the start of a 64-robot cell (p = 1 / 16): inside the cube on the log scale, at its face on the linear
    start = {"p": torch.full((1, 4), 0.0625), "tx_dbm": torch.full((1, 4), 20.0)}
    assert float(log.to_unit(start)[0, 0]) == pytest.approx(math.log(0.0625 / 0.02) / math.log(49.0))  # 0.293
    assert float(lin.to_unit(start)[0, 0]) == pytest.approx((0.0625 - 0.02) / 0.96)  # 0.044
    # p = 0 is a bound of the linear scale alone
    assert opt.FleetDecisions(fleet, p_bounds=(0.0, 0.9), p_scale="linear").from_unit(mid)["p"][0, 0] == 0.45


def test_cmaes_gives_each_cell_its_column():
    import cma

    fleet, dec = small(E=3, R=3)
    sc = QuadScorer(dec)
    gens, pop = 6, 4 + int(3 * math.log(6))  # pycma's default population in 6 dimensions
    res = opt.cmaes(dec, sc, opt.Budget(rollouts=gens * pop * 3), seed=5, objective=sc.cost_of, score_every=0)
    assert res.info["generations"] == gens and res.info["popsize"] == pop and res.rollouts == gens * pop * 3
    x0 = dec.to_unit(dec(dec.init()))
    for e in range(3):  # the same cell alone, its own optimiser and objective
        es = cma.CMAEvolutionStrategy(x0[e].tolist(), 0.25, methods._cma_options(5, e))
        for _ in range(gens):
            xs = es.ask()
            es.tell(xs, [float(((torch.tensor(x) - sc.target[e]) ** 2).sum()) for x in xs])
        torch.testing.assert_close(dec.to_unit(res.decisions)[e], torch.tensor(es.result.xfavorite),
                                   atol=1e-6, rtol=0)
    assert float(res.heldout_cost.mean()) < res.trace[0]["heldout_cost"]  # it improved on the start


def test_cmaes_is_deterministic_per_seed():
    fleet, dec = small(E=2, R=3)
    runs = [opt.cmaes(dec, QuadScorer(dec), opt.Budget(rollouts=120), seed=s, score_every=0)
            for s in (1, 1, 2)]
    assert torch.equal(runs[0].decisions["p"], runs[1].decisions["p"])
    assert not torch.equal(runs[0].decisions["p"], runs[2].decisions["p"])


def test_random_search_respects_and_counts_its_budget():
    fleet, dec = small(E=2, R=3)
    sc = QuadScorer(dec)
    res = opt.random_search(dec, sc, opt.Budget(rollouts=50), per_round=4)
    # the start scored (2 cells), then 6 rounds of 8 candidates; a 7th overruns
    assert res.info["candidates"] == 24 and res.rollouts == 50 == sc.rollouts
    assert [r["rollouts"] for r in res.trace] == [0, 10, 18, 26, 34, 42, 50, 50]
    best = [r["heldout_cost"] for r in res.trace]
    assert best == sorted(best, reverse=True)  # its pick, the best on the training sends, never gets worse


def test_random_search_keeps_the_start_unless_a_candidate_beats_it():
    fleet, dec = small(E=2, R=3)
    sc = QuadScorer(dec)
    x0 = dec.to_unit(dec(dec.init()))
    sc.target = x0.clone()  # the start is the optimum: no candidate can beat it
    res = opt.random_search(dec, sc, opt.Budget(rollouts=40), per_round=4)
    torch.testing.assert_close(dec.to_unit(res.decisions), x0, atol=1e-6, rtol=0)
    assert res.trace[-1]["heldout_cost"] == pytest.approx(0.0, abs=1e-9)


def test_trace_rows_carry_the_cells_and_solution_at_slices_a_budget():
    fleet, dec = small(E=2, R=3)
    res = opt.random_search(dec, QuadScorer(dec), opt.Budget(rollouts=50), per_round=4)
    for r in res.trace:
        assert len(r["heldout_cells"]) == 2
        assert r["heldout_cost"] == pytest.approx(sum(r["heldout_cells"]) / 2)
    at = opt.solution_at(res.trace, rollouts=20)  # rows at 0, 8 and 16 rollouts
    assert at is res.trace[2]
    trace = [{"wall_s": w, "rollouts": r, "heldout_cost": c} for w, r, c in
             ((0.0, 0, 3.0), (1.0, 4, 1.0), (2.0, 8, 2.0), (5.0, 9, 0.5))]
    assert opt.solution_at(trace, wall_s=0.5)["wall_s"] == 0.0
    # the solution the method stands at, not the one of lowest held-out cost (that would select on it)
    assert opt.solution_at(trace, wall_s=4.0)["wall_s"] == 2.0
    assert opt.solution_at(trace, wall_s=4.0, rollouts=2)["wall_s"] == 0.0
    assert opt.solution_at(trace)["wall_s"] == 5.0
    assert opt.solution_at(trace, wall_s=-1.0) is None


def test_tpe_counts_rounds_and_starts_at_the_start():
    fleet, dec = small(E=2, R=3)
    sc = QuadScorer(dec)
    res = opt.tpe(dec, sc, opt.Budget(rollouts=13), score_every=0)
    assert res.info["rounds"] == 6 and res.rollouts == 12
    start = float(sc.heldout(dec(dec.init())).mean())
    assert res.trace[0]["heldout_cost"] == pytest.approx(start)
    assert float(res.heldout_cost.mean()) <= start + 1e-9  # the start is a trial, the best is kept


def test_hybrid_starts_at_the_gradient_solution_and_is_charged_for_it():
    fleet, dec = small(E=2, R=3)
    sc = QuadScorer(dec)
    x = torch.full((2, 6), 0.3, dtype=torch.float64)
    start = methods.Result("gradient, test", dec.from_unit(x), sc.heldout(dec.from_unit(x)), wall_s=2.5,
                           rollouts=0, trace=[])
    res = opt.hybrid(dec, sc, opt.Budget(wall_s=1e6, rollouts=5 * 2 * 8), start, score_every=0)
    first = res.trace[0]
    assert first["heldout_cost"] == pytest.approx(float(start.heldout_cost.mean()))
    assert first["wall_s"] >= 2.5 and first["rollouts"] == 0 and res.wall_s >= 2.5
    assert res.info["start"] == "gradient, test" and res.info["sigma0"] == 0.05


def test_hybrid_imports_cma_before_its_clock_starts(monkeypatch):
    """Importing pycma (about a second, more on a loaded box) is not charged to the hybrid, as
    :func:`cmaes` starts its own clock after the import: the module is there when its Run starts."""
    fleet, dec = small(E=2, R=3)
    sc = QuadScorer(dec)
    x = torch.full((2, 6), 0.3, dtype=torch.float64)
    start = methods.Result("gradient, test", dec.from_unit(x), sc.heldout(dec.from_unit(x)), wall_s=2.5,
                           rollouts=0, trace=[])
    seen = []

    class Watched(methods.Run):
        def __init__(self, *args, **kwargs):
            seen.append("cma" in sys.modules)
            super().__init__(*args, **kwargs)

    monkeypatch.delitem(sys.modules, "cma", raising=False)
    monkeypatch.setattr(methods, "Run", Watched)
    res = opt.hybrid(dec, sc, opt.Budget(rollouts=2 * 8), start, score_every=0)
    assert seen == [True]
    # the start's time is charged up front: the trace's first row is the start, at its 2.5 s
    assert 2.5 <= res.trace[0]["wall_s"] < 2.5 + 1.0 and res.trace[0]["rollouts"] == 0


def test_gradient_stops_on_its_wall_budget_and_uses_no_level_rollouts():
    fleet, dec = small(E=2, R=3)
    scorer = opt.Scorer(fleet, COST, T=8, warmup=2, level="L1")
    res = opt.gradient(dec, scorer, opt.Budget(wall_s=1e-9), iters=50, T=6, warmup=1)
    assert res.info["iters"] == 0 and res.rollouts == 0  # spent before the first iteration
    res = opt.gradient(dec, scorer, opt.Budget(wall_s=60.0), iters=3, T=6, warmup=1, score_every=1)
    assert res.info["iters"] == 3 and res.rollouts == 0 and scorer.rollouts == 0
    assert len(res.trace) == 1 + 3 + 1  # the start, each iteration, the solution
    assert res.decisions["p"].shape == (2, 3) and not res.decisions["p"].requires_grad


def test_proxy_cost_is_the_fleet_cost_of_the_expected_totals():
    """Through a proxy, one class of weight 1: the cost is env_cost of the proxy KPIs reduced as the
    engine's are (totals over totals), i.e. the opt_rates proxy cost, bit for bit."""
    from isaac_net.core import CellConfig, kpi, radio
    from isaac_net.optimise.gradient import proxy_cost

    one = opt.RobotClass("all", 1.0, (2e3, 3e4), (20.0, 150.0), delivery_min=0.9)
    fleet = opt.make_fleet(2, 4, 6, seed=3, classes=(one,))
    dec = opt.FleetDecisions(fleet)(opt.FleetDecisions(fleet).init())

    class Fixed:  # a stand-in proxy: known per-robot KPIs
        def predict(self, p, msg_bytes, snr_db):
            return {"delay": 1.0 + p, "delivery": torch.sigmoid(snr_db / 10), "aoi": 2.0 + msg_bytes / 1e4,
                    "energy_j": 0.01 * p}

    cfg = CellConfig()
    cost = {**COST, "delivery_min": 0.9}
    got = proxy_cost(lambda tot: opt.fleet_cost(tot, fleet, COST, kpi.PROXY_KPIS), Fixed(), cfg)(dec, 0.1)
    k = Fixed().predict(dec["p"], dec["B"], radio.snr_db(dec["pos"], dec["tx_dbm"], cfg))
    totals = kpi.expected_totals(dec["p"], k, kpi.PROXY_KPIS)
    want = opt.env_cost(kpi.batch_kpis(totals, dim=-1, kpis=kpi.PROXY_KPIS), cost)
    assert torch.equal(got, want)


def test_fit_proxy_spans_the_fleet_and_the_gradient_runs_through_it():
    fleet, dec = small(E=2, R=4)
    from isaac_net.core import CellConfig

    rg = opt.proxy_ranges(dec, CellConfig(), load_max=3.0)
    assert rg["p"] == (0.02, 0.75)  # load_max / R
    assert rg["msg_bytes"] == (float(fleet.B.min()), float(fleet.B.max()))
    assert rg["snr_db"][0] < rg["snr_db"][1]
    proxy, info = opt.fit_proxy(dec, level="L1", robots=40, T=8, warmup=2, load_max=3.0, hidden=(8,),
                                epochs=5, batch_size=16)
    assert info["cells"] == 10 and info["test_cells"] == 2 and info["rollouts"] == 10
    assert proxy.fitted_on["R"] == 4 and set(info["heldout"]) == {"delay", "delivery", "aoi", "energy_j"}
    scorer = opt.Scorer(fleet, COST, T=8, warmup=2, level="L1")
    res = opt.gradient(dec, scorer, opt.Budget(wall_s=60.0), proxy=proxy, iters=3, score_every=1)
    assert res.name == "gradient, neural proxy" and res.info["iters"] == 3 and res.rollouts == 0
    assert not torch.equal(res.decisions["p"], dec(dec.init())["p"])  # it moved


PROXY_FIT = {"robots": 40, "T": 8, "warmup": 2, "load_max": 3.0, "hidden": (8,), "epochs": 5,
             "batch_size": 16, "lr": 0.01}


def tiny_proxy_problem():
    """Decisions, a scorer and a budget of a small fleet: proxy_gradient's arguments (fit aside)."""
    fleet, dec = small()
    return dec, opt.Scorer(fleet, COST, T=8, warmup=2), opt.Budget(rollouts=1)


def test_proxy_gradient_fits_on_the_scorers_level_and_optimise_fleet_runs_the_same():
    """The fit runs on the scorer's level (its rollouts and wall time in info["fit"], not the result's),
    its lr apart from Adam's; optimise_fleet's "proxy" is this function with the same seed, bit for bit."""
    fleet, dec = small(E=2, R=4)
    torch.manual_seed(3)
    scorer = opt.Scorer(fleet, COST, T=8, warmup=2, level="L1", seed=3)
    res = opt.proxy_gradient(dec, scorer, opt.Budget(wall_s=60.0), seed=3, iters=3, lr=0.05, score_every=1,
                             fit=PROXY_FIT)
    fit = res.info["fit"]
    assert res.name == "gradient, neural proxy" and res.info["iters"] == 3 and res.rollouts == 0
    assert fit["rollouts"] == fit["cells"] == 10 and fit["wall_s"] > 0 and fit["wall_s"] >= fit["wall_fit_s"]
    assert set(fit) >= {"test_cells", "wall_collect_s", "ranges", "heldout"}
    assert fit["ranges"]["p"][1] == 0.75 and scorer.rollouts == 0  # load_max / R; the fit's not the scorer's
    adam = {"iters": 3, "lr": 0.05, "score_every": 1, "T": 6}  # T: not the proxy's
    via = opt.optimise_fleet(fleet, methods=("proxy",), budget=opt.Budget(wall_s=60.0), T_eval=8,
                             warmup_eval=2, gradient_kwargs=adam, proxy_kwargs=PROXY_FIT,
                             level_kwargs={"level": "L1"}, seed=3)
    got = via["gradient, neural proxy"]
    assert torch.equal(got.heldout_cost, res.heldout_cost)
    assert torch.equal(got.decisions["p"], res.decisions["p"])
    assert {k: v for k, v in got.info["fit"].items() if not k.startswith("wall")} == {
        k: v for k, v in fit.items() if not k.startswith("wall")}
    other = opt.proxy_gradient(dec, scorer, opt.Budget(wall_s=60.0), seed=3, iters=3, lr=0.05, score_every=1,
                               fit={**PROXY_FIT, "lr": 0.02})
    assert not torch.equal(other.decisions["p"], res.decisions["p"])  # the fit's lr reached the fit


def test_uniform_policy_is_the_best_of_its_grid():
    fleet, dec = small(E=2, R=3)
    scorer = opt.Scorer(fleet, COST, T=8, warmup=2, level="L1")
    grid = {"p": [0.1, 0.9], "tx_dbm": [5.0, 23.0]}
    res = opt.uniform_policy(dec, scorer, grid=grid, chunk_policies=3)
    costs = {(p, t): float(scorer.train(dec.uniform([(p, t)])).mean())
             for p in grid["p"] for t in grid["tx_dbm"]}
    assert (res.info["p"], res.info["tx_dbm"]) == min(costs, key=costs.get)
    assert res.rollouts == 4 * 2 and res.info["policies"] == 4


@pytest.mark.parametrize("call, match", [
    (lambda: opt.make_fleet(0, 4, 6), "E: expected a positive int"),
    (lambda: opt.make_fleet(2, 2, 6), "R: 2 robots leave a class empty"),
    (lambda: opt.RobotClass("x", 1.0, (1e3, 2e3), (10.0, 5.0)), r"x.distance_m: expected 0 < lo <= hi"),
    (lambda: opt.RobotClass("x", 1.0, (1e3, 2e3), (1.0, 5.0), delivery_min=1.5), "x.delivery_min"),
    (lambda: opt.FleetDecisions(small()[0], p_bounds=(0.5, 0.2)), "p_bounds"),
    (lambda: opt.FleetDecisions(small()[0], tx_init_dbm=30.0), "tx_init_dbm"),
    (lambda: opt.FleetDecisions(small()[0], p_scale="sqrt"), "p_scale: expected one of 'log', 'linear'"),
    (lambda: opt.FleetDecisions(small()[0], p_bounds=(0.0, 0.9)), "p_bounds: expected lo > 0 with p_scale"),
    (lambda: opt.Budget(), "budget: expected wall_s or rollouts"),
    (lambda: opt.Budget(rollouts=0), "rollouts: expected a positive int"),
    (lambda: opt.Budget(wall_s=-1.0), "wall_s"),
    (lambda: opt.Scorer(small()[0], COST, T=99, warmup=2), "T: expected warmup < T"),
    (lambda: opt.optimise_fleet(small()[0], methods=("sgd",), budget=opt.Budget(rollouts=1)),
     "methods: unknown"),
    (lambda: opt.cmaes(small()[1], None, opt.Budget(rollouts=1), sigma0=2.0), "sigma0"),
    (lambda: small()[1].from_unit(torch.zeros(3, 5)), r"x: expected \[n \* 3, 8\]"),
    (lambda: opt.proxy_ranges(small()[1], None, load_max=0.0), "load_max: expected"),
    (lambda: opt.proxy_ranges(small()[1], None, load_max=0.01), "load_max: 0.01 / R"),
    (lambda: opt.fit_proxy(small()[1], test_share=1.0), "test_share: expected"),
    (lambda: opt.proxy_gradient(*tiny_proxy_problem(), fit={"seed": 1}), r"fit: unknown settings \['seed'\]"),
    (lambda: opt.proxy_gradient(*tiny_proxy_problem(), fit={"iters": 3}), r"unknown settings \['iters'\]"),
    (lambda: opt.summarise({}, "uniform policy"), "baseline"),
])
def test_bad_inputs_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("call, match", [
    (lambda: opt.make_fleet(2, 4, 6, classes=["telemetry"]), "classes: expected"),
    (lambda: opt.FleetDecisions("fleet"), "fleet: expected a Fleet"),
    (lambda: opt.RobotClass("x", 1.0, 5.0, (1.0, 2.0)), "x.size_bytes: expected a pair"),
    (lambda: opt.optimise_fleet(small()[0], budget=10.0), "budget: expected a Budget"),
    (lambda: opt.proxy_gradient(small()[1], None, opt.Budget(rollouts=1)), "scorer: expected a Scorer"),
    (lambda: opt.proxy_gradient(*tiny_proxy_problem()[:2], 10.0), "budget: expected a Budget"),
    (lambda: opt.proxy_gradient(*tiny_proxy_problem(), fit=[("robots", 40)]), "fit: expected a dict"),
])
def test_bad_types_name_the_argument(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_example_runs_on_a_tiny_fleet(capsys):
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import optimise_fleet
    finally:
        sys.path.remove(str(REPO / "examples"))
    rows = optimise_fleet.main(cells=2, robots=4, steps=12, wall_s=1.0, iters=2, n_boot=50)
    assert [r["method"] for r in rows] == ["uniform policy", "gradient, QAD relaxed, calibrated",
                                           "gradient, neural proxy", "CMA-ES"]
    assert all(math.isfinite(r["cost"]) for r in rows) and rows[0]["diff"] == 0.0
    assert rows[1]["rollouts"] == 0 and rows[2]["rollouts"] == 0 and rows[3]["rollouts"] > 0
    out = capsys.readouterr().out
    assert "held-out cost on L2-legacy" in out and "the proxy's own fit: 256 cell-rollouts" in out
