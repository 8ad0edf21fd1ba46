"""L2-legacy: each mechanism alone, then the whole level (docs/design.md §2 "L2-legacy").

Runs are small (a few hundred slots at most) so the file stays well under a minute on one core.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from isaac_net.core import CellConfig, L2LegacyConfig, make_engine
from isaac_net.core.levels import l2_mechanisms as mech
from isaac_net.core.levels.l2_legacy import NetL2Legacy

L2 = L2LegacyConfig()
CFG = CellConfig()
K = CFG.num_slots
SE = torch.tensor(mech.NR_MCS_SE, dtype=torch.float64)
THR = mech.mcs_thresholds_db(SE, L2.bler_gap_db)
SEL = mech.selection_bounds_db(THR)

# Tolerances and bands, next to the problems they belong to.
OLLA_BLER_TOL = 0.02  # long-run first-transmission BLER within target ± 2 points
MIN_TX_FOR_BLER = 20_000
LOW_LOAD_MIN_DELIVERY = 0.99
# Low-load sanity band for the mean delay, in slots above L1's: at least 0 (L2 adds latency),
# at most an SR period + two grant delays (SR grant, then the BSR's grant) + one HARQ RTT + 2
# slots of TB quantisation.
LOW_LOAD_MAX_EXCESS_SLOTS = L2.sr_period_slots + 2 * L2.k2_slots + L2.harq_rtt_slots + 2


def rollout(eng, T, send, msg_bytes, snr_db, tx_dbm=None):
    """Run ``T`` steps; ``send`` is ``[T, E, R]``. Returns the per-step KPI dicts."""
    outs = []
    for t in range(T):
        outs.append(eng.step(send[t], msg_bytes, snr_db=snr_db, tx_dbm=tx_dbm))
    return outs


def bernoulli_sends(T, E, R, p, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(T, E, R, generator=g) < p).float()


# ---------------------------------------------------------------- mechanisms alone
def test_mcs_table_is_nr_64qam():
    assert len(mech.NR_MCS_SE) == 29
    assert mech.NR_MCS_SE[0] == 0.2344 and mech.NR_MCS_SE[-1] == 5.5547


def test_bler_curve_is_ten_percent_at_threshold_and_monotone():
    mcs = torch.arange(29)
    at_thr = mech.bler(THR, mcs, THR, L2.bler_slope_db)
    torch.testing.assert_close(at_thr, torch.full((29,), 0.1, dtype=torch.float64))
    sinr = torch.linspace(-10, 30, 81, dtype=torch.float64)
    b = mech.bler(sinr, torch.full_like(sinr, 10, dtype=torch.long), THR, L2.bler_slope_db)
    assert bool((b[1:] <= b[:-1]).all())
    # 90 % -> 10 % over 2 ln 9 * slope dB.
    lo = mech.bler(THR[10] - 2 * math.log(9) * L2.bler_slope_db, torch.tensor(10), THR, L2.bler_slope_db)
    assert float(lo) == pytest.approx(0.9, abs=1e-9)


def test_select_mcs_picks_the_highest_mcs_under_the_estimate():
    est = torch.tensor([-30.0, float(THR[5]) + 1e-6, float(THR[5]) - 1e-3, 40.0], dtype=torch.float64)
    mcs = mech.select_mcs(est, torch.zeros(4, dtype=torch.float64), SEL)
    assert mcs.tolist() == [0, 5, 4, 28]
    # A positive OLLA offset is more careful.
    assert int(mech.select_mcs(torch.tensor(float(THR[20]) + 1e-6, dtype=torch.float64),
                               torch.tensor(3.0, dtype=torch.float64), SEL)) < 20
    # MCS 17 has a lower SE than MCS 16: the selection never picks 16.
    fine = torch.linspace(-10, 30, 4001, dtype=torch.float64)
    assert 16 not in mech.select_mcs(fine, torch.zeros_like(fine), SEL).unique().tolist()


def test_olla_update_steps_and_clamps():
    off = torch.tensor([0.0, 0.0, 9.5, -9.99, 3.0])
    tx = torch.tensor([True, True, True, True, False])
    nack = torch.tensor([True, False, True, False, True])
    new = mech.olla_update(off, tx, nack, 1.0, L2.olla_down_db, 10.0)
    torch.testing.assert_close(new, torch.tensor([1.0, -1.0 / 9.0, 10.0, -10.0, 3.0]))


def test_olla_drives_bler_to_target_with_the_pure_functions():
    """Links at a fixed mean SNR with Rayleigh fading and a 3 dB optimistic, stale estimate."""
    g = torch.Generator().manual_seed(0)
    N, iters, warm = 1000, 80, 40
    snr_db = torch.linspace(6.0, 18.0, N, dtype=torch.float64)
    off = torch.zeros(N, dtype=torch.float64)
    tx = nacks = 0
    for i in range(iters):
        true = snr_db + 10 * torch.log10(-torch.log1p(-torch.rand(N, generator=g, dtype=torch.float64)))
        est = true + 3.0 + torch.randn(N, generator=g, dtype=torch.float64)
        mcs = mech.select_mcs(est, off, SEL)
        nack = torch.rand(N, generator=g, dtype=torch.float64) < mech.bler(true, mcs, THR, L2.bler_slope_db)
        off = mech.olla_update(off, torch.ones(N, dtype=torch.bool), nack, 1.0, L2.olla_down_db, 10.0)
        if i >= warm:
            tx += N
            nacks += int(nack.sum())
    assert tx >= MIN_TX_FOR_BLER
    assert nacks / tx == pytest.approx(L2.olla_target_bler, abs=OLLA_BLER_TOL)


def test_effective_sinr_is_exact_when_flat_and_between_min_and_mean():
    flat = torch.full((3, 12), 7.0, dtype=torch.float64)
    alloc = torch.zeros(3, 12, dtype=torch.bool)
    alloc[0, :4] = True
    alloc[1, :] = True
    eff = mech.effective_sinr_lin(flat, alloc)
    torch.testing.assert_close(eff[:2], torch.full((2,), 7.0, dtype=torch.float64))
    assert float(eff[2]) == 0.0
    g = torch.Generator().manual_seed(1)
    x = torch.rand(50, 12, generator=g, dtype=torch.float64) * 100
    a = torch.rand(50, 12, generator=g) < 0.5
    a[:, 0] = True
    e = mech.effective_sinr_lin(x, a)
    xmin = torch.where(a, x, torch.inf).amin(-1)
    xmean = (x * a).sum(-1) / a.sum(-1)
    assert bool((e >= xmin - 1e-9).all()) and bool((e <= xmean + 1e-9).all())


def _random_pf_problem(seed, E=200, R=6, S=12):
    g = torch.Generator().manual_seed(seed)
    metric = torch.rand(E, R, S, generator=g)
    need = torch.randint(0, 6, (E, R), generator=g)
    is_free = torch.rand(E, S, generator=g) < 0.8
    return metric, need, is_free


@pytest.mark.parametrize("seed", [0, 1])
def test_pf_gives_each_subband_to_at_most_one_robot_with_known_data(seed):
    metric, need, is_free = _random_pf_problem(seed)
    S = metric.shape[-1]
    alloc = mech.pf_allocate(metric, need, is_free, num_rounds=S)
    assert bool((alloc.sum(1) <= 1).all())  # exclusive
    assert not bool(alloc[need == 0].any())  # nothing for a robot with no known data
    assert not bool((alloc & ~is_free.unsqueeze(1)).any())  # reserved subbands stay reserved
    assert bool((alloc.sum(-1) <= need).all())  # never more than it needs
    # Work-conserving: where demand covers the free subbands, every free subband is used.
    busy = need.sum(-1) >= is_free.sum(-1)
    assert bool((alloc.any(1) == is_free)[busy].all())
    # Fewer rounds never break the invariants.
    a1 = mech.pf_allocate(metric, need, is_free, num_rounds=1)
    assert bool((a1.sum(1) <= 1).all()) and not bool(a1[need == 0].any())
    # Stopping once nothing is left to settle changes nothing; a cached order neither.
    order = torch.argsort(metric, -1, descending=True)
    assert torch.equal(mech.pf_allocate(metric, need, is_free, S, order, stop_early=True), alloc)


def _pf_by_hand(metric, need, is_free, num_rounds, order):
    """PF subband by subband as the docstring says it, with Python loops over one env: each round
    every open subband goes to the robot with the highest metric among those that still need
    subbands (the first on a tie); a robot keeps its best offered ones (in ``order``) up to its
    need; a declined subband reopens, one nobody wanted stays closed."""
    R, S = metric.shape
    alloc = [[False] * S for _ in range(R)]
    need_left = [int(n) for n in need]
    is_open = [bool(f) for f in is_free]
    for _ in range(num_rounds):
        offered = [[False] * S for _ in range(R)]
        has = [False] * S
        for s in range(S):
            cands = [r for r in range(R) if need_left[r] > 0 and is_open[s]]
            if cands:
                best = max(float(metric[r, s]) for r in cands)
                offered[next(r for r in cands if float(metric[r, s]) == best)][s] = True
                has[s] = True
        kept = [[False] * S for _ in range(R)]
        for r in range(R):
            took = 0
            for s in (int(j) for j in order[r]):
                if offered[r][s] and took < need_left[r]:
                    kept[r][s] = alloc[r][s] = True
                    took += 1
            need_left[r] -= took
        is_open = [has[s] and not any(kept[r][s] for r in range(R)) for s in range(S)]
    return torch.tensor(alloc)


@pytest.mark.parametrize("S", [6, 17])  # 17 subbands: past the keep table, the gather path
def test_pf_matches_the_allocation_by_hand_with_ties(S):
    """The vectorised allocation (envs last, keep table or its gather fallback, tie test only on the
    host) gives the allocation written out with loops, on metrics with many ties."""
    g = torch.Generator().manual_seed(S)
    E, R = 40, 4
    metric = torch.randint(0, 3, (E, R, S), generator=g).double()  # three levels: ties everywhere
    need = torch.randint(0, S + 2, (E, R), generator=g)
    is_free = torch.rand(E, S, generator=g) < 0.8
    order = torch.argsort(metric, dim=-1, descending=True, stable=True)
    for rounds in (1, 3):
        want = torch.stack([_pf_by_hand(metric[e], need[e], is_free[e], rounds, order[e]) for e in range(E)])
        for stop_early in (False, True):
            got = mech.pf_allocate(metric, need, is_free, rounds, order, stop_early=stop_early)
            assert torch.equal(got, want), (rounds, stop_early)


def test_pf_takes_the_best_metric_per_subband_when_everyone_wants_everything():
    metric, _, _ = _random_pf_problem(3)
    E, R, S = metric.shape
    alloc = mech.pf_allocate(metric, torch.full((E, R), S), torch.ones(E, S, dtype=torch.bool), 1)
    torch.testing.assert_close(alloc.float().argmax(1), metric.argmax(1))
    assert bool(alloc.any(1).all())


def test_pf_is_proportionally_fair_against_round_robin():
    """Full buffers, asymmetric mean SNRs, i.i.d. Rayleigh subbands: PF keeps the subband
    shares near equal (like round robin) while every robot gets at least its round-robin
    throughput (multi-user diversity), so the sum of log throughputs is higher."""
    g = torch.Generator().manual_seed(2)
    E, R, S, slots, beta = 300, 4, 12, 300, L2.pf_beta
    snr = torch.tensor([0.0, 5.0, 10.0, 20.0], dtype=torch.float64).view(1, R, 1)
    avg = torch.ones(E, R, dtype=torch.float64)
    thr_pf = torch.zeros(E, R, dtype=torch.float64)
    thr_rr = torch.zeros(E, R, dtype=torch.float64)
    share = torch.zeros(E, R, dtype=torch.float64)
    need = torch.full((E, R), S)
    free = torch.ones(E, S, dtype=torch.bool)
    robots = torch.arange(R).view(1, R, 1)
    for n in range(slots):
        gain = -torch.log1p(-torch.rand(E, R, S, generator=g, dtype=torch.float64))
        se = torch.log2(1 + 10 ** (snr / 10) * gain)
        alloc = mech.pf_allocate(se / avg.unsqueeze(-1), need, free, 3)
        rate = (se * alloc).sum(-1)
        avg = beta * avg + (1 - beta) * rate
        thr_pf += rate
        share += alloc.sum(-1)
        rr = robots == ((torch.arange(S).view(1, 1, S) + n) % R)
        thr_rr += (se * rr).sum(-1)
    share = share.sum(0) / (E * slots * S)
    assert torch.allclose(share, torch.full((R,), 1.0 / R, dtype=torch.float64), atol=0.05), share
    pf, rr = thr_pf.sum(0), thr_rr.sum(0)
    assert bool((pf >= rr).all()), (pf, rr)
    assert float(torch.log(pf).sum()) > float(torch.log(rr).sum())


def test_subbands_needed_respects_buffer_and_headroom():
    sinr1 = torch.tensor([[1e6, 1e6, 1.0, 1e6]], dtype=torch.float64)
    known = torch.tensor([[0.0, 1200.0, 5000.0, 1e9]], dtype=torch.float64)
    bytes_per = CFG.subband_hz * CFG.slot_s / 8
    min_lin = 10 ** (float(THR[0]) / 10)
    cap, max_sb = mech.capacity_by_subbands(sinr1, bytes_per, 5.5547, 10 ** 0.2, min_lin, 12)
    need = mech.subbands_needed(known, cap, max_sb)
    per_sb = 5.5547 * bytes_per
    assert need[0, 0] == 0  # nothing known: never scheduled
    assert need[0, 1] == math.ceil(1200.0 / per_sb)
    assert need[0, 2] == int(max_sb[0, 2]) and 1 <= int(max_sb[0, 2]) < 12  # power-limited
    assert need[0, 3] == 12


# ---------------------------------------------------------------- the level, mechanism by mechanism
def _traced(E, R, T, p, msg, snr_db, seed=0, l2_cfg=None, cfg=None):
    eng = make_engine("L2-legacy", E, R, "cpu", seed=seed, l2_cfg=l2_cfg, cfg=cfg)
    eng.trace = []
    outs = rollout(eng, T, bernoulli_sends(T, E, R, p, seed + 100), msg, snr_db)
    return eng, outs


def test_olla_drives_the_level_bler_to_target():
    """One robot per env, full buffer, fixed SNR: first-transmission BLER over >= 20 000 TBs."""
    E, T, warm = 64, 14, 4
    snr = torch.linspace(14.0, 26.0, E).view(E, 1)
    eng = make_engine("L2-legacy", E, 1, "cpu", seed=5)
    send = torch.ones(E, 1)
    for t in range(T):
        if t == warm:
            tx0 = eng.counters["tx_first"].sum().item()
            nack0 = eng.counters["nack_first"].sum().item()
        eng.step(send, 200_000.0, snr_db=snr)
    tx = eng.counters["tx_first"].sum().item() - tx0
    nack = eng.counters["nack_first"].sum().item() - nack0
    assert tx >= MIN_TX_FOR_BLER
    assert nack / tx == pytest.approx(L2.olla_target_bler, abs=OLLA_BLER_TOL)


def test_harq_retransmits_exactly_the_failed_tbs_after_the_rtt():
    E, R, T = 16, 4, 6
    eng, _ = _traced(E, R, T, 0.6, 20_000.0, torch.linspace(8.0, 25.0, E * R).view(E, R))
    tr, rtt, max_tx = eng.trace, L2.harq_rtt_slots, L2.harq_max_tx
    retx_seen = fail_seen = 0
    for i, d in enumerate(tr):
        is_tx = d["is_new"] | d["is_retx"]
        assert not bool((d["is_new"] & d["is_retx"]).any())  # one TB per robot per slot
        assert bool((d["ntx"][is_tx] <= max_tx).all())
        # A failure is a NACK at the last transmission, and only then.
        torch.testing.assert_close(d["fail"], d["nack"] & (d["ntx"] == max_tx))
        if i + rtt < len(tr):
            later = tr[i + rtt]
            wait = d["nack"] & ~d["fail"]
            # Exactly the NACKed TBs (not the ACKed, not the failed) come back after the RTT ...
            torch.testing.assert_close(later["is_retx"], wait)
            # ... the same TB: same bytes, subbands and MCS, one more transmission. (Per-message
            # tensors are indexed by age, which moves by one at a step boundary.)
            c_then = d["content"] if later["s"] // K == d["s"] // K else d["content"].roll(-1, -1)
            torch.testing.assert_close(later["content"][wait], c_then[wait])
            torch.testing.assert_close(later["sb"][wait], d["sb"][wait])
            torch.testing.assert_close(later["mcs"][wait], d["mcs"][wait])
            torch.testing.assert_close(later["ntx"][wait], d["ntx"][wait] + 1)
            retx_seen += int(wait.sum())
        fail_seen += int(d["fail"].sum())
    assert retx_seen > 50
    assert eng.counters["harq_fail"].sum().item() == fail_seen


def test_level_draws_nack_as_u_below_the_bler_curve():
    """The level tests the BLER draw in logit form; it is the same event as ``u < bler``."""
    eng, _ = _traced(8, 4, 3, 0.7, 20_000.0, torch.linspace(5.0, 25.0, 32).view(8, 4))
    n = agree = 0
    for d in eng.trace:
        tx = d["is_new"] | d["is_retx"]
        n += int(tx.sum())
        agree += int((d["nack"] == (d["u"] < d["bler"]))[tx].sum())
    assert n > 1000 and agree >= n - 1  # float rounding may flip a draw sitting on the curve


def test_rlc_requeues_what_harq_lost():
    """With a single HARQ transmission every NACK is a HARQ failure; RLC resends the bytes
    after rlc_delay_slots, so the messages still arrive."""
    l2 = dataclasses.replace(L2, harq_max_tx=1)
    E, R, T = 16, 4, 10
    eng, outs = _traced(E, R, T, 0.2, 6000.0, 14.0, l2_cfg=l2)
    tr = eng.trace
    assert eng.counters["harq_fail"].sum() > 20
    assert eng.counters["rlc_retx"].sum() > 0
    checked = 0
    for i, d in enumerate(tr):
        if not bool(d["requeue"].any()) or d["k"] + l2.rlc_delay_slots >= K:
            continue  # follow the bytes within one step (ages shift between steps)
        held_then = d["held"]
        e, r, j = (int(v) for v in d["requeue"].nonzero()[0])
        c = float(d["content"][e, r, j])
        for w in tr[i:i + l2.rlc_delay_slots]:  # held for the whole delay ...
            assert float(w["held"][e, r, j]) >= c - 1e-6
        back = tr[i + l2.rlc_delay_slots]  # ... then back in the buffer (less any newer holds)
        newer = sum(float(w["content"][e, r, j]) for w in tr[i + 1:i + l2.rlc_delay_slots + 1]
                    if bool(w["requeue"][e, r, j]))
        assert float(back["held"][e, r, j]) <= float(held_then[e, r, j]) - c + newer + 1e-6
        checked += 1
        if checked >= 5:
            break
    assert checked >= 1
    tot = {k: sum(o[k].sum().item() for o in outs) for k in ("offered", "delivered", "timeouts")}
    assert tot["timeouts"] == eng.counters["rlc_lost"].sum().item()  # the only losses at this deadline
    assert tot["delivered"] >= 0.95 * (tot["offered"] - outs[-1]["queued_msgs"].sum().item())


def test_rlc_gives_up_after_max_retx_and_counts_a_timeout():
    l2 = dataclasses.replace(L2, harq_max_tx=1, rlc_max_retx=0)
    E, R, T = 16, 4, 6
    eng, outs = _traced(E, R, T, 0.2, 6000.0, 14.0, l2_cfg=l2)
    timeouts = sum(o["timeouts"] for o in outs)
    assert eng.counters["rlc_lost"].sum() > 0
    torch.testing.assert_close(timeouts, eng.counters["rlc_lost"])


def test_empty_robot_is_never_scheduled():
    E, R, T = 8, 4, 4
    eng = make_engine("L2-legacy", E, R, "cpu", seed=1)
    eng.trace = []
    send = bernoulli_sends(T, E, R, 0.7, 9)
    send[:, :, 2] = 0  # robot 2 never has data
    outs = rollout(eng, T, send, 20_000.0, 18.0)
    for d in eng.trace:
        assert not bool(d["alloc"][:, 2].any())
        assert not bool((d["is_new"] | d["is_retx"])[:, 2].any())
        assert bool((d["alloc"].sum(1) <= 1).all())
    assert all(float(o["energy_j"][:, 2].sum()) == 0.0 for o in outs)


def test_sr_bsr_delay_of_an_isolated_message():
    """At low load and very high SNR (no BLER, top MCS), robot r's message sent at step 2r:

        delay = w_SR + k2 + 1                  slots, if it fits the first (SR) grant,
        delay = w_SR + k2 + 1 + k2            slots, if the rest fits the grant after the BSR,

    where w_SR = (r - 2 r K) mod sr_period is the wait for the robot's SR occasion (offset r)
    and the trailing 1 is the transmission slot itself.
    """
    E, R, T = 2, 8, 16
    per_sb = math.floor(mech.NR_MCS_SE[-1] * CFG.subband_hz * CFG.slot_s / 8)
    for msg, extra in ((100.0, 0), (3000.0, L2.k2_slots)):
        assert (msg <= per_sb) == (extra == 0) and msg - per_sb < 12 * per_sb
        eng = make_engine("L2-legacy", E, R, "cpu", seed=2)
        send = torch.zeros(T, E, R)
        for r in range(R):
            send[2 * r, :, r] = 1
        for t in range(T):
            out = eng.step(send[t], msg, snr_db=60.0)
            if t % 2 == 0 and t // 2 < R:
                r = t // 2
                w = (r - t * K) % L2.sr_period_slots
                expect = (w + L2.k2_slots + 1 + extra) / K
                assert out["delivered"][:, r].tolist() == [1.0] * E
                torch.testing.assert_close(out["delay_sum"][:, r], torch.full((E,), expect))
        assert eng.counters["sr"].sum().item() == E * R


def test_a_byte_is_acked_once_and_never_both_delivered_and_queued():
    """Bytes of ACKed TBs = bytes of the delivered messages + the served part of the queued ones."""
    E, R, T, size = 8, 3, 12, 9000.0
    eng, outs = _traced(E, R, T, 0.5, size, 15.0, seed=4)
    assert sum(o["timeouts"].sum().item() for o in outs) == 0
    acked = torch.zeros(E, R)
    for d in eng.trace:
        assert bool((d["unsched"] >= 0).all()) and bool((d["held"] >= 0).all())
        ack = (d["is_new"] | d["is_retx"]) & ~d["nack"]
        acked += (d["content"] * ack.unsqueeze(-1)).sum(-1)
    delivered = sum(o["delivered"] for o in outs)
    q = eng.queue
    served_queued = ((size - q.bytes) * q.valid).sum(-1)
    torch.testing.assert_close(acked, delivered * size + served_queued, rtol=0, atol=0)


# ---------------------------------------------------------------- the whole level
def test_conservation_every_step():
    E, R, T = 8, 6, 25
    cfg = dataclasses.replace(CFG, buffer_msgs=4, timeout_steps=6)
    eng = make_engine("L2-legacy", E, R, "cpu", seed=3, cfg=cfg)
    send = bernoulli_sends(T, E, R, 0.6, 4)
    size = torch.where(torch.rand(E, R, generator=torch.Generator().manual_seed(5)) < 0.5, 4000.0, 30_000.0)
    snr = torch.linspace(5.0, 28.0, E * R).view(E, R)
    cum = {k: torch.zeros(E, R) for k in ("offered", "delivered", "timeouts", "overflow")}
    g = torch.Generator().manual_seed(6)  # the deadlines, independent of the global RNG and test order
    for t in range(T):
        out = eng.step(send[t], size, snr_db=snr, deadline=torch.randint(1, 7, (E, R), generator=g).float())
        for k in cum:
            cum[k] += out[k]
        torch.testing.assert_close(cum["offered"], cum["delivered"] + cum["timeouts"] + cum["overflow"]
                                   + out["queued_msgs"])
        assert bool((out["aoi"] >= 1).all()) and bool((out["energy_j"] >= 0).all())
    assert cum["overflow"].sum() > 0 and cum["timeouts"].sum() > 0 and cum["delivered"].sum() > 0


def test_same_seed_same_kpis_and_reset_isolation():
    E, R, T = 6, 4, 8
    send = bernoulli_sends(T, E, R, 0.5, 6)
    a = make_engine("L2-legacy", E, R, "cpu", seed=11)
    b = make_engine("L2-legacy", E, R, "cpu", seed=11)
    c = make_engine("L2-legacy", E, R, "cpu", seed=12)
    oa, ob, oc = (rollout(x, 4, send, 15_000.0, 12.0) for x in (a, b, c))
    for x, y in zip(oa, ob, strict=True):
        for k in x:
            torch.testing.assert_close(x[k], y[k], rtol=0, atol=0)
    assert any(not torch.equal(x["delay_sum"], z["delay_sum"]) for x, z in zip(oa, oc, strict=True))
    # Reset env 1 of a only: the other envs go on exactly as in b.
    a.reset([1])
    assert a.queue.length[1].sum() == 0 and a.counters["tx_first"][1].sum() == 0
    for t in range(4, T):
        xa = a.step(send[t], 15_000.0, snr_db=12.0)
        xb = b.step(send[t], 15_000.0, snr_db=12.0)
        keep = torch.tensor([e != 1 for e in range(E)])
        for k in xa:
            torch.testing.assert_close(xa[k][keep], xb[k][keep], rtol=0, atol=0)
        assert bool((xa["aoi"][1] <= t - 3).all())  # the reset env restarted its AoI at t = 4


def test_reset_clears_every_state_field_of_the_reset_envs_only():
    """Every field of ``L2State`` (walked with ``dataclasses.fields``, so a new field is covered) and
    every counter: back to a fresh engine's values in the reset envs, untouched in the others."""
    from isaac_net.core.levels.l2_legacy import L2State

    E, R = 5, 3
    eng = make_engine("L2-legacy", E, R, "cpu", seed=2)
    g = torch.Generator().manual_seed(9)
    state = eng.state()
    for f in dataclasses.fields(L2State):  # random values everywhere: a missed field cannot look reset
        x = state[f.name]
        state[f.name] = (torch.rand(x.shape, generator=g) < 0.5 if x.dtype == torch.bool
                         else torch.randint(1, 9, x.shape, generator=g).to(x.dtype))
    for k in eng.counters:
        state[k] = torch.randint(1, 9, (E, R), generator=g).to(state[k].dtype)
    eng.load_state(state)
    before = {k: v.clone() for k, v in eng.state().items()}
    fresh = make_engine("L2-legacy", E, R, "cpu", seed=2).state()
    reset = torch.tensor([False, True, False, True, False])
    eng.reset(torch.nonzero(reset).flatten().tolist())
    after = eng.state()
    fields = [(f.name, f.metadata["env_dim"]) for f in dataclasses.fields(L2State)]
    for name, env_dim in fields + [(k, 0) for k in eng.counters]:
        a, b, z = (x.movedim(env_dim, 0) for x in (after[name], before[name], fresh[name]))
        assert torch.equal(a[~reset], b[~reset]), name
        assert torch.equal(a[reset], z[reset]), name
        assert not torch.equal(b[reset], z[reset]), name  # there was something to clear
    assert torch.equal(after["gains"], before["gains"])  # the channel runs on through a reset


@pytest.mark.parametrize("change", ["tx_dbm", "msg_bytes", "send"])
def test_common_random_numbers_under_a_small_input_change(change):
    """Same seed, one robot's input nudged (0.1 dB of power, 1 % of size, one more send):
    the fading and the BLER uniforms are drawn identically."""
    E, R, T = 4, 4, 3
    send = bernoulli_sends(T, E, R, 0.6, 7)
    tx = torch.full((E, R), 23.0)
    size = torch.full((E, R), 20_000.0)
    runs = []
    for nudged in (False, True):
        s_, tx_, size_ = send.clone(), tx.clone(), size.clone()
        if nudged and change == "tx_dbm":
            tx_[1, 2] += 0.1
        elif nudged and change == "msg_bytes":
            size_[1, 2] *= 1.01
        elif nudged:
            s_[0, 1, 2] = 1.0 - s_[0, 1, 2]
        eng = make_engine("L2-legacy", E, R, "cpu", seed=21)
        eng.trace = []
        pos = torch.full((E, R, 2), 80.0)
        for t in range(T):
            eng.step(s_[t], size_, pos=pos, tx_dbm=tx_)
        runs.append(eng.trace)
    for d1, d2 in zip(*runs, strict=True):
        torch.testing.assert_close(d1["gain"], d2["gain"], rtol=0, atol=0)  # same fading
        torch.testing.assert_close(d1["u"], d2["u"], rtol=0, atol=0)  # same BLER uniforms
    # The nudge did change something: the runs are not copies.
    assert any(not torch.equal(d1["tb_bytes"], d2["tb_bytes"]) or not torch.equal(d1["known"], d2["known"])
               for d1, d2 in zip(*runs, strict=True))


def test_low_load_high_snr_against_l1():
    E, R, T = 16, 4, 40
    send = bernoulli_sends(T, E, R, 0.1, 8)
    res = {}
    for level in ("L1", "L2-legacy"):
        eng = make_engine(level, E, R, "cpu", seed=0)
        outs = rollout(eng, T, send, 12_000.0, 30.0)
        tot = {k: sum(o[k].sum().item() for o in outs) for k in ("offered", "delivered", "delay_sum")}
        res[level] = (tot["delivered"] / tot["offered"], tot["delay_sum"] / tot["delivered"])
    ratio, delay = res["L2-legacy"]
    l1_delay = res["L1"][1]
    assert ratio >= LOW_LOAD_MIN_DELIVERY
    assert l1_delay <= delay <= l1_delay + LOW_LOAD_MAX_EXCESS_SLOTS / K, (delay, l1_delay)


def test_overload_gives_overflow_and_timeouts():
    E, R, T = 4, 8, 12
    eng = make_engine("L2-legacy", E, R, "cpu", seed=0)
    outs = rollout(eng, T, torch.ones(T, E, R), 60_000.0, 10.0)
    assert sum(o["overflow"].sum().item() for o in outs) > 0
    assert sum(o["timeouts"].sum().item() for o in outs) > 0


def test_float64_runs_and_conserves():
    E, R, T = 3, 3, 4
    eng = make_engine("L2-legacy", E, R, "cpu", seed=0, dtype=torch.float64)
    outs = rollout(eng, T, bernoulli_sends(T, E, R, 0.7, 1), 9000.0, 15.0)
    assert all(v.dtype == torch.float64 for v in outs[-1].values())
    off = sum(o["offered"] for o in outs)
    rest = sum(o["delivered"] + o["timeouts"] + o["overflow"] for o in outs) + outs[-1]["queued_msgs"]
    torch.testing.assert_close(off, rest)


@pytest.mark.parametrize("kwargs, match", [
    (dict(send=2.0), "send"),
    (dict(msg_bytes=-5.0), "msg_bytes"),
    (dict(snr_db=torch.zeros(3, 3)), "snr_db"),
    (dict(deadline=50.0), "deadline"),
    (dict(snr_db=None), "snr_db, pos"),
])
def test_bad_step_inputs_raise_value_error_naming_the_argument(kwargs, match):
    eng = make_engine("L2-legacy", 2, 2, "cpu", seed=0)
    args = dict(send=1.0, msg_bytes=100.0, snr_db=10.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        eng.step(**args)


@pytest.mark.parametrize("field, value", [
    ("k2_slots", 0), ("harq_rtt_slots", 4), ("harq_max_tx", 0), ("olla_target_bler", 1.0),
    ("pf_beta", 1.0), ("coh_slots", 0), ("sr_grant_bytes", -1.0), ("mcs_se", ()),
])
def test_bad_l2_config_raises_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        L2LegacyConfig(**{field: value})


def test_bad_constructor_arguments():
    with pytest.raises(TypeError, match="l2_cfg"):
        make_engine("L2-legacy", 2, 2, "cpu", l2_cfg={"k2_slots": 4})
    with pytest.raises(ValueError, match="seed"):
        NetL2Legacy(2, 2, "cpu", seed="abc")
    with pytest.raises(ValueError, match="E"):
        make_engine("L2-legacy", 0, 2, "cpu")
    assert L2LegacyConfig().olla_down_db == pytest.approx(1.0 * 0.1 / 0.9)


# ---------------------------------------------------------------- peer
def test_mcs_table_and_olla_match_sionna_sys_peer():
    """Sionna SYS as a peer: the same NR MCS table (PUSCH, table 1) and the same OLLA rule."""
    sys_ = pytest.importorskip("sionna.sys")
    from sionna.phy.nr.utils import decode_mcs_index

    for m, se in enumerate(mech.NR_MCS_SE):
        qm, rate = decode_mcs_index(m, table_index=1, is_pusch=True)
        assert float(qm) * float(rate) == pytest.approx(se, abs=1e-3)
    N = 64
    peer = sys_.OuterLoopLinkAdaptation(sys_.PHYAbstraction(), num_ut=N, bler_target=L2.olla_target_bler,
                                        delta_up=L2.olla_up_db, offset_min=-L2.olla_max_db,
                                        offset_max=L2.olla_max_db)
    ours = torch.zeros(N)
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        feedback = torch.randint(-1, 2, (N,), generator=g)  # -1: none, 0: NACK, 1: ACK
        feedback[: N // 4] = torch.where(feedback[: N // 4] == 1, 0, feedback[: N // 4])  # some hit the clamp
        peer(torch.full((N,), 100), feedback, torch.full((N,), 10.0))
        ours = mech.olla_update(ours, feedback >= 0, feedback == 0, L2.olla_up_db, L2.olla_down_db,
                                L2.olla_max_db)
        torch.testing.assert_close(peer.offset.float(), ours, atol=1e-4, rtol=0)


# ---------------------------------------------------------------- the numba slot loop
def _scenario(seed: int, E: int, R: int, dtype, **cell):
    """A random scenario: message sizes 1-60 kB, send probabilities up to overload, SNR -10 to 40 dB,
    deadlines that bind, a buffer of a few messages (so that overflow and timeouts happen). ``cell``:
    other :class:`CellConfig` fields."""
    g = torch.Generator().manual_seed(seed)
    cfg = CellConfig(buffer_msgs=int(torch.randint(2, 6, (1,), generator=g)),
                     timeout_steps=int(torch.randint(3, 9, (1,), generator=g)), **cell)
    T = 12
    p = torch.rand(E, R, generator=g)
    send = (torch.rand(T, E, R, generator=g) < p).to(dtype)
    msg_bytes = (1000.0 + 59_000.0 * torch.rand(E, R, generator=g)).to(dtype)
    snr_db = (-10.0 + 50.0 * torch.rand(E, R, generator=g)).to(dtype)
    deadline = torch.randint(1, cfg.timeout_steps + 1, (E, R), generator=g)
    return cfg, T, send, msg_bytes, snr_db, deadline


def _run(backend, cfg, T, send, msg_bytes, snr_db, deadline, dtype, seed=3, l2_cfg=None):
    E, R = send.shape[1:]
    eng = make_engine("L2-legacy", E, R, cfg=cfg, dtype=dtype, seed=seed, backend=backend, l2_cfg=l2_cfg)
    outs = [eng.step(send[t], msg_bytes, snr_db=snr_db, deadline=deadline) for t in range(T)]
    return eng, outs


# Event counts are whole numbers: equal. Delays and energies (sums of slot times) to these (relative).
_FLOAT_RTOL = {torch.float64: 1e-9, torch.float32: 1e-5}
_EVENT_KEYS = ("offered", "delivered", "timeouts", "overflow", "queued_msgs", "aoi")


def _assert_same_events(eager, want, fast, got, dtype):
    """Same seed, same events: every step's counts equal, delay sums and energy to float tolerance,
    the level's counters (new TBs, NACKs, HARQ retransmissions and failures, RLC rounds and
    losses, SRs) equal, the state after the run the same."""
    for a, b in zip(want, got, strict=True):
        for k in _EVENT_KEYS:
            assert torch.equal(a[k], b[k]), k
        for k in ("delay_sum", "energy_j", "throughput_bytes_per_s"):
            torch.testing.assert_close(b[k], a[k], rtol=_FLOAT_RTOL[dtype], atol=0.0)
    for k, v in eager.counters.items():
        assert torch.equal(fast.counters[k], v), k
    # The queue and the AoI's reference after the run (the base class's bookkeeping, numba's own kernels).
    for k in ("bytes", "size", "gen", "length", "fresh_gen", "t_now"):
        assert torch.equal(fast.state()[k], eager.state()[k]), k
    assert fast.t == eager.t
    for k, v in eager.l2_state.tensors().items():
        if v.is_floating_point():
            torch.testing.assert_close(getattr(fast.l2_state, k), v, rtol=_FLOAT_RTOL[dtype], atol=1e-12)
        else:
            assert torch.equal(getattr(fast.l2_state, k), v), k
    # The scenarios bind: something was delivered, and the buffer or the deadline dropped messages.
    total = {k: sum(float(o[k].sum()) for o in want) for k in ("delivered", "timeouts", "overflow")}
    assert total["delivered"] > 0 and total["timeouts"] + total["overflow"] > 0


# (seed, E, R, dtype): fleets of 1 to 64 robots, both dtypes.
_NUMBA_CASES = [(0, 5, 3, torch.float64), (1, 16, 8, torch.float64), (2, 9, 8, torch.float32),
                (3, 4, 3, torch.float64), (5, 7, 64, torch.float32), (6, 3, 1, torch.float64),
                (7, 6, 1, torch.float32), (8, 3, 40, torch.float64)]


@pytest.mark.parametrize("seed,E,R,dtype", _NUMBA_CASES)
def test_numba_slot_loop_gives_the_eager_events(seed, E, R, dtype):
    cfg, T, send, msg_bytes, snr_db, deadline = _scenario(seed, E, R, dtype)
    eager, want = _run("eager", cfg, T, send, msg_bytes, snr_db, deadline, dtype)
    fast, got = _run("numba", cfg, T, send, msg_bytes, snr_db, deadline, dtype)
    assert fast.slot_loop == "numba" and eager.slot_loop == "eager"
    _assert_same_events(eager, want, fast, got, dtype)


# Other constants: subbands below, at and above ATen's SIMD width (the order of the sums over them),
# no RLC delay, a short HARQ, one PF round, a fast SR.
_OTHER_CONSTANTS = [(5, {}), (20, {"rlc_delay_slots": 0, "harq_max_tx": 2}),
                    (33, {"k2_slots": 2, "harq_rtt_slots": 3, "pf_rounds": 1, "sr_period_slots": 1}),
                    (8, {"coh_slots": 3, "est_delay_slots": 7, "rlc_max_retx": 0})]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("num_subbands,l2", _OTHER_CONSTANTS)
def test_numba_slot_loop_gives_the_eager_events_under_other_constants(num_subbands, l2, dtype):
    cfg, T, send, msg_bytes, snr_db, deadline = _scenario(11, 6, 5, dtype, num_subbands=num_subbands)
    l2_cfg = L2LegacyConfig(**l2)
    eager, want = _run("eager", cfg, T, send, msg_bytes, snr_db, deadline, dtype, l2_cfg=l2_cfg)
    fast, got = _run("numba", cfg, T, send, msg_bytes, snr_db, deadline, dtype, l2_cfg=l2_cfg)
    _assert_same_events(eager, want, fast, got, dtype)


def test_numba_slot_loop_keeps_state_load_state_and_reset():
    """state()/load_state() replays the same steps; reset(env_ids) clears the same envs as eager."""
    dtype = torch.float64
    cfg, T, send, msg_bytes, snr_db, deadline = _scenario(4, 6, 3, dtype)
    backend = "numba"
    engines = {b: make_engine("L2-legacy", 6, 3, cfg=cfg, dtype=dtype, seed=5, backend=b)
               for b in ("eager", backend)}
    outs = {b: [] for b in engines}
    for b, eng in engines.items():
        for t in range(T):
            if t == 5:
                eng.reset([1, 4])
            outs[b].append(eng.step(send[t], msg_bytes, snr_db=snr_db, deadline=deadline))
    for a, c in zip(outs["eager"], outs[backend], strict=True):
        for k in _EVENT_KEYS:
            assert torch.equal(a[k], c[k]), k
    fast = engines[backend]
    saved = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in fast.state().items()}
    t0 = fast.t
    first = [fast.step(send[t], msg_bytes, snr_db=snr_db, deadline=deadline) for t in range(3)]
    saved_too = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in saved.items()}
    fast.load_state(saved)  # (no copy: the steps below write into saved's rings in place)
    assert fast.t == t0  # the host's step counter follows the state's
    again = [fast.step(send[t], msg_bytes, snr_db=snr_db, deadline=deadline) for t in range(3)]
    for a, c in zip(first, again, strict=True):
        for k in a:
            assert torch.equal(a[k], c[k]), k
    # another engine's state, taken at another step: a fresh engine (t = 0) steps on from it as the
    # engine it came from does (its counters used to stay at 0 and the kernels index rings by both)
    other = make_engine("L2-legacy", 6, 3, cfg=cfg, dtype=dtype, seed=5, backend=backend)
    other.load_state(saved_too)
    assert other.t == t0 == int(saved_too["t_now"]) > 0
    moved = [other.step(send[t], msg_bytes, snr_db=snr_db, deadline=deadline) for t in range(3)]
    for a, c in zip(first, moved, strict=True):
        for k in a:
            assert torch.equal(a[k], c[k]), k
    other.t = 0  # counters set apart by hand: refused before a kernel writes out of bounds
    with pytest.raises(RuntimeError, match=r"step counters disagree: t = 0, t_now = "):
        other.step(send[0], msg_bytes, snr_db=snr_db, deadline=deadline)


@pytest.mark.parametrize("seed", [21, 22, 23, 24])
def test_numba_step_gives_the_eager_events_over_random_fleets(seed):
    """Property: over random fleets (1 to 64 robots, 1 to 12 envs, either dtype, sizes, loads, SNR
    -10 to 40 dB, deadlines and buffers that bind), the numba step's events are eager's."""
    g = torch.Generator().manual_seed(seed)
    E, R = int(torch.randint(1, 13, (1,), generator=g)), int(torch.randint(1, 65, (1,), generator=g))
    dtype = (torch.float32, torch.float64)[seed % 2]
    cfg, T, send, msg_bytes, snr_db, deadline = _scenario(seed, E, R, dtype)
    eager, want = _run("eager", cfg, T, send, msg_bytes, snr_db, deadline, dtype, seed=seed)
    fast, got = _run("numba", cfg, T, send, msg_bytes, snr_db, deadline, dtype, seed=seed)
    _assert_same_events(eager, want, fast, got, dtype)


@pytest.mark.parametrize("seed,E,R,dtype", [_NUMBA_CASES[1], _NUMBA_CASES[2], _NUMBA_CASES[4]])
def test_numba_step_kpis_are_eagers_bit_for_bit(seed, E, R, dtype):
    """Beyond the tolerance: the numba step's delays, energies and throughputs are eager's bit for bit
    (the same arithmetic in the level's dtype, the sums over the queue in ATen's order)."""
    cfg, T, send, msg_bytes, snr_db, deadline = _scenario(seed, E, R, dtype)
    _, want = _run("eager", cfg, T, send, msg_bytes, snr_db, deadline, dtype)
    _, got = _run("numba", cfg, T, send, msg_bytes, snr_db, deadline, dtype)
    for a, b in zip(want, got, strict=True):
        for k in a:
            assert torch.equal(b[k], a[k]), k


def test_numba_step_leaves_an_earlier_state_as_it_was():
    """A state() taken before a step keeps its values, as with the eager step: the queue, the
    per-message fields and the per-robot fields are each step's own tensors (only the HARQ, grant
    and fading rings and the counters are written in place, by either step)."""
    cfg, T, send, msg_bytes, snr_db, deadline = _scenario(9, 4, 5, torch.float32)
    eng = make_engine("L2-legacy", 4, 5, cfg=cfg, seed=1, backend="numba")
    for t in range(3):
        eng.step(send[t], msg_bytes, snr_db=snr_db, deadline=deadline)
    in_place = {"hq_active", "hq_sb", "hq_mcs", "hq_acc", "hq_ntx", "hq_first", "gr_sb", "gr_mcs", "gr_tbs",
                "gains", "rng_state", *eng.counters}
    before = {k: v for k, v in eng.state().items() if k not in in_place}
    copy = {k: v.clone() for k, v in before.items()}
    for t in range(3, 6):
        eng.step(send[t], msg_bytes, snr_db=snr_db, deadline=deadline)
    for k, v in before.items():
        assert torch.equal(v, copy[k]), k


@pytest.mark.parametrize("S", [1, 2, 5, 8, 12, 16])
def test_numba_subband_order_is_torchs(S):
    """The estimate's subband order (up to 16 subbands, numba's by rank) is torch.argsort's stable one,
    ties included (capped spectral efficiencies tie often)."""
    from isaac_net.core.levels import _l2_numba

    assert S <= _l2_numba.SORT_BY_INSERTION_MAX
    g = torch.Generator().manual_seed(S)
    for dtype in (torch.float32, torch.float64):
        se = torch.randint(0, 4, (500, S), generator=g).to(dtype) / 3  # ties
        se[:100] = torch.rand(100, S, generator=g, dtype=dtype)
        order = torch.empty(500, S, dtype=torch.long)
        _l2_numba._argsort_descending(se.numpy(), order.numpy())
        assert torch.equal(order, torch.argsort(se, dim=-1, descending=True, stable=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numba_sum_over_subbands_is_atens(dtype):
    """The kernel's sum over a TB's subbands adds in ATen's order: bit for bit torch's sum, for
    lengths below, at and above the SIMD width and below and above four vectors (non-negative terms,
    some zero, as the log2 terms of a TB)."""
    from isaac_net.core.levels import _l2_numba

    lanes = int(_l2_numba.constants(NetL2Legacy(1, 1, dtype=dtype))["ints"][-1])
    g = torch.Generator().manual_seed(0)
    p = np.empty(4 * lanes, dtype=torch.empty(0, dtype=dtype).numpy().dtype)
    for n in range(1, 5 * lanes + 3):
        x = torch.rand(200, n, generator=g, dtype=dtype) * 7
        x = x * (torch.rand(200, n, generator=g) < 0.6)
        want = x.sum(-1)
        got = torch.tensor([_l2_numba._aten_sum(row, lanes, p) for row in x.numpy()], dtype=dtype)
        assert torch.equal(got, want), n


def test_numba_mcs_is_select_mcs():
    """The kernel's MCS (a count of the bounds at most the SINR) is :func:`mech.select_mcs`'s."""
    from isaac_net.core.levels import _l2_numba

    x_db = torch.linspace(-30.0, 40.0, 5001, dtype=torch.float64)
    # (the kernel's SINRs are finite: floored before the log)
    x_db = torch.cat([x_db, SEL.to(torch.float64), torch.tensor([-math.inf, math.inf], dtype=torch.float64)])
    want = mech.select_mcs(x_db, torch.zeros_like(x_db), SEL.to(torch.float64))
    sel = SEL.to(torch.float64).numpy()
    got = torch.tensor([_l2_numba._mcs(sel, float(x)) for x in x_db])
    assert torch.equal(got, want)


@pytest.mark.parametrize("seed,E,R,dtype", _NUMBA_CASES[:4])
def test_an_idle_harq_process_is_empty(seed, E, R, dtype):
    """What the numba step relies on: an idle HARQ process (either loop) holds no bytes, subbands, SINR
    or transmissions, so the numba step writes only its MCS and its grant reads no subbands from it."""
    cfg, T, send, msg_bytes, snr_db, deadline = _scenario(seed, E, R, dtype)
    for backend in ("eager", "numba"):
        eng = make_engine("L2-legacy", E, R, cfg=cfg, dtype=dtype, seed=3, backend=backend)
        retx = 0
        for t in range(T):
            eng.step(send[t], msg_bytes, snr_db=snr_db, deadline=deadline)
            st = eng.l2_state
            idle = ~st.hq_active
            retx += int(st.hq_active.sum())
            assert not bool((st.hq_content.sum(-1) * idle).any())
            assert not bool((st.hq_sb.any(-1) & idle).any())
            assert not bool((st.hq_acc * idle).any()) and not bool((st.hq_ntx * idle).any())
        assert retx > 0  # (some process was not idle)


def test_backend_choice_is_checked():
    assert make_engine("L2-legacy", 2, 2, backend="eager").slot_loop == "eager"
    assert make_engine("L2-legacy", 2, 2).slot_loop == "numba"  # the CPU's default (docs/design.md §2)
    assert NetL2Legacy(2, 2).slot_loop == "numba"
    with pytest.raises(ValueError, match="backend 'numba' is L2-legacy's"):
        make_engine("QA", 2, 2, backend="numba")
    with pytest.raises(ValueError, match="unknown backend 'compiled'"):  # the inductor slot loop is gone
        make_engine("L2-legacy", 2, 2, backend="compiled")
    with pytest.raises(ValueError, match="slot_loop"):
        NetL2Legacy(2, 2, slot_loop="fast")


@pytest.mark.cuda
def test_cuda_keeps_the_eager_slot_loop():
    """The numba kernel reads CPU memory: on CUDA the default is eager and asking for numba fails."""
    assert make_engine("L2-legacy", 2, 2, "cuda").slot_loop == "eager"
    with pytest.raises(ValueError, match="'numba' runs on the CPU"):
        make_engine("L2-legacy", 2, 2, "cuda", backend="numba")
