"""L2-legacy's slot as one compiled kernel: the level's ``slot_loop="compiled"`` (docs/design.md §2).

Below a few hundred cells an eager L2-legacy slot is per-op overhead: about 190 small torch ops
a slot, 40 slots a step. Here the body of a slot (RLC return, transmission and HARQ feedback,
delivery, RLC failure, HARQ, OLLA, PF average, BSR, SR and the PF grant) is one pure function,
:func:`slot`, that calls the same mechanisms as the eager loop (:mod:`.l2_legacy`,
:mod:`.l2_mechanisms`) and is compiled once for every E by a :class:`~isaac_net.core._kernels.Kernel`
(kept in the library's kernel store: a warm process traces nothing). What the eager loop decides on
the host (whether an RLC slot holds bytes, whether a TB failed, whether the slot is an SR occasion)
the kernel computes for every slot: the skipped work changes no value. The random numbers of a step
(BLER uniforms, fading blocks) are drawn outside, by the level's generator in its order, and so are
the gNB's estimates (once per fading block).

The rings of the state (HARQ processes, grants, RLC) are held as lists of tensors for the step:
a slot reads and replaces whole entries, and the step stacks them back into the level's
:class:`~.l2_legacy.L2State`, so ``state``, ``load_state`` and ``reset`` see the same fields as the
eager loop.
"""

from __future__ import annotations

import math

import torch

from isaac_net.core import radio
from isaac_net.core._kernels import Kernel, own_storage
from isaac_net.core.levels import l2_mechanisms as mech
from isaac_net.core.levels.l2_legacy import (
    Grant,
    Harq,
    L2State,
    buffer_report,
    deliver,
    harq_next,
    messages_by_age,
    rlc_failure,
    scheduling_request,
    transmit,
)

# The float constants of a slot, in this order, as one 1-d tensor of the level's dtype.
CONSTS = ("bler_c", "harq_max_tx", "rlc_max_retx", "olla_up_db", "olla_down_db", "olla_max_db", "pf_weight",
          "sr_grant_bytes")
# The per-robot counts a slot adds to (``counts`` ``[len(COUNTS), E, R]``): the level's counters
# and the transmitting slots (the energy).
COUNTS = ("tx_first", "nack_first", "tx_retx", "harq_fail", "rlc_retx", "rlc_lost", "sr", "tx_slots")
HARQ_FIELDS = Harq._fields
GRANT_FIELDS = Grant._fields


@torch.library.custom_op("isaac_net::l2_pf_average", mutates_args=())
def pf_average(avg_thr: torch.Tensor, tb_bytes: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The PF average's EWMA, ``torch.lerp`` with the weight as a number, as the eager loop calls it:
    an op of its own in the kernel, since ATen's lerp rounds once per element (a fused multiply-add)
    and inductor's twice."""
    return torch.lerp(avg_thr, tb_bytes, float(weight))


@pf_average.register_fake
def _(avg_thr, tb_bytes, weight):
    return torch.empty_like(avg_thr)


def slot(consts, unsched, bytes_, finish_slot, usable, rlc_cnt, round_slot, held_now, held_then,
         hq_active, hq_content, hq_sb, hq_mcs, hq_acc, hq_ntx, hq_first, then_active, then_sb,
         gr_sb, gr_mcs, gr_tbs, known, outstanding, olla_db, avg_thr, counts, rx_now, nack_below,
         sr_occasion, est_x, est_se, est_rank, est_weight, est_cap, est_max_sb, slot_no,
         bler_b, sel_db, tbs_per_sb, keep_table, out_table, rounds):
    """One UL slot ``s`` of L2-legacy, every env and robot at once: the eager loop's body
    (:meth:`~.l2_legacy.NetL2Legacy._serve_eager`) with the envs last, so that the kernel's loops run
    over the envs (the robots, messages and subbands are a few each).

    :input consts: ``[len(CONSTS)]``. :input slot_no: ``[3]`` long: ``s``, the slot the bytes of a
        HARQ failure come back in (``s + rlc_delay_slots``), and ``k + 1`` (``k`` the slot in the step).
    :input unsched, bytes_, finish_slot, usable, rlc_cnt, round_slot: ``[R, A, E]`` per message, as
        in the eager loop; ``held_now``, ``held_then``: the RLC ring's entries of slots ``s`` and
        ``s + rlc_delay_slots``.
    :input hq_*: ``[R(, A | S), E]`` the HARQ process of slot ``s``; ``then_active``, ``then_sb``: that
        of the grant's slot ``s + k2_slots``. :input gr_*: the grant of slot ``s``.
    :input known, outstanding, olla_db, avg_thr, nack_below: ``[R, E]``. :input counts:
        ``[len(COUNTS), R, E]``. :input rx_now: ``[R, S, E]``. :input sr_occasion: ``[R, 1]`` bool.
    :input est_*: the gNB's :class:`~.l2_legacy.Estimate` that the grant reads, ``[R(, S), E]``.
    :input bler_b, sel_db, tbs_per_sb: ``[M]``; keep_table, out_table: :func:`~.l2_mechanisms.pf_tables`;
        ``rounds``: ``[pf_rounds]`` (only its size is read).
    :output: the inputs from ``unsched`` to ``counts`` after the slot, in their order (``held_now``
        emptied, the HARQ process of slot ``s`` and the grant for slot ``s + k2_slots`` in place of
        those of slot ``s``).
    """
    bler_c, harq_max_tx, rlc_max_retx, olla_up, olla_down, olla_max, pf_weight, sr_bytes = consts.unbind()
    s, s_return, k1 = slot_no.unbind()
    ax = -2  # the messages' and subbands' dimension
    # RLC: bytes held since s - rlc_delay_slots are back (those of a lost message vanish).
    unsched = unsched + torch.where(usable, held_now, 0.0)

    # Transmission: the retransmission due now, or a new TB on the grant of slot s.
    hq = Harq(hq_active, hq_content, hq_sb, hq_mcs, hq_acc, hq_ntx, hq_first)
    tx = transmit(unsched, hq, Grant(gr_sb, gr_mcs, gr_tbs), rx_now, nack_below, bler_c, bler_b, harq_max_tx,
                  axis=ax)
    unsched = unsched - tx.take
    bytes_, finish_slot = deliver(bytes_, finish_slot, tx, k1 - 1, axis=ax)

    # HARQ failure: RLC resends the bytes after rlc_delay_slots, or the message is lost.
    first = torch.where(tx.is_new, s, hq.first)
    is_lost, is_round, requeue = rlc_failure(tx, first, usable, round_slot, rlc_cnt, rlc_max_retx, axis=ax)
    usable = usable ^ is_lost
    bytes_ = bytes_.masked_fill(is_lost, math.inf)
    unsched = unsched.masked_fill(is_lost, 0.0)
    rlc_cnt = rlc_cnt + is_round
    round_slot = torch.where(is_round, s_return, round_slot)
    held_then = held_then + tx.content * requeue
    hq_new = harq_next(tx, first, axis=ax)

    olla_db = mech.olla_update(olla_db, tx.is_new, tx.nack, olla_up, olla_down, olla_max)
    avg_thr = pf_average(avg_thr, tx.tb_bytes, pf_weight)
    known, outstanding, left = buffer_report(known, outstanding, gr_tbs, tx)
    is_sr, known = scheduling_request(sr_occasion, left, known, outstanding, sr_bytes)

    # Grant for slot s + K2 (K2 < RTT: its retransmissions are known now): as l2_legacy.grant, whose
    # allocation already runs with the envs last.
    need = mech.subbands_needed(known.masked_fill(then_active, 0.0), est_cap, est_max_sb, dim=1)
    metric = est_se / avg_thr.clamp(min=1e-3).unsqueeze(1)
    is_free = mech.as_uint8(then_sb).amax(0) == 0  # [S, E]
    order = mech.PfOrder(est_rank, est_weight, None)
    alloc = mech.pf_allocate_envs_last(metric, need, is_free, rounds.shape[0], order,
                                       tables=(keep_table, out_table))
    n_alloc = mech.count_true(alloc, 1).to(known.dtype)
    eff_est = mech.effective_sinr_lin(est_x / n_alloc.clamp(min=1).unsqueeze(1), alloc, n_alloc, dim=1)
    mcs = mech.select_mcs(10.0 * torch.log10(eff_est.clamp(min=1e-30)), olla_db, sel_db)
    new = Grant(sb=alloc, mcs=mcs, tbs=torch.floor(n_alloc * torch.take(tbs_per_sb, mcs)))
    known = (known - new.tbs).clamp(min=0)
    outstanding = outstanding + new.tbs

    events = (tx.is_new, tx.nack & tx.is_new, tx.is_retx, tx.fail, mech.count_true(is_round, ax),
              mech.count_true(is_lost, ax), is_sr, tx.is_tx)
    counts = counts + torch.stack([e.to(counts.dtype) for e in events])
    return (unsched, bytes_, finish_slot, usable, rlc_cnt, round_slot, torch.zeros_like(held_now), held_then,
            *hq_new, *new, known, outstanding, olla_db, avg_thr, counts)


# The envs are the last dimension of every argument of rank 2 and more but these. Scalar loops: on
# this graph (masks, gathers, few robots, messages and subbands each) inductor's vectorised C++
# measured several times slower than its scalar C++ (docs/design.md §2).
SLOT = Kernel(slot, dims={"consts": None, "sr_occasion": None, "slot_no": None}, inductor={"cpp.simdlen": 1})


def supports(level) -> bool:
    """Whether the compiled slot serves this level's configuration: an RLC ring of two slots or more
    (``rlc_delay_slots >= 1``: a slot's two ring entries are apart) and the PF keep table (at most
    16 subbands)."""
    return level.l2.rlc_delay_slots >= 1 and level.cfg.num_subbands <= 16


def constants(level) -> dict:
    """What every slot of ``level`` passes the kernel besides the state: its constants and tables,
    each a tensor of its own."""
    l2, dt, dev = level.l2, level.dtype, level.device
    # The eager OLLA step, torch.where(nack, up_db, -down_db) of two Python numbers, is a tensor of the
    # default dtype: the same values here.
    step_db = torch.tensor([l2.olla_up_db, l2.olla_down_db], dtype=torch.get_default_dtype()).tolist()
    values = {"bler_c": level._bler_c, "harq_max_tx": l2.harq_max_tx, "rlc_max_retx": l2.rlc_max_retx,
              "olla_up_db": step_db[0], "olla_down_db": step_db[1], "olla_max_db": l2.olla_max_db,
              "pf_weight": 1.0 - l2.pf_beta, "sr_grant_bytes": l2.sr_grant_bytes}
    keep, out = mech.pf_tables(level.cfg.num_subbands, dt, dev)
    return {
        "consts": torch.tensor([values[k] for k in CONSTS], dtype=dt, device=dev),
        "sr_rows": [row.reshape(-1, 1).clone() for row in level._sr_occasion],
        "tables": (level._bler_b.clone(), level._sel_db.clone(), level._tbs_per_sb.clone(), keep.clone(),
                   out.clone(), torch.zeros(l2.pf_rounds, dtype=torch.uint8, device=dev)),
    }


def _last(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Envs-first to the kernel's layout: dimension ``dim`` (the envs) moved last, contiguous."""
    return x.movedim(dim, -1).contiguous()


def _first(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The kernel's layout back to envs first (at ``dim``), contiguous."""
    return x.movedim(-1, dim).contiguous()


def serve(level, q, ctx):
    """``level``'s step through the compiled slot (:meth:`~.l2_legacy.NetL2Legacy._serve_eager`'s loop,
    the same draws and events)."""
    cfg, l2, dev = level.cfg, level.l2, level.device
    E, R, A, K = level.E, level.R, cfg.timeout_steps, cfg.num_slots
    P, K2, delay = l2.harq_rtt_slots, l2.k2_slots, l2.rlc_delay_slots
    t = ctx.t
    inputs = level._slot_inputs

    idx, bytes_, live = messages_by_age(q, t, A)
    st = level.l2_state.forget(~live)
    D = st.held.shape[0]
    unsched = bytes_ - st.pending - st.held.sum(0)  # bytes not yet in any TB nor held by RLC
    bytes_ = bytes_.masked_fill(~live, math.inf)  # +inf: can no longer complete
    finish_slot = torch.full((R, A, E), -1, dtype=torch.long, device=dev)
    per_msg = [_last(x) for x in (unsched, bytes_, live, st.rlc_cnt, st.round_slot)]
    unsched, bytes_, usable, rlc_cnt, round_slot = per_msg
    known, outstanding, olla, avg = (_last(x) for x in (st.known, st.outstanding, st.olla_db, st.avg_thr))
    counts = torch.zeros(len(COUNTS), R, E, dtype=level.dtype, device=dev)
    # The rings as lists of entries (the slot replaces whole entries).
    held = list(_last(st.held, 1).unbind(0))
    harqs = list(zip(*(_last(getattr(st, f"hq_{f}"), 1).unbind(0) for f in HARQ_FIELDS), strict=True))
    grants = list(zip(*(_last(getattr(st, f"gr_{f}"), 1).unbind(0) for f in GRANT_FIELDS), strict=True))

    snr3 = radio.db_to_lin(ctx.snr_db).unsqueeze(-1)  # [E, R, 1] full power in one subband
    uniforms, block_starts, new_blocks = level._draw_step(t)
    # [R, E] a slot: NACK iff c ln(sinr) + b[mcs] < this
    nack_below = _last(-torch.logit(uniforms), 1).unbind(0)
    slot_nos = torch.tensor([[t * K + k, t * K + k + delay, k + 1] for k in range(K)], device=dev).unbind(0)
    graph = rx_seen = est_seen = None
    for k, s, rx, est in level._slot_channels(t, snr3, block_starts, new_blocks):
        if rx is not rx_seen:  # a new fading block: the kernel's layout once
            rx_seen, rx_now = rx, mech.to_envs_last(rx)  # [R, S, E]
        if est is not est_seen:
            est_seen = est
            est_args = (mech.to_envs_last(est.x), est.se_t, est.pf_order.rank, est.pf_order.weight, est.cap_t,
                        est.max_sb_t)
        hq, then, gr = harqs[s % P], harqs[(s + K2) % P], grants[s % K2]
        args = (inputs["consts"], unsched, bytes_, finish_slot, usable, rlc_cnt, round_slot, held[s % D],
                held[(s + delay) % D], *hq, then[0], then[2], *gr, known, outstanding, olla, avg, counts,
                rx_now,
                nack_below[k], inputs["sr_rows"][s % l2.sr_period_slots], *est_args, slot_nos[k],
                *inputs["tables"])
        if graph is None or dev.type != "cpu":
            # The kernel reads its inputs from their data pointers as contiguous: on the CPU a
            # contiguous view reads the same; elsewhere (alignment) each input gets storage of its own.
            args = tuple(own_storage(a) for a in args)
            graph = SLOT.graph(*args)
        out = graph(*args)
        unsched, bytes_, finish_slot, usable, rlc_cnt, round_slot = out[:6]
        held[s % D], held[(s + delay) % D] = out[6:8]
        harqs[s % P], grants[s % K2] = out[8:15], out[15:18]
        known, outstanding, olla, avg, counts = out[18:]

    counts = _first(counts, 1)  # [len(COUNTS), E, R]
    for key, c in zip(COUNTS, counts, strict=True):
        if key in level.counters:
            level.counters[key] += c
    rings = {f"hq_{f}": _first(torch.stack([h[i] for h in harqs]), 1) for i, f in enumerate(HARQ_FIELDS)}
    rings.update({f"gr_{f}": _first(torch.stack([g[i] for g in grants]), 1)
                  for i, f in enumerate(GRANT_FIELDS)})
    unsched, bytes_, finish_slot, usable, rlc_cnt, round_slot = (
        _first(x) for x in (unsched, bytes_, finish_slot, usable, rlc_cnt, round_slot))
    st = L2State(**{**st.tensors(), **rings, "held": _first(torch.stack(held), 1), "rlc_cnt": rlc_cnt,
                    "round_slot": round_slot, "known": _first(known), "outstanding": _first(outstanding),
                    "olla_db": _first(olla), "avg_thr": _first(avg)})
    return level._close_step(q, st, idx, live, usable, bytes_, unsched, finish_slot,
                             counts[COUNTS.index("tx_slots")])
