"""L2-legacy's control step in numba kernels: the level's ``slot_loop="numba"`` (docs/design.md §2).

Below a few hundred cells an eager L2-legacy step is per-op overhead (about 190 small torch ops a
slot, 40 slots a step). Here the whole slot loop of a step (every slot, env and robot) is one call of
:func:`_step_kernel`, a numba function over numpy views of the level's CPU tensors, written in place.
It is the eager loop (:meth:`~.l2_legacy.NetL2Legacy._serve_eager`) element by element, in the
level's dtype, with the same comparisons deciding the events. The base class's bookkeeping of the
step is two more kernels around it (:func:`step`): :func:`_open_kernel` (capture, the queue in age
order, the per-message state of the messages gone cleared) and :func:`_close_kernel` (the bytes in
HARQ, deliveries, delays, timeouts, the queue compacted, AoI, energy, every per-message field one step
older, the counters). What stays in torch: the inputs' checks, the step's random numbers (drawn by
the level's generator in its order), the channel and the gNB's estimate per fading block
(:meth:`~.l2_legacy.NetL2Legacy._channel_blocks`; up to 16 subbands the estimate's order comes from
:func:`_argsort_descending`). So one seed gives the events of the eager step. Byte counts are whole
numbers (exact in any order of addition); delays and energies are computed in the level's dtype as
the eager step does, their sums over a robot's messages in ATen's order: the KPIs are eager's.

Floating point: the sums over subbands add in the order ATen's CPU reduction does (SIMD lanes, then
the lanes in order; :func:`_aten_sum`), the PF average is ATen's ``lerp`` (one fused multiply-add).
The transcendental functions (``log2``, ``exp2``, ``log``, ``log10``) are the C library's here and
SLEEF's in ATen's vector loops: a last-bit difference can move a float by one ulp; an event moves
only if a uniform or a threshold falls within that ulp.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch
from llvmlite import ir
from numba.extending import intrinsic

from isaac_net.core import radio
from isaac_net.core.kpi import KPI_KEYS
from isaac_net.core.levels import l2_mechanisms as mech
from isaac_net.core.levels.base import Queue
from isaac_net.core.levels.l2_legacy import L2State

# The per-robot counts of a step (``counts`` ``[len(COUNTS), E, R]``): the level's counters and the
# slots each robot transmitted in (the energy).
COUNTS = ("tx_first", "nack_first", "tx_retx", "harq_fail", "rlc_retx", "rlc_lost", "sr", "tx_slots")
# The estimate's subband order is the stable one (equal values by index, on every device): up to this
# many subbands computed here (_argsort_descending), above it by torch.argsort(stable=True).
SORT_BY_INSERTION_MAX = 16
# The per-message fields of L2State (the last index: the message's age), in the kernels' order.
PER_MESSAGE = ("pending", "held", "rlc_cnt", "round_slot", "hq_content")
# The float constants, in this order, as one array of the level's dtype.
CONSTS = ("bler_c", "olla_up_db", "olla_down_db", "olla_max_db", "pf_weight", "sr_grant_bytes", "avg_floor",
          "sinr_floor_lin", "ten")
# The integer constants and the step's slot numbers, in this order, as one int64 array.
INTS = ("t", "num_slots", "harq_rtt", "k2", "rlc_ring", "rlc_delay", "harq_max_tx", "rlc_max_retx",
        "sr_period", "pf_rounds", "simd_lanes")


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (LLVM's fma), as ATen's vectorised ``lerp`` computes."""
    def codegen(context, builder, signature, args):
        ty = args[0].type
        fn = builder.module.declare_intrinsic("llvm.fma", [ty], ir.FunctionType(ty, [ty, ty, ty]))
        return builder.call(fn, args)
    return a(a, b, c), codegen


@numba.njit(cache=True, inline="always", error_model="numpy", _nrt=False)
def _aten_sum(x, lanes, p):
    """``x.sum()`` added in the order of ATen's CPU sum over a contiguous last dimension (``p``: scratch
    of at least ``4 * lanes``).

    Below ``lanes`` (the SIMD width in elements) a scalar loop keeps 4 partial sums (element ``i``
    in partial ``i % 4``, the tail in partial 0) and adds them in order; from ``lanes`` on, lane
    ``l`` sums the elements ``v * lanes + l`` (4 partial vectors likewise), the tail after the last
    whole vector is summed first, then each lane is added in order. (ATen's cascade levels start at
    16 rows: a few hundred subbands; here the rows are fewer.)
    """
    n = x.shape[0]
    width = lanes if n >= lanes else 1
    nvec = n // width
    if width > 1 and nvec < 4:  # no whole row of 4 vectors: each lane's sum is its elements in order
        total = x[0] - x[0]  # (the same sums as below without adding the empty partials: +0)
        for i in range(nvec * width, n):
            total += x[i]
        for lane in range(width):
            acc = x[lane]
            for v in range(1, nvec):
                acc += x[v * width + lane]
            total += acc
        return total
    for i in range(4 * width):
        p[i] = 0
    rows = nvec // 4
    for i in range(rows * 4):
        for lane in range(width):
            p[(i % 4) * width + lane] += x[i * width + lane]
    for v in range(rows * 4, nvec):
        for lane in range(width):
            p[lane] += x[v * width + lane]
    for k in range(1, 4):
        for lane in range(width):
            p[lane] += p[k * width + lane]
    if width == 1:
        return p[0]
    total = x[0] - x[0]
    for i in range(nvec * width, n):
        total += x[i]
    for lane in range(width):
        total += p[lane]
    return total


@numba.njit(cache=True, inline="always", error_model="numpy", _nrt=False)
def _effective_sinr(x, is_sb, n_f, terms, lanes, one):
    """Shannon MIESM of one TB (:func:`~.l2_mechanisms.effective_sinr_lin`): ``x`` ``[S]`` SINR with the
    full power in one subband, split over ``n_f`` (>= 1) subbands; ``is_sb`` ``[S]`` bool; ``terms``
    scratch of ``S + 4 * lanes``."""
    S = x.shape[0]
    for j in range(S):
        terms[j] = np.log2(x[j] / n_f + one) if is_sb[j] else one - one
    return np.exp2(_aten_sum(terms[:S], lanes, terms[S:]) / n_f) - one


@numba.njit(cache=True, inline="always", error_model="numpy", _nrt=False)
def _send(e, r, k, s, ix, ints, consts, bler_b, nf, msgs, harq, grants, rx, nack_below, counts, content,
          is_sb, terms, granted):
    """Robot ``r`` of env ``e`` in slot ``s`` (``k`` in the step): the retransmission due now or a new TB
    on the grant, its HARQ feedback and the HARQ process after it (the eager
    :func:`~.l2_legacy.transmit` and :func:`~.l2_legacy.harq_next`; :func:`_acked_or_failed` for the
    rest). ``msgs``, ``harq``, ``grants``: the per-message fields, HARQ and grant rings
    (:func:`_step_kernel`); ``granted``: ``(is_known, sinr)``, the effective SINR of a new TB as the
    grant computed it (:func:`_granted_sinr`). :output: ``(is_new, nack, tb_bytes, sendable)``."""
    unsched = msgs[0]
    hq_active, hq_content, hq_sb, hq_mcs, hq_acc, hq_ntx, hq_first = harq
    gr_sb, gr_mcs, gr_tbs = grants
    A, S = unsched.shape[2], is_sb.shape[0]
    p, g = ix[k, 0], ix[k, 1]
    zero = consts[0] - consts[0]
    # A new TB takes the oldest bytes not in a TB (whole bytes: the arithmetic is exact).
    tbs, cum, tb_bytes = gr_tbs[g, e, r], zero, zero
    for a in range(A):
        u = unsched[e, r, a]
        cum += u
        take = min(max(tbs - cum + u, zero), u)
        tb_bytes += take
        unsched[e, r, a] = u - take
        content[a] = hq_content[p, e, r, a] + take
    is_retx = hq_active[p, e, r]
    is_new = tb_bytes > zero
    is_tx = is_retx or is_new
    for j in range(S):  # the retransmission's subbands or the grant's (never both)
        is_sb[j] = hq_sb[p, e, r, j] or gr_sb[g, e, r, j]
    mcs = hq_mcs[p, e, r] if is_retx else gr_mcs[g, e, r]
    nack, fail, acc, ntx = False, False, zero, hq_ntx[p, e, r] + 1
    if is_tx:  # (without a transmission the SINR is not used: the process is emptied)
        n_sb = 0
        for j in range(S):
            n_sb += is_sb[j]
        eff = granted[1] if granted[0] and not is_retx else _effective_sinr(rx[e, r], is_sb, nf[max(n_sb, 1)],
                                                                            terms, ints[10], nf[1])
        acc = hq_acc[p, e, r] + eff
        nack = consts[0] * np.log(acc) + bler_b[mcs] < nack_below[k, e, r]  # u < BLER, in logit form
        fail = nack and ntx >= ints[6]
        first = s if is_new else hq_first[p, e, r]
        n_round, n_lost = _acked_or_failed(e, r, k, s, ix, ints, zero, msgs, content, nack, fail, first)
        counts[4, e, r] += n_round
        counts[5, e, r] += n_lost
        hq_first[p, e, r] = first
    # HARQ: a NACKed TB short of its last transmission waits for the RTT.
    keep = nack and not fail
    hq_active[p, e, r] = keep
    for a in range(A):
        hq_content[p, e, r, a] = content[a] if keep else zero
    for j in range(S):
        hq_sb[p, e, r, j] = is_sb[j] and keep
    hq_mcs[p, e, r] = mcs
    hq_acc[p, e, r] = acc if keep else zero
    hq_ntx[p, e, r] = ntx if keep else 0
    counts[0, e, r] += is_new
    counts[1, e, r] += nack and is_new
    counts[2, e, r] += is_retx
    counts[3, e, r] += fail
    counts[7, e, r] += is_tx
    return is_new, nack, tb_bytes, cum


@numba.njit(cache=True, inline="always", error_model="numpy", _nrt=False)
def _granted_sinr(e, r, b, g, rx, est_x, gr_sb, scratch):
    """The effective SINR of robot ``r``'s new TB on the grant at ring entry ``g`` as the grant computed
    it, if this kernel call made the grant and the channel ``rx[b]`` is the estimate's on the granted
    subbands (the same block, the same SNR): the same function of the same numbers, so the same value
    without its logs. :output: ``(is_known, sinr)``."""
    gr_eff, gr_est = scratch[13], scratch[14]
    c = gr_est[g, r]
    if c < 0:
        return False, gr_eff[g, r]
    for j in range(gr_sb.shape[3]):
        if gr_sb[g, e, r, j] and est_x[c, e, r, j] != rx[b, e, r, j]:
            return False, gr_eff[g, r]
    return True, gr_eff[g, r]


@numba.njit(cache=True, inline="always", error_model="numpy", _nrt=False)
def _idle(e, r, k, p, g, ix, consts, harq, grants, unsched, known, outstanding, avg_thr, sr_occasion, counts):
    """Robot ``r`` of env ``e`` in slot ``k`` with no retransmission due and no grant (``gr_tbs == 0``):
    what :func:`_send` and the kernel's robot loop do then, without their loops over the messages
    (the TB takes 0 bytes: ``tb_bytes`` is +0, the buffer unchanged, no BSR; ``outstanding - 0`` is
    ``outstanding``). Its HARQ process stays empty; the PF average decays; an SR at its occasion."""
    hq_mcs = harq[3]
    zero = consts[0] - consts[0]
    # The process is idle, so already empty (no contents, subbands, SINR or transmissions: what either
    # loop leaves in an idle process, and a reset's): of the eager writes only the MCS changes it.
    hq_mcs[p, e, r] = grants[1][g, e, r]
    avg_thr[e, r] = _fma(consts[4], zero - avg_thr[e, r], avg_thr[e, r])  # ATen's lerp
    if sr_occasion[ix[k, 5], r] and known[e, r] <= zero and outstanding[e, r] <= zero:
        cum = zero  # the bytes left, summed in _send's order
        for a in range(unsched.shape[2]):
            cum += unsched[e, r, a]
        if cum - zero > zero:
            known[e, r] = consts[5]
            counts[6, e, r] += 1


@numba.njit(cache=True, inline="always", error_model="numpy", _nrt=False)
def _acked_or_failed(e, r, k, s, ix, ints, zero, msgs, content, nack, fail, first):
    """A TB's feedback for its messages (the eager :func:`~.l2_legacy.deliver` and
    :func:`~.l2_legacy.rlc_failure`): ACK, its bytes leave the queue and a message is done with its
    last byte; HARQ failure, RLC resends the bytes after ``rlc_delay_slots`` in the message's round
    or a new one, or the message is lost. ``first``: the TB's first slot. :output: ``(rounds, lost)``."""
    unsched, bytes_, finish_slot, usable, rlc_cnt, round_slot, held, held_any = msgs
    n_round, n_lost = 0, 0
    for a in range(content.shape[0]):
        if not nack:
            bytes_[e, r, a] -= content[a]
            if bytes_[e, r, a] <= zero:
                bytes_[e, r, a] = np.inf
                finish_slot[e, r, a] += k + 1
        elif fail and content[a] > zero and usable[e, r, a]:
            is_round = first >= round_slot[e, r, a]
            if is_round and rlc_cnt[e, r, a] >= ints[7]:
                usable[e, r, a] = False
                bytes_[e, r, a] = np.inf
                unsched[e, r, a] = zero
                n_lost += 1
                continue
            if is_round:
                rlc_cnt[e, r, a] += 1
                round_slot[e, r, a] = s + ints[5]
                n_round += 1
            held[ix[k, 4], e, r, a] += content[a]
            held_any[ix[k, 4]] = True
    return n_round, n_lost


@numba.njit(cache=True, inline="always", error_model="numpy", _nrt=False)
def _pf_allocate(metric, need_left, is_open, order, rounds, alloc, kept_n, offered_to, needy, n_needy):
    """:func:`~.l2_mechanisms.pf_allocate_envs_last` for one env: ``metric`` ``[R, S]``, ``need_left``
    ``[R]`` (clamped to ``[0, S]``, counted down), ``is_open`` ``[S]`` (updated), ``order`` ``[R, S]``
    each robot's subbands best first; ``alloc`` ``[R, S]`` bool out. Each round every open subband
    goes to the first robot at its best metric among those still needing subbands; a robot keeps
    the first offered in its own order up to its need; a declined subband reopens.

    ``needy[:n_needy]``: the robots with a need, in order; the others are never offered a subband
    (their metric is ``-inf``) and the loops pass them by: only the needy robots' rows of ``metric``
    and ``alloc`` are read or written, and robot 0's metric row (``-inf`` if it needs nothing), each
    subband's first candidate as in a scan over every robot."""
    R, S = metric.shape
    for q in range(n_needy):  # (the others' rows are neither read nor written)
        for j in range(S):
            alloc[needy[q], j] = False
    if n_needy == 1:  # one robot: it keeps the first open subbands in its order up to its need, at once
        r, kept = needy[0], 0  # (what the rounds give it: a second round finds its need met or nothing open)
        for pos in range(S):
            j = order[r, pos]
            if kept < need_left[r] and is_open[j] and metric[r, j] > -np.inf:
                alloc[r, j] = True
                kept += 1
        return
    q0 = 1 if n_needy > 0 and needy[0] == 0 else 0  # robot 0 is the scan's start
    for i in range(rounds):
        for q in range(n_needy):
            kept_n[needy[q]] = 0  # first the offers per robot
        for j in range(S):
            offered_to[j] = -1
            if is_open[j]:
                best, who = metric[0, j], 0
                for q in range(q0, n_needy):  # (selects, not branches: the comparisons are unpredictable)
                    r = needy[q]
                    better = metric[r, j] > best
                    best = metric[r, j] if better else best
                    who = r if better else who
                if best > -np.inf:
                    offered_to[j] = who
                    kept_n[who] += 1
        for q in range(n_needy):
            r = needy[q]
            if kept_n[r] <= need_left[r]:  # it keeps every offer
                continue
            kept_n[r] = 0
            for pos in range(S):  # its best offers first
                j = order[r, pos]
                if offered_to[j] == r:
                    if kept_n[r] < need_left[r]:
                        kept_n[r] += 1
                    else:
                        offered_to[j] = -2  # declined
        for j in range(S):
            if offered_to[j] >= 0:
                alloc[offered_to[j], j] = True
        for q in range(n_needy):
            r = needy[q]
            if kept_n[r] >= need_left[r]:  # its need is met: it takes no part in the next round
                for j in range(S):
                    metric[r, j] = -np.inf
        if i + 1 < rounds:
            any_open = False
            for j in range(S):  # a subband nobody wanted stays unwanted; a declined one reopens
                is_open[j] = offered_to[j] == -2
                any_open |= is_open[j]
            if not any_open:  # nothing changes any more
                break
            for q in range(n_needy):
                r = needy[q]
                need_left[r] -= kept_n[r]


@numba.njit(cache=True, inline="always", error_model="numpy", _nrt=False)
def _grant(e, k, c, ix, ints, consts, sel_db, tbs_per_sb, nf, floor_db, harq, grants, known, outstanding,
           olla_db, avg_thr, est, scratch):
    """The grant of env ``e`` for slot ``s + k2`` on the subbands that slot's retransmissions leave
    free (the eager :func:`~.l2_legacy.grant`): PF up to each robot's need, the MCS from the estimate
    less the OLLA offset. ``est``: the gNB's estimate ``(x, se, order, cap, max_sb)``, ``[R(, S)]``;
    ``floor_db``: the estimate in dB with nothing allocated; ``scratch``: work arrays (the effective
    SINR of each grant and the estimate ``c`` it came from kept for :func:`_granted_sinr`)."""
    metric, need_left, is_open, alloc, kept_n, offered_to, terms = scratch[:7]
    # last_db, last_mcs: each robot's estimate in dB and MCS when last granted nothing (emptied per env)
    needy, last_db, last_mcs, gr_eff, gr_est = scratch[10], scratch[11], scratch[12], scratch[13], scratch[14]
    est_x, est_se, est_order, est_cap, est_max_sb = est
    hq_active, hq_sb = harq[0], harq[2]
    gr_sb, gr_mcs, gr_tbs = grants
    R, S = metric.shape
    then, g = ix[k, 2], ix[k, 1]
    zero = consts[0] - consts[0]
    n_needy = 0
    for r in range(R):
        known_t = zero if hq_active[then, e, r] else known[e, r]
        need = 0
        if known_t > zero:  # the fewest subbands whose capacity covers it, within the headroom
            short = 0
            for n in range(S):
                short += est_cap[r, n] < known_t
            need = min(short + 1, est_max_sb[r])
        need_left[r] = min(need, S)
        if need > 0:
            needy[n_needy] = r
            n_needy += 1
    if n_needy > 0:  # (nobody needs anything: no subband to allocate)
        for j in range(S):
            is_open[j] = True
        for r in range(R):
            if hq_active[then, e, r]:  # (an idle process has no subbands)
                for j in range(S):
                    if hq_sb[then, e, r, j]:
                        is_open[j] = False
        if needy[0] != 0:  # -inf: a robot that needs nothing takes no part (robot 0's row is read)
            for j in range(S):
                metric[0, j] = -np.inf
        for q in range(n_needy):  # (the PF reads no other row)
            r = needy[q]
            floor_avg = max(avg_thr[e, r], consts[6])
            for j in range(S):
                metric[r, j] = est_se[r, j] / floor_avg
        _pf_allocate(metric, need_left, is_open, est_order, ints[9], alloc, kept_n, offered_to, needy,
                     n_needy)
    q = 0  # the next needy robot (the others are allocated nothing)
    for r in range(R):
        n_alloc = 0
        if q < n_needy and needy[q] == r:
            q += 1
            for j in range(S):
                n_alloc += alloc[r, j]
                gr_sb[g, e, r, j] = alloc[r, j]
        else:
            for j in range(S):
                gr_sb[g, e, r, j] = False
        x_db = floor_db - olla_db[e, r]
        gr_est[g, r] = c if n_alloc > 0 else -1
        if n_alloc > 0:
            eff = _effective_sinr(est_x[r], alloc[r], nf[n_alloc], terms, ints[10], nf[1])
            gr_eff[g, r] = eff
            x_db = consts[8] * np.log10(max(eff, consts[7])) - olla_db[e, r]
            mcs = _mcs(sel_db, x_db)
        elif x_db == last_db[r]:  # nothing allocated: the robot's MCS of the last time, if the same estimate
            mcs = last_mcs[r]
        else:
            mcs = _mcs(sel_db, x_db)
            last_db[r], last_mcs[r] = x_db, mcs
        tbs = np.floor(nf[n_alloc] * tbs_per_sb[mcs])
        gr_mcs[g, e, r] = mcs
        gr_tbs[g, e, r] = tbs
        known[e, r] = max(known[e, r] - tbs, zero)
        outstanding[e, r] += tbs


@numba.njit(cache=True, inline="always", error_model="numpy", _nrt=False)
def _mcs(sel_db, x_db):
    """The highest MCS whose bound is at most ``x_db`` (MCS 0 if none): the bounds are sorted."""
    n = 0
    for m in range(sel_db.shape[0]):  # how many bounds are <= x_db: a count, no unpredictable branch
        n += sel_db[m] <= x_db
    return max(n - 1, 0)


@numba.njit(cache=True, error_model="numpy", _nrt=False)
def _step_kernel(ints, ix, consts, bler_b, sel_db, tbs_per_sb, nf, sr_occasion, nack_below, rx, rx_of_slot,
                 est_x, est_se, est_order, est_cap, est_max_sb, est_of_slot, unsched, bytes_, finish_slot,
                 usable, rlc_cnt, round_slot, held, hq_active, hq_content, hq_sb, hq_mcs, hq_acc, hq_ntx,
                 hq_first, gr_sb, gr_mcs, gr_tbs, known, outstanding, olla_db, avg_thr, counts, scratch):
    """Every UL slot of step ``t`` for every env and robot, state written in place (shapes as in
    :class:`~.l2_legacy.L2State`; ``rx`` ``[blocks, E, R, S]`` the channel per fading block,
    ``rx_of_slot`` ``[K]`` its block per slot; ``est_*`` ``[blocks, E, R(, S)]`` and ``est_of_slot``
    likewise for the estimate; ``nack_below`` ``[K, E, R]``; ``counts`` ``[len(COUNTS), E, R]`` int64;
    ``ix`` ``[K, 6]`` each slot's ring entries, :func:`_ring_entries`). A robot with nothing to send
    on (no retransmission due, no grant) takes :func:`_idle`, the same writes without the loops."""
    E, R, A = unsched.shape
    t, K, D = ints[0], ints[1], ints[4]
    zero = consts[0] - consts[0]
    held_any = scratch[9]  # per slot of the RLC ring: whether the env's entry may hold bytes
    held_flat = held.reshape(D, E, R * A)
    msgs = (unsched, bytes_, finish_slot, usable, rlc_cnt, round_slot, held, held_any)
    harq = (hq_active, hq_content, hq_sb, hq_mcs, hq_acc, hq_ntx, hq_first)
    grants = (gr_sb, gr_mcs, gr_tbs)
    content, is_sb, terms = scratch[7], scratch[8], scratch[6]
    floor_db = consts[8] * np.log10(consts[7])  # nothing allocated: the SINR's floor, in dB
    last_db = scratch[11]
    gr_est = scratch[14]  # per grant ring entry and robot: the estimate its SINR came from (-1: none)
    for e in range(E):  # the envs are independent: one at a time, all its slots
        for r in range(R):
            last_db[r] = np.nan  # (equal to no estimate)
            for u in range(gr_est.shape[0]):
                gr_est[u, r] = -1
        for d in range(D):
            n_held = 0  # (a count: a loop the compiler vectorises)
            for i in range(R * A):
                n_held += held_flat[d, e, i] != zero
            held_any[d] = n_held > 0
        for k in range(K):
            s = t * K + k
            d = ix[k, 3]
            for r in range(R * held_any[d]):  # RLC: bytes held since s - rlc_delay are back
                for a in range(A):
                    if usable[e, r, a]:  # (a lost message's vanish)
                        unsched[e, r, a] += held[d, e, r, a]
                    held[d, e, r, a] = zero
            held_any[d] = False
            b, c = rx_of_slot[k], est_of_slot[k]
            p, g = ix[k, 0], ix[k, 1]
            for r in range(R):
                if not hq_active[p, e, r] and gr_tbs[g, e, r] == zero:
                    _idle(e, r, k, p, g, ix, consts, harq, grants, unsched, known, outstanding, avg_thr,
                          sr_occasion, counts)
                    continue
                granted = _granted_sinr(e, r, b, g, rx, est_x, gr_sb, scratch)
                is_new, nack, tb_bytes, sendable = _send(e, r, k, s, ix, ints, consts, bler_b, nf, msgs, harq,
                                                         grants, rx[b], nack_below, counts, content, is_sb,
                                                         terms, granted)
                if is_new:  # OLLA on first transmissions
                    step_db = consts[1] if nack else -consts[2]
                    olla_db[e, r] = min(max(olla_db[e, r] + step_db, -consts[3]), consts[3])
                avg_thr[e, r] = _fma(consts[4], tb_bytes - avg_thr[e, r], avg_thr[e, r])  # ATen's lerp
                # BSR with a TB on a grant; an SR at the robot's occasion if nothing is known or granted.
                tbs = gr_tbs[ix[k, 1], e, r]
                outstanding[e, r] -= tbs
                left = sendable - tb_bytes
                if tbs > zero:
                    known[e, r] = max(left - outstanding[e, r], zero)
                if (sr_occasion[ix[k, 5], r] and left > zero and known[e, r] <= zero
                        and outstanding[e, r] <= zero):
                    known[e, r] = consts[5]
                    counts[6, e, r] += 1
            est = (est_x[c, e], est_se[c, e], est_order[c, e], est_cap[c, e], est_max_sb[c, e])
            _grant(e, k, c, ix, ints, consts, sel_db, tbs_per_sb, nf, floor_db, harq, grants, known,
                   outstanding, olla_db, avg_thr, est, scratch)


@numba.njit(cache=True, error_model="numpy", _nrt=False)
def _open_kernel(t, t_now, consts, send, msg_bytes, q_old, q_cap, msgs_old, msgs, unsched, bytes_,
                 finish_slot, usable, kpis, keep):
    """The start of step ``t`` (``t_now``: the level's device counter, the generation step of a message
    captured now): the base class's capture into ``q_cap`` (the queue ``q_old`` plus a message where
    ``send`` and not full; ``(bytes, size, gen, length)``, ``[E, R(, F)]``), the queue in age order
    (:func:`~.l2_legacy.messages_by_age`: ``bytes_``, ``usable`` ``[E, R, A]``), the per-message fields
    ``msgs_old`` of the messages gone cleared into ``msgs`` (``L2State.forget``; :data:`PER_MESSAGE`),
    the bytes not yet in a TB nor held by RLC (``unsched``), ``finish_slot`` -1; ``kpis`` rows
    ``offered`` and ``overflow``. ``keep``: scratch ``[E * R * A]``."""
    qb_old, qs_old, qg_old, ql_old = q_old
    qb, qs, qg, ql = q_cap
    E, R, F = qb.shape
    A = bytes_.shape[2]
    zero, one = consts[0] - consts[0], consts[0] / consts[0]
    for e in range(E):
        for r in range(R):
            n = ql_old[e, r]
            for j in range(F):
                qb[e, r, j], qs[e, r, j], qg[e, r, j] = qb_old[e, r, j], qs_old[e, r, j], qg_old[e, r, j]
            is_full = n >= F
            kpis[0, e, r] = one if send[e, r] else zero
            kpis[4, e, r] = one if send[e, r] and is_full else zero
            if send[e, r] and not is_full:  # captured at the tail
                qb[e, r, n], qs[e, r, n], qg[e, r, n] = msg_bytes[e, r], msg_bytes[e, r], t_now
                n += 1
            ql[e, r] = n
            for a in range(A):
                bytes_[e, r, a], usable[e, r, a], finish_slot[e, r, a] = zero, False, -1
            for j in range(n):  # whole bytes, at index A - 1 - age
                a = A - 1 - (t - qg[e, r, j])
                bytes_[e, r, a], usable[e, r, a] = np.ceil(qb[e, r, j]), True
    _forget(zero, one, msgs_old, msgs, unsched, bytes_, usable, keep)


@numba.njit(cache=True, inline="always", error_model="numpy", _nrt=False)
def _forget(zero, one, msgs_old, msgs, unsched, bytes_, usable, keep):
    """``msgs_old`` times the 0/1 mask of the live messages (``usable``) into ``msgs`` (the values of
    ``L2State.forget``), ``unsched`` from them, ``bytes_`` +inf where no message is. Every field flat,
    ``[n]`` or ``[D or P, n]`` (``n = E * R * A``), in memory order, ``keep`` ``[n]`` the mask as 0/1
    in the level's dtype: loops the compiler vectorises."""
    n = bytes_.size
    pending_old, rlc_old, round_old = msgs_old[0].reshape(n), msgs_old[2].reshape(n), msgs_old[3].reshape(n)
    held_old, content_old = msgs_old[1].reshape(-1, n), msgs_old[4].reshape(-1, n)
    pending, rlc_cnt, round_slot = msgs[0].reshape(n), msgs[2].reshape(n), msgs[3].reshape(n)
    held, content = msgs[1].reshape(-1, n), msgs[4].reshape(-1, n)
    bytes_f, unsched_f, usable_f = bytes_.reshape(-1), unsched.reshape(-1), usable.reshape(-1)
    for i in range(n):
        keep[i] = one if usable_f[i] else zero
        keep_n = 1 if usable_f[i] else 0
        pending[i] = pending_old[i] * keep[i]
        rlc_cnt[i], round_slot[i] = rlc_old[i] * keep_n, round_old[i] * keep_n
        unsched_f[i] = bytes_f[i] - pending[i]
    for d in range(held.shape[0]):  # (whole bytes: the sum over the ring is exact in any order)
        for i in range(n):
            held[d, i] = held_old[d, i] * keep[i]
            unsched_f[i] -= held[d, i]
    for p in range(content.shape[0]):
        for i in range(n):
            content[p, i] = content_old[p, i] * keep[i]
    for i in range(n):
        if not usable_f[i]:  # +inf: can no longer complete
            bytes_f[i] = np.inf


@numba.njit(cache=True, error_model="numpy", _nrt=False)
def _close_kernel(t, t_now, consts, step_times, deadline, watts, q_cap, q_new, fresh_old, fresh_gen, msgs,
                  unsched, bytes_, finish_slot, usable, counts, counters, kpis, rows, lanes):
    """The end of step ``t``: the bytes in HARQ carried on (``pending``), then the base class's
    bookkeeping (``L2-legacy``'s ``_close_step`` and ``DiscreteLevel._step``): deliveries, their delays
    and bytes, timeouts and RLC losses, the queue ``q_cap`` compacted into ``q_new``, the freshest
    delivery ``fresh_gen`` (from ``fresh_old``), every per-message field one step older, the step's
    ``counts`` added to ``counters``, and the rest of ``kpis`` (``[len(KPI_KEYS), E, R]``).
    ``step_times``: ``(slot_s, step_s)`` in the level's dtype; ``watts`` ``[E, R]`` transmit power;
    ``rows``, ``lanes``: :func:`_close_queue`'s."""
    E, R, A = bytes_.shape
    n = bytes_.size
    pending, held = msgs[0].reshape(n), msgs[1].reshape(-1, n)  # flat, in memory order
    bytes_f, unsched_f, usable_f, finish_f = (bytes_.reshape(n), unsched.reshape(n), usable.reshape(n),
                                              finish_slot.reshape(n))
    zero = consts[0] - consts[0]
    slot_s = step_times[0]
    for i in range(n):  # what a message still has in HARQ: not acked, not to resend, not held
        b = bytes_f[i] if usable_f[i] and finish_f[i] < 0 else zero
        bytes_f[i] = b
        pending[i] = b - unsched_f[i]
    for d in range(held.shape[0]):  # (whole bytes: exact in any order)
        for i in range(n):
            pending[i] -= held[d, i]
    for e in range(E):
        for r in range(R):
            _close_queue(e, r, t, t_now, zero, step_times, deadline, q_cap, q_new, fresh_old, fresh_gen,
                         bytes_, finish_slot, usable, kpis, rows, lanes)
            kpis[5, e, r] = t_now + 1 - fresh_gen[e, r]  # AoI at the end of the step
            kpis[6, e, r] = watts[e, r] * (step_times.dtype.type(counts[-1, e, r]) * slot_s)
            for c in range(len(counters)):
                counters[c][e, r] += counts[c, e, r]
    _age(msgs[0].reshape(-1), A, zero)  # every per-message field one step older (L2State.aged)
    _age(msgs[1].reshape(-1), A, zero)
    _age(msgs[4].reshape(-1), A, zero)
    _age(msgs[2].reshape(-1), A, 0)
    _age(msgs[3].reshape(-1), A, 0)


@numba.njit(cache=True, inline="always", error_model="numpy", _nrt=False)
def _close_queue(e, r, t, t_now, zero, step_times, deadline, q_cap, q_new, fresh_old, fresh_gen, bytes_,
                 finish_slot, usable, kpis, rows, lanes):
    """Robot ``r`` of env ``e`` at the end of step ``t``: each queued message delivered (its delay and
    bytes), dropped (its deadline reached, or lost by RLC) or kept, oldest first, in ``q_new``; the
    freshest delivery; ``kpis`` rows ``delivered``, ``delay_sum``, ``timeouts``, ``throughput`` and
    ``queued_msgs``. The delays and bytes summed over the queue as the eager step does (in the queue's
    layout, 0 where not delivered, in ATen's order: ``rows`` ``[3, max(F, 4 lanes)]`` scratch)."""
    qb, qs, qg, ql = q_cap
    nb, ns, ng, nl = q_new
    A, F = bytes_.shape[2], qb.shape[2]
    slot_s, step_s, as_dt = step_times[0], step_times[1], step_times.dtype.type
    delivered, timeouts, kept = 0, 0, 0
    fresh = fresh_old[e, r]
    for j in range(F):
        rows[0, j], rows[1, j] = zero, zero
    for j in range(ql[e, r]):
        gen = qg[e, r, j]
        a = A - 1 - (t - gen)
        if finish_slot[e, r, a] >= 0:  # delivered in slot finish_slot
            # in the level's dtype, as the eager step: age + (finish_slot + 1) * slot_s / step_s
            finish_s = as_dt(finish_slot[e, r, a] + 1) * slot_s
            rows[0, j] = as_dt(t_now - gen) + finish_s / step_s
            rows[1, j] = qs[e, r, j]
            delivered += 1
            fresh = max(fresh, gen)
        elif not usable[e, r, a] or t_now - gen + 1 >= deadline[e, r]:
            timeouts += 1
        else:
            nb[e, r, kept], ns[e, r, kept], ng[e, r, kept] = bytes_[e, r, a], qs[e, r, j], gen
            kept += 1
    for j in range(kept, F):
        nb[e, r, j], ns[e, r, j], ng[e, r, j] = zero, zero, 0
    nl[e, r] = kept
    fresh_gen[e, r] = fresh
    delay_sum, size_sum = _aten_sum(rows[0, :F], lanes, rows[2]), _aten_sum(rows[1, :F], lanes, rows[2])
    kpis[1, e, r], kpis[2, e, r], kpis[3, e, r] = delivered, delay_sum, timeouts
    kpis[7, e, r], kpis[8, e, r] = size_sum / step_s, kept


@numba.njit(cache=True, inline="always", error_model="numpy", _nrt=False)
def _age(x, A, zero):
    """Each row ``[A]`` of ``x`` (flat, ``[n * A]``) one step older (``L2State.aged``): index ``a`` takes
    ``a + 1``'s value, the newest is empty. (One shift of the whole array, then the newest of each row
    emptied: what crosses a row's end is overwritten.)"""
    for i in range(x.shape[0] - 1):
        x[i] = x[i + 1]
    for i in range(A - 1, x.shape[0], A):
        x[i] = zero


def available(device: torch.device) -> bool:
    """The kernel runs on the CPU only (numpy views of the tensors)."""
    return device.type == "cpu"


def constants(level) -> dict:
    """What every step of ``level`` passes the kernel besides the state, as numpy arrays."""
    l2, cfg, dt = level.l2, level.cfg, level.dtype
    # The eager OLLA step, torch.where(nack, up_db, -down_db) of two Python numbers, is a tensor of the
    # default dtype: the same values here.
    step_db = torch.tensor([l2.olla_up_db, l2.olla_down_db], dtype=torch.get_default_dtype()).tolist()
    values = {"bler_c": level._bler_c, "olla_up_db": step_db[0], "olla_down_db": step_db[1],
              "olla_max_db": l2.olla_max_db, "pf_weight": 1.0 - l2.pf_beta,
              "sr_grant_bytes": l2.sr_grant_bytes,
              "avg_floor": 1e-3, "sinr_floor_lin": 1e-30, "ten": 10.0}
    # ATen's SIMD width in its sum (lanes added lane by lane): 256 bits, on AVX-512 machines too (the
    # sum kernel is registered without an AVX-512 variant, so ATen runs its AVX2 one there).
    lanes = 32 // dt.itemsize
    ints = {"num_slots": cfg.num_slots, "harq_rtt": l2.harq_rtt_slots, "k2": l2.k2_slots,
            "rlc_ring": l2.rlc_delay_slots + 1, "rlc_delay": l2.rlc_delay_slots,
            "harq_max_tx": l2.harq_max_tx,
            "rlc_max_retx": l2.rlc_max_retx, "sr_period": l2.sr_period_slots, "pf_rounds": l2.pf_rounds,
            "simd_lanes": lanes}
    return {
        "ints": np.array([0] + [ints[k] for k in INTS[1:]], dtype=np.int64),
        "scratch": _scratch(level, lanes),  # the step kernel's work arrays (each written before it is read)
        **_step_arrays(level),
        "rings": {},  # _ring_entries' memo
        "rows": np.empty((3, max(cfg.buffer_msgs, 4 * lanes)), torch.empty(0, dtype=dt).numpy().dtype),
        "consts": torch.tensor([values[k] for k in CONSTS], dtype=dt).numpy(),
        # The slot and the step, s, as the eager step's tensor arithmetic rounds them (to its dtype).
        "step_times": torch.tensor([cfg.slot_s, cfg.step_s], dtype=dt).numpy(),
        "tables": tuple(x.detach().cpu().clone().numpy() for x in (
            level._bler_b, level._sel_db, level._tbs_per_sb,
            torch.arange(cfg.num_subbands + 1, dtype=dt), level._sr_occasion)),
    }


def _step_arrays(level) -> dict:
    """What :func:`step` passes its kernels besides the level's state, each written before it is read and
    none kept by the level: ``work`` (``unsched``, ``bytes_`` ``[E, R, A]``, ``finish_slot``, ``usable``),
    the queue after capture ``q_cap`` (``bytes``, ``size``, ``gen`` ``[E, R, F]``, ``length`` ``[E, R]``),
    ``keep`` (:func:`_forget`'s) and the step's ``counts`` ``[len(COUNTS), E, R]``."""
    E, R, A, F = level.E, level.R, level.cfg.timeout_steps, level.cfg.buffer_msgs
    dt = torch.empty(0, dtype=level.dtype).numpy().dtype
    return {"work": (np.empty((E, R, A), dt), np.empty((E, R, A), dt), np.empty((E, R, A), np.int64),
                     np.empty((E, R, A), np.bool_)),
            "q_cap": (np.empty((E, R, F), dt), np.empty((E, R, F), dt), np.empty((E, R, F), np.int64),
                      np.empty((E, R), np.int64)),
            "keep": np.empty(E * R * A, dt), "counts": np.empty((len(COUNTS), E, R), np.int64)}


def _scratch(level, lanes: int) -> tuple:
    """The work arrays of :func:`_step_kernel` (its ``scratch``; :func:`_grant` names them)."""
    R, A, S, dt = level.R, level.cfg.timeout_steps, level.cfg.num_subbands, level.dtype
    dt, K2 = torch.empty(0, dtype=dt).numpy().dtype, level.l2.k2_slots
    return (np.empty((R, S), dt), np.empty(R, np.int64), np.empty(S, np.bool_), np.empty((R, S), np.bool_),
            np.empty(R, np.int64), np.empty(S, np.int64), np.empty(S + 4 * lanes, dt), np.empty(A, dt),
            np.empty(S, np.bool_), np.empty(level.l2.rlc_delay_slots + 1, np.bool_), np.empty(R, np.int64),
            np.empty(R, dt), np.empty(R, np.int64), np.empty((K2, R), dt), np.empty((K2, R), np.int64))


def _ring_entries(l2, t: int, K: int, memo: dict) -> np.ndarray:
    """Per slot ``s`` of step ``t`` (``[K, 6]`` int64): its HARQ process ``s % P``, its grant ``s % K2``,
    the process of the slot it grants for ``(s + K2) % P``, the RLC entries of ``s`` and of
    ``s + rlc_delay_slots``, its SR occasion ``s % sr_period_slots``. A function of ``t K`` modulo the
    rings' common period: kept in ``memo`` by it (a few hundred entries at most)."""
    P, K2, D = l2.harq_rtt_slots, l2.k2_slots, l2.rlc_delay_slots + 1
    key = (t * K) % math.lcm(P, K2, D, l2.sr_period_slots)
    if key not in memo:
        s = key + np.arange(K, dtype=np.int64)
        memo[key] = np.stack([s % P, s % K2, (s + K2) % P, s % D, (s + l2.rlc_delay_slots) % D,
                              s % l2.sr_period_slots], 1)
    return memo[key]


def estimates(level, xs: list) -> tuple:
    """The part of the level's :class:`~.l2_legacy.Estimate` the kernel reads for each channel estimate
    ``xs`` of the step (``[E, R, S]`` each, in the order their blocks start): ``(x, se, order, cap,
    max_sb)``, each ``[len(xs), E, R(, S)]``, computed as the eager loop does. The step's last is kept:
    the next step's first slots use the same fading block, the same numbers when the SNR is the same (a
    function of the channel's values only, so reused when they are equal). The others are computed
    together (the same numbers: every op is elementwise or per row, and ATen's log2 the same at any
    position in a tensor), one set of ops a step rather than one a block."""
    last = getattr(level, "_last_estimate", None)  # each [1, E, R(, S)]
    n_kept = int(last is not None and last[0].shape[1:] == xs[0].shape and torch.equal(last[0][0], xs[0]))
    parts = _estimate(level, torch.stack(xs[n_kept:])) if len(xs) > n_kept else last
    if n_kept and len(xs) > 1:
        parts = tuple(torch.cat(pair) for pair in zip(last, parts, strict=True))
    level._last_estimate = tuple(p[-1:] for p in parts)
    return parts


def _estimate(level, x_est: torch.Tensor) -> tuple:
    """:func:`estimates`'s numbers, computed for the channels ``x_est`` ``[n, E, R, S]``."""
    se_est = torch.log2(1.0 + x_est).clamp_(max=level._se_max)
    S = se_est.shape[-1]
    if S <= SORT_BY_INSERTION_MAX:  # torch's order, ties included, at a fraction of its cost
        order = torch.empty(se_est.shape, dtype=torch.long)
        _argsort_descending(se_est.reshape(-1, S).numpy(), order.view(-1, S).numpy())
    else:
        order = torch.argsort(se_est, dim=-1, descending=True, stable=True)
    cap, max_sb = mech.capacity_by_subbands(x_est.mean(-1), level._bytes_per_sb_se, level._se_max,
                                            level._gap_lin, level._min_sinr_lin, level.cfg.num_subbands)
    return x_est, se_est, order, cap, max_sb


@numba.njit(cache=True, error_model="numpy", _nrt=False)
def _argsort_descending(x, order):
    """``order[i]`` (``[N, S]`` int64): the indices of row ``x[i]`` by decreasing value, equal values by
    index (the stable order: ``torch.argsort(descending=True, stable=True)``). By rank: element
    ``a`` goes after every greater element and every equal one before it (compares, no branches)."""
    N, S = x.shape
    for i in range(N):
        row = x[i]
        for a in range(S):
            key, rank = row[a], 0
            for b in range(a):
                rank += row[b] >= key
            for b in range(a + 1, S):
                rank += row[b] > key
            order[i, rank] = a


def step(level, send, msg_bytes, snr_db, tx_dbm, deadline) -> dict:
    """``level``'s control step (``DiscreteLevel._step``: capture, service, ageing, timeouts, KPIs) with
    its bookkeeping in :func:`_open_kernel` and :func:`_close_kernel` around the slot loop
    :func:`_step_kernel`: the eager step's draws and events. Inputs as ``DiscreteLevel._step``'s,
    ``[E, R]`` each; :output: the KPI dict, ``[E, R]`` each."""
    inputs, t, t_now = level._slot_inputs, level.t, int(level.t_now)
    if t != t_now:  # the kernels index the rings by both, unchecked: a mismatch writes out of bounds
        raise RuntimeError(f"L2-legacy's step counters disagree: t = {t}, t_now = {t_now} (load_state sets "
                           "both from the state; set level.t only together with level.t_now)")
    work, q_cap = inputs["work"], inputs["q_cap"]  # the step's own arrays, kept from step to step
    # What the kernels write and the level keeps is this step's own (a state() taken before keeps its
    # values) but for the rings and the counters, written in place as in the eager step; each contiguous
    # (one signature).
    q = level.queue
    q_old = tuple(x.contiguous() for x in (q.bytes, q.size, q.gen, q.length))
    q_new = tuple(torch.empty_like(x) for x in q_old)  # the queue after the step
    st = {k: v.contiguous() for k, v in level.l2_state.tensors().items()}
    msgs_old = tuple(st[k] for k in PER_MESSAGE)
    st.update({k: torch.empty_like(st[k]) for k in PER_MESSAGE})
    st.update({k: st[k].clone() for k in L2StateView.OWN})
    msgs = _np(st[k] for k in PER_MESSAGE)
    for k, v in level.counters.items():
        level.counters[k] = v.contiguous()
    kpis = torch.empty(len(KPI_KEYS), level.E, level.R, dtype=level.dtype)
    kpis_np = kpis.numpy()
    _open_kernel(t, t_now, inputs["consts"], send.contiguous().numpy(), msg_bytes.contiguous().numpy(),
                 _np(q_old), q_cap, _np(msgs_old), msgs, *work, kpis_np, inputs["keep"])
    counts = _slots(level, t, snr_db, st, work)
    fresh_gen = torch.empty_like(level.fresh_gen)
    _close_kernel(t, t_now, inputs["consts"], inputs["step_times"], deadline.contiguous().numpy(),
                  radio.dbm_to_w(tx_dbm).contiguous().numpy(), q_cap, _np(q_new),
                  level.fresh_gen.contiguous().numpy(), fresh_gen.numpy(), msgs, *work, counts,
                  _np(level.counters[k] for k in COUNTS[:-1]), kpis_np, inputs["rows"], inputs["ints"][-1])
    level.queue, level.fresh_gen, level.l2_state = Queue(*q_new), fresh_gen, L2State(**st)
    level.t, level.t_now = t + 1, level.t_now + 1
    return dict(zip(KPI_KEYS, kpis.unbind(0), strict=True))


def _np(tensors) -> tuple:
    """numpy views of CPU tensors."""
    return tuple(x.numpy() for x in tensors)


def _slots(level, t: int, snr_db: torch.Tensor, st: dict, work: tuple) -> np.ndarray:
    """The slot loop of step ``t``: the step's draws, the channel and the estimates in torch (the eager
    order), then :func:`_step_kernel` on ``st`` (the :class:`~.l2_legacy.L2State` fields by name) and
    ``work`` (``unsched``, ``bytes_``, ``finish_slot``, ``usable``). :output: ``counts``
    ``[len(COUNTS), E, R]`` int64."""
    inputs, cfg = level._slot_inputs, level.cfg
    snr3 = radio.db_to_lin(snr_db).unsqueeze(-1)  # [E, R, 1] full power in one subband
    uniforms, new_blocks = level._draw_step(t)
    nack_below = -torch.logit(uniforms)  # [K, E, R]: NACK iff c ln(sinr) + b[mcs] < this
    # (the channels of the estimates only: estimates() computes them together)
    rx, rx_of_slot, est_x, est_of_slot = level._channel_blocks(t, snr3, new_blocks, estimate=_channel_only)
    est = estimates(level, est_x)  # x, se, order, cap, max_sb
    counts = inputs["counts"]
    counts.fill(0)
    ints = inputs["ints"]
    ints[0] = t
    _step_kernel(ints, _ring_entries(level.l2, t, cfg.num_slots, inputs["rings"]), inputs["consts"],
                 *inputs["tables"], nack_below.numpy(), torch.stack(rx).numpy(), rx_of_slot,
                 *(x.numpy() for x in est), est_of_slot, *work,
                 *(st[f].numpy() for f in L2StateView.KERNEL_FIELDS), counts, inputs["scratch"])
    return counts


def _channel_only(level, x_est: torch.Tensor) -> torch.Tensor:
    """``_channel_blocks``'s ``estimate``: the estimate's channel itself (:func:`estimates` does the rest)."""
    return x_est


class L2StateView:
    """How the kernel sees an :class:`~.l2_legacy.L2State`: the fields it reads and writes, in its
    argument order."""

    KERNEL_FIELDS = ("rlc_cnt", "round_slot", "held", "hq_active", "hq_content", "hq_sb", "hq_mcs", "hq_acc",
                     "hq_ntx", "hq_first", "gr_sb", "gr_mcs", "gr_tbs", "known", "outstanding", "olla_db",
                     "avg_thr")
    OWN = ("known", "outstanding", "olla_db", "avg_thr")  # [E, R], copied per step (written in place)
