"""The discrete levels L1 and QA against hand-computed cases and invariants (docs/design.md §2)."""

import dataclasses
import math

import pytest
import torch
from problems import DEVICES, random_scenario

from isaac_net.core import CellConfig, make_engine
from isaac_net.core.diff import DiffFluid, rollout
from isaac_net.core.levels import KPI_KEYS, CudaGraphLevel

F64 = torch.float64
CFG = CellConfig()
BYTES_PER_SB_SE = CFG.subband_hz * CFG.slot_s / 8.0  # 90 bytes per subband per unit SE per slot
P_23DBM_W = 10 ** ((23 - 30) / 10)


def one(level, R=1, cfg=None, dtype=F64):
    return make_engine(level, 1, R, dtype=dtype, cfg=cfg)


def run(engine, sends, sizes, snr_db, deadline=None):
    return engine.step(torch.tensor([sends], dtype=F64), torch.tensor([sizes], dtype=F64),
                       snr_db=torch.tensor([snr_db], dtype=F64), deadline=deadline)


# ----------------------------------------------------------------------------- L1
def test_l1_single_robot_se_cap_binds():
    # 12 subbands x 5.5 b/s/Hz x 90 B = 5940 B per slot: 12 kB needs 3 slots, done in slot k = 2.
    out = run(one("L1"), [1], [12_000.0], [40.0])
    assert out["delivered"].item() == 1
    assert out["delay_sum"].item() == pytest.approx(3 / 40, rel=1e-12)
    assert out["aoi"].item() == 1
    # On air for the bytes' time at the full band's rate: 12000 / 5940 slots (the last one part used).
    assert out["energy_j"].item() == pytest.approx(P_23DBM_W * 12_000 / 5940 * CFG.slot_s, rel=1e-12)


def test_l1_two_robots_share_then_one_alone():
    # Both backlogged: 6 subbands each, 2970 B/slot. Robot 0 (4 kB) finishes in slot 1;
    # robot 1 (12 kB) has 5940 B after slot 1, then gets all 12 subbands: 11880 after slot 2,
    # 17820 after slot 3 -> done in slot 3.
    out = run(one("L1", R=2), [1, 1], [4_000.0, 12_000.0], [40.0, 40.0])
    assert out["delay_sum"][0].tolist() == pytest.approx([2 / 40, 4 / 40], rel=1e-12)
    # Energy: the bytes' time on air at the rate each has alone (5940 B per slot), the same as
    # without the other robot: sharing the band delays them, it does not make them transmit longer.
    alone = [run(one("L1"), [1], [size], [40.0])["energy_j"].item() for size in (4_000.0, 12_000.0)]
    assert out["energy_j"][0].tolist() == pytest.approx(alone, rel=1e-12)
    assert alone == pytest.approx([P_23DBM_W * b / 5940 * CFG.slot_s for b in (4_000.0, 12_000.0)], rel=1e-12)


def test_l1_power_split_over_subbands():
    # snr 10 dB over 12 subbands: se = log2(1 + 10/12) per subband, 12 * se * 90 B per slot.
    cap = 12 * math.log2(1 + 10 / 12) * BYTES_PER_SB_SE
    size = 5.5 * cap  # done in slot k = 5
    out = run(one("L1"), [1], [size], [10.0])
    assert out["delay_sum"].item() == pytest.approx(6 / 40, rel=1e-12)
    e = one("L1")
    out = run(e, [1], [41 * cap], [10.0])  # needs 41 slots: not done in the first step
    assert out["delivered"].item() == 0
    assert e.queue.bytes[0, 0, 0].item() == pytest.approx(cap, rel=1e-9)


def test_l1_energy_below_one_subband_counts_the_bytes_at_the_full_band():
    # 24 robots, 12 subbands: share 0.5, each served 0.5 x 5.5 x 90 B per slot (its one subband at
    # full power, 20 dB, capped at se_max), 9900 B in the step; on air for those bytes at the rate
    # it has alone, 12 subbands of log2(1 + 100 / 12) b/s/Hz each.
    R = 24
    e = one("L1", R=R)
    out = run(e, [1] * R, [1e9] * R, [20.0] * R)
    sent = 0.5 * 5.5 * BYTES_PER_SB_SE * CFG.num_slots
    alone_per_slot = 12 * math.log2(1 + 100 / 12) * BYTES_PER_SB_SE
    assert out["energy_j"][0, 0].item() == pytest.approx(P_23DBM_W * sent / alone_per_slot * CFG.slot_s,
                                                         rel=1e-9)


def test_l1_fifo_order():
    e = one("L1")
    big = 59.9 * 5940.0  # ~1.5 steps of service at the SE cap
    first = run(e, [1], [big], [40.0])
    second = run(e, [1], [1000.0], [40.0])
    assert first["delivered"].item() == 0 and second["delivered"].item() == 2
    # The old message finishes first, in slot 19 of step 2 (60 slots in all), the new one in slot 20.
    assert e.queue.length.item() == 0
    assert second["delay_sum"].item() == pytest.approx((1 + 20 / 40) + 21 / 40, rel=1e-12)


def test_overflow_at_buffer_limit():
    cfg = CellConfig(buffer_msgs=2)
    e = one("L1", cfg=cfg)
    outs = [run(e, [1], [1e9], [0.0]) for _ in range(3)]
    assert [o["overflow"].item() for o in outs] == [0, 0, 1]
    assert [o["queued_msgs"].item() for o in outs] == [1, 2, 2]


@pytest.mark.parametrize("level", ["L1", "QA"])
def test_timeout_exactly_at_deadline(level):
    e = one(level)
    d = torch.tensor([[3.0]], dtype=F64)
    outs = [run(e, [1 if t == 0 else 0], [1e9], [0.0], deadline=d) for t in range(4)]
    # Generated at step 0: ages 1 and 2 survive, age 3 = deadline at the end of step 2.
    assert [o["timeouts"].item() for o in outs] == [0, 0, 1, 0]


@pytest.mark.parametrize("level", ["L1", "QA"])
def test_aoi_sends_every_other_step(level):
    e = one(level)
    aoi = [run(e, [1 - t % 2], [1000.0], [30.0])["aoi"].item() for t in range(6)]
    assert aoi == [1, 2, 1, 2, 1, 2]


def test_aoi_grows_without_delivery_and_restarts_at_reset():
    e = one("L1")
    aoi = [run(e, [0], [1000.0], [30.0])["aoi"].item() for _ in range(3)]
    e.reset()
    aoi.append(run(e, [0], [1000.0], [30.0])["aoi"].item())
    assert aoi == [1, 2, 3, 1]


# ----------------------------------------------------------------------------- QA
def qa_rate(snr_db, share, n):
    snr = 10 ** (snr_db / 10)
    m = max(math.floor(snr / 10 ** 1.5), 1)
    alloc = min(share, m)
    gain = sum(1 / j for j in range(1, n + 1))
    se = min(math.log2(1 + gain * snr / max(alloc, 1)), 5.5)
    return alloc * se * CFG.subband_hz / 8


def test_qa_headroom_cap_and_sr_offset_single_robot():
    # 20 dB: floor(100 / 31.6) = 3 subbands; G = H(1) = 1; SR offset 4 slots (queue was empty).
    rate = qa_rate(20.0, 12.0, 1)
    assert rate == pytest.approx(3 * math.log2(1 + 100 / 3) * 1.44e6 / 8)
    out = run(one("QA"), [1], [12_000.0], [20.0])
    finish_s = 4 * CFG.slot_s + 12_000 / rate
    assert out["delay_sum"].item() == pytest.approx(finish_s / CFG.step_s, rel=1e-12)
    # On air for its bytes at the whole band's rate (12 subbands, the power spread over them), not
    # at its 3 subbands' rate: the energy rule of every level but L2-legacy (levels.base.on_air_s).
    band_rate = 12 * math.log2(1 + 100 / 12) * 1.44e6 / 8
    assert out["energy_j"].item() == pytest.approx(P_23DBM_W * 12_000 / band_rate, rel=1e-12)


def test_qa_harmonic_pf_gain():
    # Three backlogged robots at 0 dB: share 4, m = 1, alloc 1, G = H(3) = 11/6.
    out = run(one("QA", R=3), [1, 1, 1], [2_000.0] * 3, [0.0] * 3)
    rate = 1 * math.log2(1 + 11 / 6) * 1.44e6 / 8
    assert qa_rate(0.0, 4.0, 3) == pytest.approx(rate)
    expected = (4 * CFG.slot_s + 2_000 / rate) / CFG.step_s
    assert out["delay_sum"][0].tolist() == pytest.approx([expected] * 3, rel=1e-12)
    # The energy: its bytes at the faster of the whole band's rate and its own. Alone (G = 1) the band's
    # 12 log2(1 + 1/12) = 1.39 b/s/Hz beats its one subband's 1; with the gain of three its own
    # log2(1 + 11/6) = 1.50 is the faster: it is not on air longer than it was served.
    band_rate = 12 * math.log2(1 + 1 / 12) * 1.44e6 / 8
    alone = run(one("QA"), [1], [2_000.0], [0.0])["energy_j"].item()
    assert alone == pytest.approx(P_23DBM_W * 2_000 / band_rate, rel=1e-12)
    assert out["energy_j"][0].tolist() == pytest.approx([P_23DBM_W * 2_000 / rate] * 3, rel=1e-12)


@pytest.mark.parametrize("air", [False, True], ids=["plain-air", "crowd-air"])
@pytest.mark.parametrize("seed", range(6))
def test_time_on_air_never_exceeds_the_step(seed, air):
    """Over random cells (R = 1-64, SNR -10 to 40 dB, 1-60 kB, loads to overload), a robot's energy is
    at most its power for the whole step: in L1 its share's rate is at most the whole band's, in QA
    (whose PF gain can make its own rate the faster) the time on air is at most the time it was served;
    with a calibrated time on air (a factor to 5, a crowd exponent to 1.5) the cap holds it there."""
    g = torch.Generator().manual_seed(seed)
    cfg = CFG
    if air:
        draw = torch.rand(2, generator=torch.Generator().manual_seed(100 + seed), dtype=F64).tolist()
        cfg = dataclasses.replace(CFG, air_factor=0.5 + 4.5 * draw[0], air_crowd_exp=-0.5 + 2.0 * draw[1])
    R = int(torch.randint(1, 65, (1,), generator=g))
    E = 3
    snr_db = -10 + 50 * torch.rand(E, R, generator=g, dtype=F64)
    sizes = 1e3 + 59e3 * torch.rand(E, R, generator=g, dtype=F64)
    p = float(torch.rand((), generator=g, dtype=F64))
    tx_dbm = 10 + 13 * torch.rand(E, R, generator=g, dtype=F64)
    bound_w = 10 ** ((tx_dbm - 30) / 10) * CFG.step_s
    engines = {lv: make_engine(lv, E, R, dtype=F64, seed=seed, cfg=cfg) for lv in ("L1", "QA")}
    for _ in range(6):
        send = (torch.rand(E, R, generator=g, dtype=F64) < p).to(F64)
        for lv, e in engines.items():
            out = e.step(send, sizes, snr_db=snr_db, tx_dbm=tx_dbm)
            assert bool((out["energy_j"] >= 0).all())
            assert bool((out["energy_j"] <= bound_w * (1 + 1e-9)).all()), lv
    for mode in ("L1", "QA"):  # the fluid models at tau > 0: smin's cap is below the hard one
        k = rollout(DiffFluid(E, R, mode=mode, tau=0.1, cfg=cfg, dtype=F64), 6, torch.full((E, R), p), sizes,
                    snr_db=snr_db, tx_dbm=tx_dbm)
        assert bool((k["energy_j"] >= 0).all()) and bool((k["energy_j"] <= bound_w * (1 + 1e-9)).all()), mode


def test_qa_sr_offset_only_when_queue_was_empty():
    e = one("QA")
    rate = qa_rate(0.0, 12.0, 1)  # alloc 1 at 0 dB
    size = rate * CFG.step_s * 1.5  # takes 1.5 steps
    first = run(e, [1], [size], [0.0])
    assert first["delivered"].item() == 0
    second = run(e, [1], [100.0], [0.0])  # queue not empty: no SR offset this step
    served_first_step = rate * (CFG.step_s - 4 * CFG.slot_s)
    finish_old = (size - served_first_step) / rate
    finish_new = finish_old + 100.0 / rate
    assert second["delivered"].item() == 2
    expected = (1 + finish_old / CFG.step_s) + finish_new / CFG.step_s
    assert second["delay_sum"].item() == pytest.approx(expected, rel=1e-12)


# ----------------------------------------------------------------------------- invariants
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("level", ["L1", "QA"])
def test_conservation_under_random_load(level, dtype, device):
    for seed in range(3):
        s = random_scenario(seed).to(dtype, device)
        e = make_engine(level, s.E, s.R, device, cfg=s.cfg, dtype=dtype)
        totals = {k: 0 for k in KPI_KEYS}
        for t in range(s.T):
            out = e.step((s.u[t] < s.p).to(dtype), s.B, snr_db=s.snr_db, deadline=s.deadline)
            for k in ("offered", "delivered", "timeouts", "overflow"):
                totals[k] = totals[k] + out[k]
            residual = totals["offered"] - totals["delivered"] - totals["timeouts"] - totals["overflow"]
            assert torch.equal(residual, out["queued_msgs"])
            assert out["queued_msgs"].max() <= s.cfg.buffer_msgs


@pytest.mark.parametrize("level", ["L1", "QA"])
def test_reset_leaves_other_envs_bit_identical(level):
    s = random_scenario(7)
    E = 4
    g = torch.Generator().manual_seed(0)
    p = torch.rand(E, 5, generator=g, dtype=F64)
    B = 2000 + 30000 * torch.rand(E, 5, generator=g, dtype=F64)
    snr = 5 + 20 * torch.rand(E, 5, generator=g, dtype=F64)
    u = torch.rand(20, E, 5, generator=g, dtype=F64)
    a, b = make_engine(level, E, 5, dtype=F64, cfg=s.cfg), make_engine(level, E, 5, dtype=F64, cfg=s.cfg)
    for t in range(20):
        if t == 10:
            b.reset([1, 3])
        oa = a.step((u[t] < p).double(), B, snr_db=snr)
        ob = b.step((u[t] < p).double(), B, snr_db=snr)
        for k in KPI_KEYS:
            assert torch.equal(oa[k][[0, 2]], ob[k][[0, 2]]), k


def test_positions_give_the_radio_snr():
    pos = torch.tensor([[[100.0, 0.0]]], dtype=F64)
    e1, e2 = one("L1"), one("L1")
    snr = 23 - (22.4 + 35.3 * 2 + 21.3 * math.log10(3.5)) - (-174 + 10 * math.log10(1.44e6) + 9)
    o1 = e1.step(torch.ones(1, 1), 30000.0, pos=pos, tx_dbm=23.0)
    o2 = e2.step(torch.ones(1, 1), 30000.0, snr_db=snr)
    assert o1["delay_sum"].item() == pytest.approx(o2["delay_sum"].item(), rel=1e-12)


# ----------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(send=torch.full((2, 3), 0.5)), "send"),
        (dict(send=torch.ones(3, 2)), r"send: expected shape \[2, 3\]"),
        (dict(msg_bytes=-1.0), "msg_bytes"),
        (dict(snr_db=float("nan")), "snr_db: expected finite"),
        (dict(snr_db=None), "exactly one"),
        (dict(pos=torch.zeros(2, 3, 2)), "exactly one"),
        (dict(deadline=11), "deadline"),
        (dict(deadline=2.5), "deadline"),
        (dict(deadline=0), "deadline"),
    ],
)
def test_bad_inputs_name_the_argument(kwargs, match):
    e = make_engine("L1", 2, 3)
    args = dict(send=torch.ones(2, 3), msg_bytes=1000.0, snr_db=10.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        e.step(args.pop("send"), args.pop("msg_bytes"), **args)


def test_unknown_level_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown level 'L3'; expected one of: L1, QA, L2-legacy"):
        make_engine("L3", 1, 1)


def test_bad_config_and_dims():
    with pytest.raises(ValueError, match="num_slots"):
        CellConfig(num_slots=0)
    with pytest.raises(ValueError, match="buffer_msgs"):
        CellConfig(buffer_msgs=0)
    assert CellConfig(num_slots=4).qa_sr_slots == 4  # the whole step: an empty robot waits it out
    with pytest.raises(ValueError, match=r"qa_sr_slots must be an integer in \[0, num_slots\]"):
        CellConfig(num_slots=4, qa_sr_slots=5)
    with pytest.raises(ValueError, match="E: expected an integer >= 1"):
        make_engine("L1", 0, 2)
    with pytest.raises(TypeError, match="dtype"):
        make_engine("QA", 1, 2, dtype=torch.int32)


@pytest.mark.cuda
def test_cuda_matches_cpu():
    s = random_scenario(3)
    outs = {}
    for dev in ("cpu", "cuda"):
        e = make_engine("L1", s.E, s.R, dev, cfg=s.cfg, dtype=F64)
        sd = s.to(F64, dev)
        tot = 0
        for t in range(s.T):
            tot = tot + e.step((sd.u[t] < sd.p).double(), sd.B, snr_db=sd.snr_db)["delivered"]
        outs[dev] = tot.cpu()
    assert torch.equal(outs["cpu"], outs["cuda"])


def test_backend_choices():
    with pytest.raises(ValueError, match="unknown backend 'jit'; expected one of: eager, numba, "
                                         "cuda_graph"):
        make_engine("L1", 1, 1, backend="jit")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        make_engine("L1", 1, 1, backend="cuda_graph")


def _totals_on(level, s, dev, dtype=torch.float32, *, engine=None, reset_at=None):
    """Rollout totals of one level on ``dev`` (float32: the CUDA path of the issue).

    ``reset_at``: restart env 0 before that step (the others keep their state)."""
    e = make_engine(level, s.E, s.R, dev, cfg=s.cfg, dtype=dtype, seed=0) if engine is None else engine
    sd = s.to(dtype, dev)
    tot = {}
    for t in range(s.T):
        if t == reset_at:
            e.reset([0])
        k = e.step((sd.u[t] < sd.p).to(dtype), sd.B, snr_db=sd.snr_db, deadline=sd.deadline)
        for key in ("offered", "delivered", "timeouts", "overflow", "delay_sum", "energy_j"):
            tot[key] = tot.get(key, 0) + k[key]
    tot["queued_msgs"] = k["queued_msgs"]
    return {key: v.cpu() for key, v in tot.items()}


@pytest.mark.cuda
@pytest.mark.parametrize("level", ["L1", "QA", "L2-legacy"])
def test_every_level_runs_on_cuda_in_float32(level, device="cuda"):
    s = random_scenario(5)
    cpu, gpu = _totals_on(level, s, "cpu"), _totals_on(level, s, device)
    # Sends come from the same uniforms: every message is counted once on both devices.
    torch.testing.assert_close(gpu["offered"], cpu["offered"], rtol=0, atol=0)
    done = gpu["delivered"] + gpu["timeouts"] + gpu["overflow"] + gpu["queued_msgs"]
    torch.testing.assert_close(done, gpu["offered"], rtol=0, atol=1e-4)
    assert all(torch.isfinite(v).all() for v in gpu.values())
    if level != "L2-legacy":  # L2-legacy draws fading and BLER from the device's own generator
        for key in cpu:
            torch.testing.assert_close(gpu[key], cpu[key], rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("seed", [5, 11])
def test_l2_legacy_on_cuda_gives_the_cpu_events_from_the_same_draws(seed, device="cuda"):
    """L2-legacy's eager step on CUDA against the CPU's, float64, from the CPU level's start and each
    step's random numbers drawn on the CPU and passed to both (the devices' generators differ): the
    same events, the same counters, delay sums and energy to 1e-9."""
    s = random_scenario(seed)
    nets = {dev: _eager("L2-legacy", s) if dev == "cpu" else make_engine(
        "L2-legacy", s.E, s.R, dev, cfg=s.cfg, dtype=F64, seed=0, backend="eager") for dev in ("cpu", device)}
    # The start too (the fading ring is drawn when the level is built).
    nets[device].load_device_state({k: v.to(device) for k, v in nets["cpu"].device_state().items()})
    tot = {dev: {} for dev in nets}
    for t in range(s.T):
        draws = nets["cpu"].draw()
        for dev, net in nets.items():
            sd = s.to(F64, dev)
            inputs = net.checked_inputs((sd.u[t] < sd.p).to(F64), sd.B, snr_db=sd.snr_db,
                                        deadline=sd.deadline)
            with torch.no_grad():
                k = net._step(*inputs, draws=tuple(x.to(dev) for x in draws))
            for key, v in k.items():
                tot[dev][key] = tot[dev].get(key, 0) + v.cpu()
    for key in tot["cpu"]:
        torch.testing.assert_close(tot[device][key], tot["cpu"][key], rtol=1e-9, atol=1e-9)
    for key, x in nets["cpu"].counters.items():
        assert torch.equal(nets[device].counters[key].cpu(), x), key
    assert float(tot["cpu"]["delivered"].sum()) > 0


# ----------------------------------------------------------------------------- cuda_graph
class Replayer:
    """Stand-in for ``graphed.CudaGraphs`` on the CPU: "replay" runs the recorded step again and
    writes into the outputs of the capture, as a replayed graph writes into its static outputs."""

    @staticmethod
    def warm_up(fn, n):
        for _ in range(n):
            fn()

    @staticmethod
    def capture(fn):
        out = fn()

        def replay():
            for key, value in fn().items():
                out[key].copy_(value)

        return replay, out


def _eager(level, s, dtype=F64, **kwargs):
    return make_engine(level, s.E, s.R, cfg=s.cfg, dtype=dtype, seed=0, backend="eager", **kwargs)


@pytest.mark.parametrize("level", ["L1", "QA", "L2-legacy"])
def test_graphed_step_keeps_its_state_in_static_buffers(level):
    """The capture/replay logic of backend "cuda_graph" (static inputs, state copied back over
    what the step read, warm-up undone, reset written in place, the draws passed in), on the CPU:
    equal to eager."""
    s = random_scenario(6)
    eager = _totals_on(level, s, "cpu", F64, engine=_eager(level, s), reset_at=7)
    net = CudaGraphLevel(_eager(level, s), graphs=Replayer)
    graphed = _totals_on(level, s, "cpu", F64, engine=net, reset_at=7)
    for key in eager:
        torch.testing.assert_close(graphed[key], eager[key], rtol=0, atol=0)
    assert net.t == s.T and float(eager["delivered"].sum()) > 0
    assert net.num_graphs == len({net.graph_phase(t) for t in range(s.T)})
    # The KPIs handed out are copies: the next replay does not overwrite them.
    sd = s.to(F64, "cpu")
    k1 = net.step(torch.ones(s.E, s.R, dtype=F64), sd.B, snr_db=sd.snr_db)
    before = {key: v.clone() for key, v in k1.items()}
    net.step(torch.zeros(s.E, s.R, dtype=F64), sd.B, snr_db=sd.snr_db)
    assert all(torch.equal(k1[key], before[key]) for key in k1)


@pytest.mark.parametrize(("level", "seed"), [("L1", 7), ("QA", 7), ("L2-legacy", 7), ("L2-legacy", 8)])
def test_capturable_step_has_no_host_sync_and_no_python_counter(level, seed):
    """What capture needs, checked without a GPU: the step runs on fake tensors (any
    ``.item()``, ``bool(tensor)`` or ``nonzero`` would raise), and its arithmetic reads the
    Python step counter only through its phase (moving it by whole periods changes nothing;
    L1 and QA have one phase, any value)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    s = random_scenario(seed)
    net = _eager(level, s)
    assert net.capturable
    net.prepare_capture()
    sd = s.to(F64, "cpu")
    inputs = net.checked_inputs(torch.ones(s.E, s.R, dtype=F64), sd.B, snr_db=sd.snr_db, deadline=sd.deadline)
    draws = net.draw()
    _eager(level, s).step(*inputs[:3], tx_dbm=inputs[3])  # lazy tables made for real, as a capture's warm-up
    with FakeTensorMode(allow_non_fake_inputs=True):
        net._step(*inputs, draws=draws)
    reference = _totals_on(level, s, "cpu", F64, engine=_eager(level, s))
    scrambled = _eager(level, s)
    scrambled.prepare_capture()
    scrambled.step = _scrambling_step(scrambled)
    out = _totals_on(level, s, "cpu", F64, engine=scrambled)
    for key in reference:
        torch.testing.assert_close(out[key], reference[key], rtol=0, atol=0)


def _phase_period(net) -> int:
    """The steps after which ``graph_phase`` repeats."""
    return next(n for n in range(1, 10**4)
                if all(net.graph_phase(t + n) == net.graph_phase(t) for t in range(64)))


def _scrambling_step(net):
    step, period = net.step, _phase_period(net)

    def scrambled(*args, **kwargs):
        net.t = net.t + (10**5 + 7 * net.t) * period  # any whole number of periods
        return step(*args, **kwargs)

    return scrambled


def test_l2_legacy_phases():
    """One graph per phase of the slot t K modulo the rings' common period: 21 at the defaults
    (lcm(8, 4, 21, 10, 40) = 840 slots, 40 a step); one per step where K shares no factor with it."""
    net = make_engine("L2-legacy", 1, 2, seed=0, backend="eager")
    assert _phase_period(net) == net.graph_period_steps == 21
    assert len({net.graph_phase(t) for t in range(100)}) == 21
    odd = make_engine("L2-legacy", 1, 2, cfg=CellConfig(num_slots=11), backend="eager")
    assert _phase_period(odd) == odd.graph_period_steps == 840
    assert make_engine("L1", 1, 2).graph_period_steps == 1


def test_l2_legacy_numba_is_not_capturable():
    net = make_engine("L2-legacy", 1, 2, seed=0)
    assert net.slot_loop == "numba" and not net.capturable
    with pytest.raises(NotImplementedError, match="'L2-legacy' level runs its slot loop 'numba' on the CPU"):
        CudaGraphLevel(net, graphs=Replayer)
    assert make_engine("L2-legacy", 1, 2, seed=0, backend="eager").capturable


def test_l2_legacy_graphed_replays_each_phase_and_keeps_the_generator():
    """Over 3 periods of its 21 phases (a reset in between), the graphed L2-legacy (stand-in replay,
    float32) gives the eager step's events and ends with the generator where the eager one is."""
    s = random_scenario(9)
    s = dataclasses.replace(s, cfg=CellConfig(num_subbands=6, timeout_steps=4), T=63,
                            deadline=s.deadline.clamp(max=4),
                            u=torch.rand(63, s.E, s.R, generator=torch.Generator().manual_seed(3)))
    eager = _eager("L2-legacy", s, torch.float32)
    net = CudaGraphLevel(_eager("L2-legacy", s, torch.float32), graphs=Replayer)
    ref = _totals_on("L2-legacy", s, "cpu", engine=eager, reset_at=30)
    out = _totals_on("L2-legacy", s, "cpu", engine=net, reset_at=30)
    for key in ref:
        torch.testing.assert_close(out[key], ref[key], rtol=0, atol=0)
    assert net.num_graphs == 21 and float(ref["delivered"].sum()) > 0
    assert torch.equal(net.generator.get_state(), eager.generator.get_state())
    for key, x in eager.counters.items():
        assert torch.equal(net.counters[key], x), key


@pytest.mark.cuda
@pytest.mark.parametrize("level", ["L1", "QA", "L2-legacy"])
def test_cuda_graph_backend_equals_eager_on_cuda(level, device="cuda"):
    s = random_scenario(5)
    eager = _totals_on(level, s, device, reset_at=7)
    net = make_engine(level, s.E, s.R, device, cfg=s.cfg, dtype=torch.float32, seed=0, backend="cuda_graph")
    graphed = _totals_on(level, s, device, engine=net, reset_at=7)
    for key in eager:  # the same kernels replayed: the same floats
        torch.testing.assert_close(graphed[key], eager[key], rtol=0, atol=0)


# ----------------------------------------------------------------------------- QA, re-shared time
def test_qa_power_spread_over_at_least_the_grant_width():
    # Eight robots at 0 dB, requirement -10 dB (headroom 10 subbands), no SR offset: share 12 / 8 = 1.5
    # subbands each, PF gain H(8). QA's rule spreads a robot's power over its 1.5 subbands; with a
    # grant of at least K = 4 subbands over 4: se = log2(1 + H(8) / max(1.5, K)), rate 1.5 se x 180 kB/s.
    gain = sum(1.0 / k for k in range(1, 9))
    for K, spread in ((1.0, 1.5), (4.0, 4.0)):
        cfg = dataclasses.replace(CFG, qa_sr_slots=0, qa_snr_req_db=-10.0, qa_min_grant_subbands=K)
        rate = 1.5 * math.log2(1.0 + gain / spread) * CFG.subband_hz / 8.0
        out = run(one("QA", R=8, cfg=cfg), [1] * 8, [1000.0] * 8, [0.0] * 8)
        assert out["delivered"][0].tolist() == [1.0] * 8
        assert out["delay_sum"][0].tolist() == pytest.approx([1000.0 / rate / CFG.step_s] * 8, rel=1e-12), K
    with pytest.raises(ValueError, match=r"qa_min_grant_subbands must lie in \[1, num_subbands=12\]"):
        dataclasses.replace(CFG, qa_min_grant_subbands=13.0)
    with pytest.raises(ValueError, match="CellConfig.qa_min_grant_subbands must be a finite number"):
        dataclasses.replace(CFG, qa_min_grant_subbands=math.nan)


def test_qa_reshared_time_of_a_drained_robot_goes_to_the_others():
    # Three robots at 20 dB, no SR offset: alloc 3 each (headroom), se 5.5, 2.97 MB/s at n = 3 served.
    # They need 6.73, 20.2 and 50.5 ms at that rate. With all of a drained robot's time re-shared
    # (qa_reshare 1) robot 0 is done at 6.73 ms, robot 1 at (6.73 + 2 x 20.2) / 3 = 15.7 ms, and robot 2
    # reaches the level where 20.2 + 6.73 + l = 60 ms (3 x the step). With half of it re-shared
    # (0.5) the time of level l is 0.5 sum_j min(V_j, l) / 3 + 0.5 l: robot 0 done at 6.73 ms, robot 1
    # at 0.5 (6.73 + 2 x 20.2) / 3 + 0.5 x 20.2 = 17.9 ms; robot 2 reaches 0.5 (26.9 + l) / 3 + 0.5 l = 20.
    rate = 3 * 5.5 * 1.44e6 / 8
    bytes_ = [20_000.0, 60_000.0, 150_000.0]
    V = [b / rate for b in bytes_]
    T = CFG.step_s
    half = (T - 0.5 * (V[0] + V[1]) / 3) / (0.5 / 3 + 0.5)
    for a, t1, level in ((1.0, (V[0] + 2 * V[1]) / 3, 3 * T - V[0] - V[1]),
                         (0.5, 0.5 * (V[0] + 2 * V[1]) / 3 + 0.5 * V[1], half)):
        e = one("QA", R=3, cfg=dataclasses.replace(CFG, qa_sr_slots=0, qa_reshare=a))
        out = run(e, [1, 1, 1], bytes_, [20.0] * 3)
        assert out["delivered"][0].tolist() == [1.0, 1.0, 0.0]
        assert out["delay_sum"][0, :2].tolist() == pytest.approx([V[0] / T, t1 / T], rel=1e-12), a
        assert e.queue.bytes[0, 2, 0].item() == pytest.approx(150_000.0 - rate * level, rel=1e-12), a


def _qa_events(total, cum, valid, rate, late, sr_s, step_s, reshare):
    """The QA interval event by event, one cell of plain floats (the reference of the closed form):
    each robot being served at ``rate * n / (reshare n_served + (1 - reshare) n)``, a late robot from
    ``sr_s`` on. Returns per robot the bytes served and per message the finish time (None: not done)."""
    R = len(total)
    n = sum(1 for j in range(R) if total[j] > 0)
    served = [0.0] * R
    finish = [[None] * len(cum[j]) for j in range(R)]
    t = 0.0
    while t < step_s:
        active = [j for j in range(R) if total[j] - served[j] > 0 and (not late[j] or t >= sr_s)]
        events = [step_s - t]
        if any(late[j] and total[j] > 0 and t < sr_s for j in range(R)):
            events.append(sr_s - t)
        speed = n / (reshare * len(active) + (1.0 - reshare) * n) if active else 0.0
        events += [(total[j] - served[j]) / (rate[j] * speed) for j in active]
        dt = min(events)
        for j in active:
            new = served[j] + rate[j] * speed * dt
            for k, c in enumerate(cum[j]):
                if valid[j][k] and finish[j][k] is None and served[j] < c <= new * (1 + 1e-12):
                    finish[j][k] = t + (c - served[j]) / (rate[j] * speed)
            served[j] = total[j] if new >= total[j] * (1 - 1e-12) else new
        t += dt
    return served, finish


@pytest.mark.parametrize("seed", range(6))
def test_qa_reshared_interval_closed_form_against_events(seed):
    """QA's re-shared interval (``qa._level_of``: the levels where ``a sum_j min(V_j, l) + (1 - a) n l``
    reaches the SR time and the step) against the interval run event by event, on random queues: 1-9
    robots, 0-3 messages each, an SR offset from none to the whole step, some robots late, ``a`` in
    (0, 1]."""
    from isaac_net.core.levels.base import Queue, StepContext

    g = torch.Generator().manual_seed(seed)
    for _ in range(25):
        R = int(torch.randint(1, 10, (1,), generator=g))
        sr_slots = int(torch.randint(0, CFG.num_slots + 1, (1,), generator=g))
        a = float(torch.rand(1, generator=g)) * 0.99 + 0.01 if seed % 3 else 1.0
        cfg = dataclasses.replace(CFG, qa_sr_slots=sr_slots, qa_reshare=a)
        e = one("QA", R=R, cfg=cfg)
        F = cfg.buffer_msgs
        length = torch.randint(0, 4, (1, R), generator=g)
        sizes = (1e3 + 4e4 * torch.rand(1, R, F, generator=g, dtype=F64))
        valid = torch.arange(F) < length.unsqueeze(-1)
        q = Queue(bytes=torch.where(valid, sizes, 0.0), size=torch.where(valid, sizes, 0.0),
                  gen=torch.zeros(1, R, F, dtype=F64), length=length)
        was_empty = torch.rand(1, R, generator=g) < 0.5
        snr_db = -5 + 35 * torch.rand(1, R, generator=g, dtype=F64)
        ctx = StepContext(t=1, snr_db=snr_db, tx_dbm=torch.full((1, R), 23.0, dtype=F64),
                          was_empty=was_empty, captured=length > 0, msg_bytes=sizes[..., 0])
        s = e._serve(q, ctx)
        total = q.bytes.sum(-1)[0].tolist()
        n = sum(1 for b in total if b > 0)
        rate = [qa_rate(float(x), CFG.num_subbands / max(n, 1), n) if total[j] > 0 else 1.0
                for j, x in enumerate(snr_db[0])]
        late = (was_empty & (length > 0))[0].tolist()
        cum = q.bytes.cumsum(-1)[0].tolist()
        served, finish = _qa_events(total, cum, valid[0].tolist(), rate, late,
                                    min(cfg.qa_sr_slots * cfg.slot_s, cfg.step_s), cfg.step_s, a)
        for j in range(R):
            for k in range(F):
                if not valid[0, j, k]:
                    continue
                assert bool(s.done[0, j, k]) == (finish[j][k] is not None), (seed, j, k)
                if finish[j][k] is not None:
                    assert s.finish_s[0, j, k].item() == pytest.approx(finish[j][k], rel=1e-9, abs=1e-15)
                else:  # what is left of the message being served, or all of one not reached
                    left = max(min(cum[j][k] - served[j], q.bytes[0, j, k].item()), 0.0)
                    assert s.remaining[0, j, k].item() == pytest.approx(left, rel=1e-9, abs=1e-6)


def test_qa_reshared_interval_tends_to_the_static_share():
    # A re-shared share of 1e-9 against none: the closed form's path against the static one, over
    # random scenarios (the delays, deliveries and energies of every step to 1e-6).
    for seed in range(4):
        s = random_scenario(seed)
        outs = []
        for a in (0.0, 1e-9):
            e = make_engine("QA", s.E, s.R, cfg=dataclasses.replace(s.cfg, qa_reshare=a), dtype=F64)
            outs.append([e.step((s.u[t] < s.p).to(F64), s.B, snr_db=s.snr_db, deadline=s.deadline)
                         for t in range(s.T)])
        for static, tiny in zip(*outs, strict=True):
            for k in KPI_KEYS:
                torch.testing.assert_close(tiny[k], static[k], rtol=1e-6, atol=1e-9)
        assert sum(o["delivered"].sum() for o in outs[0]) > 0
