"""L2-legacy: the packet-level uplink level, slot by slot (docs/design.md §2 "L2-legacy").

Per UL slot ``s`` (absolute index ``t * K + k``), for every env and robot at once:

1. **Fading.** Rayleigh block fading ``g[e, r, b] ~ Exp(1)`` per robot and subband
   (independent across subbands and robots), a new block every ``coh_slots``; the gNB's
   estimate is the channel ``est_delay_slots`` old (so ``est_delay + k2`` old when used).
2. **RLC.** Bytes of a TB whose HARQ failed come back to the robot's buffer
   ``rlc_delay_slots`` after the failure (at the earliest the next slot).
3. **Transmission.** A robot sends either the HARQ retransmission due now (a TB NACKed
   ``harq_rtt_slots`` ago: synchronous, non-adaptive, same subbands and MCS, the LTE-UL
   "legacy" HARQ; its subbands are reserved) or a new TB on the grant the gNB issued
   ``k2_slots`` ago. A new TB takes the oldest bytes not already in a TB or held by RLC
   (whole bytes; several messages may share a TB; a grant with nothing to send is skipped).
   The per-subband SINR is ``snr * g / n`` (power split over its ``n`` subbands), the TB's
   effective SINR the Shannon MIESM over them (:func:`~.l2_mechanisms.effective_sinr_lin`),
   chase combining adds it over the transmissions, and ``u < BLER(mcs, sinr)`` with a fresh
   uniform is a NACK (:func:`~.l2_mechanisms.bler`; tested here in the equivalent logit form).
   ACK: its bytes leave the queue. A message is delivered at the end of the slot whose
   ACKed TB carried its last outstanding byte, even if an older message still has bytes in
   HARQ (out-of-order delivery, as PDCP allows). NACK: retransmit after the RTT, or after
   ``harq_max_tx`` transmissions hand the bytes to RLC. RLC counts retransmission rounds per
   message: a failed TB first sent before the message's last RLC return joins that round,
   one sent after it starts a new round; a message needing more than ``rlc_max_retx``
   rounds is lost (counted as a timeout) and its bytes still in flight are dropped.
   OLLA moves on the feedback of first transmissions; the PF average on new-TB bytes.
4. **SR/BSR.** Each new TB carries a BSR (the bytes left after it, less those already
   granted), taken as received with the TB's first transmission (a robust MAC CE); the gNB
   schedules only what it knows of. A robot with unreported data and nothing known or
   granted sends an SR at its next occasion (every ``sr_period_slots``, offset
   ``r % sr_period_slots`` for robot ``r``) and the gNB assumes ``sr_grant_bytes`` until the
   first BSR. So an isolated message waits ``w_SR + k2`` slots for its first TB, and another
   ``k2`` for the rest if it did not fit the SR grant.
5. **Grant** for slot ``s + k2_slots`` (``k2 < harq_rtt``: the retransmissions due then are
   known): the subbands they leave free are allocated subband by subband by PF
   (:func:`~.l2_mechanisms.pf_allocate`; metric: the SE at full power in one subband from
   the stale estimate, over the EWMA throughput), each robot up to the subbands its known
   buffer needs at the estimated mean SINR, capped by power headroom
   (:func:`~.l2_mechanisms.subbands_needed`); the MCS is the highest whose threshold is at
   most the estimated effective SINR over the granted subbands minus the OLLA offset.

Energy: a robot that transmits in a slot (new TB or retransmission) sends at its full
power for the whole slot, ``min(n, 1) * slot_s = slot_s`` as in L1.

Common random numbers: every draw comes from one ``torch.Generator`` seeded at
construction, in a fixed order and shape that depends only on ``(E, R, t)``: the first
fading blocks at construction, then per step the BLER uniforms ``[K, E, R]`` and the new
fading blocks ``[n, E, R, S]``. Two engines with the same seed see the same fading and
uniforms whatever their inputs and decisions. The generator runs on through ``reset``
(a reset env keeps drawing from the same stream); build a fresh engine to repeat a run.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing

import numpy as np
import torch

from isaac_net.core import radio
from isaac_net.core.config import CALIBRATION_ONLY
from isaac_net.core.levels import l2_mechanisms as mech
from isaac_net.core.levels.base import DiscreteLevel, Queue, Service, StepContext


@dataclasses.dataclass(frozen=True)
class L2LegacyConfig:
    """Constants of L2-legacy, 3GPP-typical. Frozen: build another with ``dataclasses.replace``.

    Slots are the UL slots of :class:`~isaac_net.core.config.CellConfig` (0.5 ms by default).
    """

    sr_period_slots: int = 10  # SR periodicity, slots (5 ms; TS 38.331 SchedulingRequestResourceConfig)
    k2_slots: int = 4  # grant-to-PUSCH delay K2, slots (TS 38.214 §6.1.2.1; typical 2-4 at 30 kHz)
    sr_grant_bytes: float = 256.0  # buffer the gNB assumes after an SR, before the first BSR, B (small grant)
    harq_rtt_slots: int = 8  # HARQ round trip: NACKed TB resent this many slots later (8 processes)
    harq_max_tx: int = 4  # transmissions per TB incl. the first (maxHARQ-Tx, TS 38.321), chase combining
    rlc_delay_slots: int = 20  # RLC AM retransmission delay after a HARQ failure, slots (status report)
    rlc_max_retx: int = 2  # RLC retransmissions per message, then lost (maxRetxThreshold, TS 38.322)
    olla_target_bler: float = 0.1  # OLLA first-transmission BLER target (TS 38.214 CQI target)
    olla_up_db: float = 1.0  # OLLA step on a NACK, dB; the step on an ACK is up * T / (1 - T)
    olla_max_db: float = 10.0  # OLLA offset clamp, ±dB
    mcs_se: tuple = mech.NR_MCS_SE  # SE per MCS, b/s/Hz (TS 38.214 Table 5.1.3.1-1, 64QAM)
    bler_gap_db: float = 2.0  # SINR gap to Shannon at 10 % BLER, dB (LDPC, TBs of a few hundred bytes)
    bler_slope_db: float = 0.5  # logistic BLER slope, dB: 90 % -> 10 % over 2 ln 9 * slope ≈ 2.2 dB
    coh_slots: int = 20  # Rayleigh block-fading coherence, slots (10 ms ≈ 0.42 / f_D at ~3 m/s, 3.5 GHz)
    est_delay_slots: int = 2  # age of the gNB's channel estimate (SRS) when it schedules, slots
    pf_beta: float = 0.98  # PF EWMA forgetting factor per slot (time constant 50 slots)
    pf_avg_init_bytes: float = 1.0  # PF average throughput at reset, B/slot (new robots come first)
    pf_rounds: int = 3  # PF allocation rounds per slot (each settles >= 1 subband while demand remains)

    def __post_init__(self) -> None:
        ints = {"sr_period_slots": 1, "k2_slots": 1, "harq_rtt_slots": 1, "harq_max_tx": 1,
                "rlc_delay_slots": 0, "rlc_max_retx": 0, "coh_slots": 1, "est_delay_slots": 0,
                "pf_rounds": 1}
        for name, lo in ints.items():
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= lo):
                raise ValueError(f"L2LegacyConfig.{name} must be an integer >= {lo}, got {v!r}")
        if self.harq_rtt_slots <= self.k2_slots:
            raise ValueError(f"L2LegacyConfig.harq_rtt_slots must exceed k2_slots={self.k2_slots} (the gNB "
                             f"must know a retransmission when it grants), got {self.harq_rtt_slots}")
        positive = ("sr_grant_bytes", "olla_max_db", "bler_slope_db", "pf_avg_init_bytes")
        for name in positive:
            v = getattr(self, name)
            if not (_real(v) and math.isfinite(v) and v > 0):
                raise ValueError(f"L2LegacyConfig.{name} must be a finite number > 0, got {v!r}")
        for name in ("olla_up_db", "bler_gap_db"):
            v = getattr(self, name)
            if not (_real(v) and math.isfinite(v) and v >= 0):
                raise ValueError(f"L2LegacyConfig.{name} must be a finite number >= 0, got {v!r}")
        if not (_real(self.olla_target_bler) and 0 < self.olla_target_bler < 1):
            raise ValueError(
                f"L2LegacyConfig.olla_target_bler must be in (0, 1), got {self.olla_target_bler!r}")
        if not (_real(self.pf_beta) and 0 <= self.pf_beta < 1):
            raise ValueError(f"L2LegacyConfig.pf_beta must be in [0, 1), got {self.pf_beta!r}")
        se = tuple(self.mcs_se) if hasattr(self.mcs_se, "__iter__") else ()
        if not (len(se) >= 1 and all(_real(x) and math.isfinite(x) and x > 0 for x in se)):
            raise ValueError(
                f"L2LegacyConfig.mcs_se must be a non-empty tuple of finite SE > 0, got {self.mcs_se!r}")

    @property
    def olla_down_db(self) -> float:
        """OLLA step on an ACK, dB: ``up * T / (1 - T)`` so the stationary BLER is ``T``."""
        return self.olla_up_db * self.olla_target_bler / (1.0 - self.olla_target_bler)


def _input_copy(x):
    """A step input kept for :meth:`NetL2Legacy.checked_inputs`' memo: a tensor copied (detached), else
    as is."""
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def _same_input(x, kept) -> bool:
    """Whether the step input ``x`` is the one ``kept`` (:func:`_input_copy`, of a checked input: None, a
    number or a real tensor) to the bit: both None, numbers of one type, value and sign, or tensors of one
    dtype, shape and device with the same bits (-0.0 is not 0.0)."""
    if isinstance(kept, torch.Tensor):
        return (isinstance(x, torch.Tensor) and x.dtype == kept.dtype and x.shape == kept.shape
                and x.device == kept.device and torch.equal(_bits(x), _bits(kept)))
    if type(x) is not type(kept):
        return False
    return x is None or (x == kept and math.copysign(1, x) == math.copysign(1, kept))


def _bits(x: torch.Tensor) -> torch.Tensor:
    """A real tensor's bits: floats as the integers of their width (a view of the same bytes)."""
    if not x.is_floating_point():
        return x
    return x.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def _real(v) -> bool:
    """A real number, not a bool (``True`` is an int to Python, not a dB value)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


# The slot loops: "numba" (a step in numba kernels, its slots one, _l2_numba; the CPU's default) and "eager"
# (torch ops, host-side branches skip rare work on the CPU; any device). The same events from one seed.
SLOT_LOOPS = ("numba", "eager")
COUNTER_KEYS = ("tx_first", "nack_first", "tx_retx", "harq_fail", "rlc_retx", "rlc_lost", "sr")


def _state_field(env_dim: int, per_message: bool = False):
    """A field of :class:`L2State`: its env dimension (0, or 1 behind a ring of slots) and whether
    its last dimension indexes the messages by age (it then ages with the queue)."""
    return dataclasses.field(metadata={"env_dim": env_dim, "per_message": per_message})


@dataclasses.dataclass
class L2State:
    """What L2-legacy carries from one step to the next besides the queue and the channel.

    Per message in age order: last index ``j = A - 1 - age`` (oldest first, FIFO order). Rings
    of slots: HARQ process ``p`` serves the slots ``s`` with ``s % P == p``, the grant of slot
    ``u`` lives at ``u % K2``, bytes RLC resends in slot ``u`` at ``u % D``
    (``D = rlc_delay_slots + 1``). ``reset_envs``, ``aged`` and ``forget`` walk the fields.
    """

    pending: torch.Tensor = _state_field(0, per_message=True)  # [E, R, A] bytes in TBs in HARQ
    held: torch.Tensor = _state_field(1, per_message=True)  # [D, E, R, A] bytes waiting for RLC
    rlc_cnt: torch.Tensor = _state_field(0, per_message=True)  # [E, R, A] long, RLC rounds so far
    round_slot: torch.Tensor = _state_field(0, per_message=True)  # [E, R, A] long, last round's return
    hq_active: torch.Tensor = _state_field(1)  # [P, E, R] bool, a TB waits for its retransmission
    hq_content: torch.Tensor = _state_field(1, per_message=True)  # [P, E, R, A] bytes of each message
    hq_sb: torch.Tensor = _state_field(1)  # [P, E, R, S] bool, the TB's subbands
    hq_mcs: torch.Tensor = _state_field(1)  # [P, E, R] long
    hq_acc: torch.Tensor = _state_field(1)  # [P, E, R] chase-combined SINR, linear
    hq_ntx: torch.Tensor = _state_field(1)  # [P, E, R] long, transmissions so far
    hq_first: torch.Tensor = _state_field(1)  # [P, E, R] long, slot of the TB's first transmission
    gr_sb: torch.Tensor = _state_field(1)  # [K2, E, R, S] bool, granted subbands
    gr_mcs: torch.Tensor = _state_field(1)  # [K2, E, R] long
    gr_tbs: torch.Tensor = _state_field(1)  # [K2, E, R] granted TB size, bytes
    outstanding: torch.Tensor = _state_field(0)  # [E, R] bytes granted, not yet sent
    known: torch.Tensor = _state_field(0)  # [E, R] the gNB's view of the robot's ungranted buffer, B
    olla_db: torch.Tensor = _state_field(0)  # [E, R] OLLA offset, dB
    avg_thr: torch.Tensor = _state_field(0)  # [E, R] PF average throughput, B/slot

    @classmethod
    def initial(cls, E: int, R: int, cfg, l2: L2LegacyConfig, dtype: torch.dtype, device) -> "L2State":
        """The state of a fresh env: nothing queued, granted or in HARQ; the PF average at its start."""
        A, S, P, K2 = cfg.timeout_steps, cfg.num_subbands, l2.harq_rtt_slots, l2.k2_slots
        D = l2.rlc_delay_slots + 1
        z = dict(dtype=dtype, device=device)
        zl = dict(dtype=torch.long, device=device)
        zb = dict(dtype=torch.bool, device=device)
        return cls(
            pending=torch.zeros(E, R, A, **z), held=torch.zeros(D, E, R, A, **z),
            rlc_cnt=torch.zeros(E, R, A, **zl), round_slot=torch.zeros(E, R, A, **zl),
            hq_active=torch.zeros(P, E, R, **zb), hq_content=torch.zeros(P, E, R, A, **z),
            hq_sb=torch.zeros(P, E, R, S, **zb), hq_mcs=torch.zeros(P, E, R, **zl),
            hq_acc=torch.zeros(P, E, R, **z), hq_ntx=torch.zeros(P, E, R, **zl),
            hq_first=torch.zeros(P, E, R, **zl),
            gr_sb=torch.zeros(K2, E, R, S, **zb), gr_mcs=torch.zeros(K2, E, R, **zl),
            gr_tbs=torch.zeros(K2, E, R, **z),
            outstanding=torch.zeros(E, R, **z), known=torch.zeros(E, R, **z), olla_db=torch.zeros(E, R, **z),
            avg_thr=torch.full((E, R), l2.pf_avg_init_bytes, **z),
        )

    def harq(self, p: int) -> Harq:
        """HARQ process ``p`` (views into the rings)."""
        return Harq(self.hq_active[p], self.hq_content[p], self.hq_sb[p], self.hq_mcs[p], self.hq_acc[p],
                    self.hq_ntx[p], self.hq_first[p])

    def grant(self, u: int) -> Grant:
        """The grant of slot ``u`` (views into the rings)."""
        i = u % self.gr_tbs.shape[0]
        return Grant(self.gr_sb[i], self.gr_mcs[i], self.gr_tbs[i])

    def tensors(self) -> dict:
        """The fields by name (no copy)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def reset_envs(self, env_mask: torch.Tensor, initial: "L2State") -> "L2State":
        """This state with the envs of ``env_mask`` (``[E]`` bool) set to ``initial``'s values."""
        out = {}
        for f in dataclasses.fields(self):
            x = getattr(self, f.name)
            shape = [1] * x.dim()
            shape[f.metadata["env_dim"]] = -1
            out[f.name] = torch.where(env_mask.view(shape), getattr(initial, f.name), x)
        return L2State(**out)

    def aged(self) -> "L2State":
        """Every message one step older: index ``j`` moves to ``j - 1``; the newest index is empty."""
        return self._per_message(lambda x: torch.nn.functional.pad(x[..., 1:], (0, 1)))

    def forget(self, is_gone: torch.Tensor) -> "L2State":
        """The per-message fields cleared where ``is_gone`` (``[E, R, A]``): a message gone from the
        queue (delivered, timed out, lost) leaves nothing behind."""
        # A product with the 0/1 mask: the values of masked_fill (the fields are finite and >= 0, or
        # integers) at a fraction of its cost on the CPU.
        keep = {}
        return self._per_message(lambda x: x * keep.setdefault(x.dtype, (~is_gone).to(x.dtype)))

    def _per_message(self, fn) -> "L2State":
        fields = [f.name for f in dataclasses.fields(self) if f.metadata["per_message"]]
        return dataclasses.replace(self, **{name: fn(getattr(self, name)) for name in fields})


class Harq(typing.NamedTuple):
    """One HARQ process of every robot (row ``p`` of :class:`L2State`'s ``hq_*`` rings)."""

    active: torch.Tensor  # [E, R] bool
    content: torch.Tensor  # [E, R, A] bytes of each message in the TB
    sb: torch.Tensor  # [E, R, S] bool
    mcs: torch.Tensor  # [E, R] long
    acc: torch.Tensor  # [E, R] chase-combined SINR, linear
    ntx: torch.Tensor  # [E, R] long
    first: torch.Tensor  # [E, R] long, slot of the first transmission


class Grant(typing.NamedTuple):
    """The grant of one slot for every robot (row ``u % K2`` of the ``gr_*`` rings)."""

    sb: torch.Tensor  # [E, R, S] bool
    mcs: torch.Tensor  # [E, R] long
    tbs: torch.Tensor  # [E, R] bytes


class Tx(typing.NamedTuple):
    """What each robot sent in a slot and the HARQ feedback it got. ``[E, R]`` unless noted."""

    is_retx: torch.Tensor  # bool, the HARQ retransmission due now
    is_new: torch.Tensor  # bool, a new TB on the grant
    is_tx: torch.Tensor  # bool, either
    take: torch.Tensor  # [E, R, A] bytes a new TB takes from each message
    tb_bytes: torch.Tensor  # bytes of the new TB (0 without one)
    sendable: torch.Tensor  # bytes not yet in any TB nor held by RLC, before the TB
    sb: torch.Tensor  # [E, R, S] bool, subbands of the transmission
    acc: torch.Tensor  # chase-combined SINR, linear
    mcs: torch.Tensor  # long
    nack: torch.Tensor  # bool
    ntx: torch.Tensor  # long, transmissions of the TB so far, this one included
    fail: torch.Tensor  # bool, NACK at the last transmission: the bytes go to RLC
    content: torch.Tensor  # [E, R, A] bytes of each message in the TB


def messages_by_age(q: Queue, t_now: torch.Tensor, A: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The queue in age order (index ``A - 1 - age``, oldest first) at step ``t_now`` (0-d long).

    :output: ``idx`` ``[E, R, F]`` each queue entry's index (``A`` past the queue's length),
        whole unserved bytes ``[E, R, A]`` and ``live`` ``[E, R, A]`` bool.
    """
    E, R, _ = q.bytes.shape
    valid = q.valid
    idx = torch.where(valid, A - 1 - (t_now - q.gen), A)
    bytes_ = torch.zeros(E, R, A + 1, dtype=q.bytes.dtype, device=q.bytes.device).scatter_(
        -1, idx, torch.where(valid, torch.ceil(q.bytes), 0.0))[..., :A]
    live = torch.zeros(E, R, A + 1, dtype=torch.bool, device=q.bytes.device).scatter_(-1, idx, valid)[..., :A]
    return idx, bytes_, live


def transmit(unsched: torch.Tensor, hq: Harq, gr: Grant, rx_now: torch.Tensor, nack_below: torch.Tensor,
             bler_c: float, bler_b: torch.Tensor, harq_max_tx: int, *, axis: int = -1) -> Tx:
    """The retransmission due now or a new TB on the grant, and its HARQ feedback.

    A new TB takes the oldest ``unsched`` bytes (``[E, R, A]``) up to the grant's size; the SINR
    of its ``n`` subbands is ``rx_now / n`` (``[E, R, S]``, full power in one subband), combined
    with the earlier transmissions of the TB; NACK iff ``bler_c ln(acc) + bler_b[mcs] < nack_below``
    (``[E, R]``; ``u < BLER`` in logit form). As the level keeps them, a robot with a retransmission
    due has no grant (its known buffer is 0 when the gNB grants) and an idle process no subbands.

    ``axis``: the messages' and subbands' dimension (-1; -2 for a layout with the envs last,
    ``[R, A, E]`` and ``[R, S, E]``). Likewise in :func:`deliver`, :func:`rlc_failure` and
    :func:`harq_next`.
    """
    is_retx = hq.active.clone()  # the caller overwrites the process
    cum = unsched.cumsum(axis)
    take = (gr.tbs.unsqueeze(axis) - cum).add_(unsched).clamp_(min=0)
    take = torch.minimum(take, unsched, out=take)  # FIFO
    tb_bytes = take.sum(axis)
    is_new = tb_bytes > 0
    is_tx = is_retx | is_new
    sb = hq.sb | gr.sb  # either the retransmission's subbands or the grant's (see above)
    n_sb = mech.count_true(sb, axis).clamp_(min=1).to(rx_now.dtype)
    acc = hq.acc + mech.effective_sinr_lin(rx_now / n_sb.unsqueeze(axis), sb, n_sb, dim=axis)  # chase
    mcs = torch.where(is_retx, hq.mcs, gr.mcs)
    # The log of a robot that sends nothing (acc 0, slow to take) is not used: log(1) in its place.
    nack = ((bler_c * torch.log(torch.where(is_tx, acc, 1.0)) + torch.take(bler_b, mcs)) < nack_below) & is_tx
    ntx = hq.ntx + 1
    return Tx(is_retx=is_retx, is_new=is_new, is_tx=is_tx, take=take, tb_bytes=tb_bytes,
              sendable=cum.select(axis, -1), sb=sb, acc=acc, mcs=mcs, nack=nack, ntx=ntx,
              fail=nack & (ntx >= harq_max_tx), content=hq.content + take)


def deliver(bytes_: torch.Tensor, finish_slot: torch.Tensor, tx: Tx,
            k: int, *, axis: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """ACK: the TB's bytes leave the queue; a message is delivered in slot ``k`` with its last byte.

    :input bytes_: ``[E, R, A]`` unacked bytes (+inf: can no longer complete).
    :input finish_slot: ``[E, R, A]`` long, the delivery slot (-1: not yet); updated in place.
    """
    ack = tx.is_tx ^ tx.nack
    # TB contents are finite and >= 0: a product with the 0/1 mask is torch.where(ack, content, 0).
    bytes_ = bytes_ - tx.content * ack.unsqueeze(axis)
    is_done = bytes_ <= 0
    # A message is done once (its bytes are +inf after): -1 + (k + 1) sets its slot, cheaper than masked_fill.
    return bytes_.masked_fill_(is_done, math.inf), finish_slot.add_(is_done, alpha=k + 1)


def rlc_failure(tx: Tx, first: torch.Tensor, usable: torch.Tensor, round_slot: torch.Tensor,
                rlc_cnt: torch.Tensor, rlc_max_retx: int, *,
                axis: int = -1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which messages of a failed TB RLC resends, in a new round or lost. All ``[E, R, A]`` bool.

    A failed TB first sent (``first`` ``[E, R]``) before the message's last RLC return belongs to
    that round; one sent after it starts a new round; a message beyond ``rlc_max_retx`` rounds is lost.

    :output: ``(is_lost, is_round, requeue)``: lost, a new round, bytes to resend.
    """
    failed = (tx.content > 0) & tx.fail.unsqueeze(axis) & usable
    new_round = failed & (first.unsqueeze(axis) >= round_slot)
    is_lost = new_round & (rlc_cnt >= rlc_max_retx)
    return is_lost, new_round ^ is_lost, failed ^ is_lost


def harq_next(tx: Tx, first: torch.Tensor, *, axis: int = -1) -> Harq:
    """The process after the slot: a NACKed TB short of its last transmission waits for the RTT."""
    keep = tx.nack ^ tx.fail
    # Products with the 0/1 mask in place of torch.where(keep, x, 0) and sb & keep: the same values
    # (contents and SINRs are finite and >= 0) at a fraction of the cost on the CPU.
    return Harq(active=keep, content=tx.content * keep.unsqueeze(axis),
                sb=mech.as_bool(mech.as_uint8(tx.sb) * mech.as_uint8(keep).unsqueeze(axis)),
                mcs=tx.mcs, acc=tx.acc * keep, ntx=tx.ntx * keep, first=first)


def buffer_report(known: torch.Tensor, outstanding: torch.Tensor, tbs: torch.Tensor,
                  tx: Tx) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """BSR with the TB on a grant of ``tbs`` bytes: the bytes left, less those already granted.

    :output: ``(known, outstanding, left)`` ``[E, R]``, ``left`` the bytes not yet in a TB.
    """
    outstanding = outstanding - tbs
    left = tx.sendable - tx.tb_bytes
    return torch.where(tbs > 0, (left - outstanding).clamp(min=0), known), outstanding, left


def scheduling_request(is_occasion: torch.Tensor, left: torch.Tensor, known: torch.Tensor,
                       outstanding: torch.Tensor,
                       sr_bytes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SR: unreported data and nothing known or granted, at the robot's occasion (``[R]`` bool).

    :output: ``(is_sr, known)`` ``[E, R]``: the gNB assumes ``sr_bytes`` after an SR.
    """
    is_sr = is_occasion & (left > 0) & (known <= 0) & (outstanding <= 0)
    return is_sr, torch.where(is_sr, sr_bytes, known)


class Estimate(typing.NamedTuple):
    """The gNB's view of the channel from its (stale) estimate, per block."""

    x: torch.Tensor  # [E, R, S] SINR with the full power in one subband, linear
    se: torch.Tensor  # [E, R, S] spectral efficiency at full power in one subband, capped
    order: torch.Tensor  # [E, R, S] subbands by decreasing se (PF ranks them the same way)
    cap: torch.Tensor  # [E, R, S] TB capacity with 1..S subbands, bytes
    max_sb: torch.Tensor  # [E, R] long, the power-headroom limit on the subbands
    # The same with the envs last, for the allocation (l2_mechanisms.pf_allocate_envs_last).
    se_t: torch.Tensor  # [R, S, E]
    pf_order: mech.PfOrder  # [R, S, E] each
    cap_t: torch.Tensor  # [R, S, E]
    max_sb_t: torch.Tensor  # [R, E] long


def grant(est: Estimate, known: torch.Tensor, avg_thr: torch.Tensor, olla_db: torch.Tensor, hq_then: Harq,
          pf_rounds: int, sel_db: torch.Tensor, tbs_per_sb: torch.Tensor, *,
          stop_early: bool) -> tuple[Grant, torch.Tensor, torch.Tensor]:
    """The grant for a later slot on the subbands that slot's retransmissions (the HARQ process
    ``hq_then``) leave free: PF subband by subband, up to what each robot's known buffer needs
    (``known`` ``[E, R]``); the MCS from the estimate less the OLLA offset (``olla_db``).

    :output: ``(grant, need, metric)``, ``need`` ``[E, R]`` long, ``metric`` ``[E, R, S]``.
    """
    # The allocation with the envs last (the same integers and floats as in [E, R, S]).
    # (Transposed [E, R] operands made contiguous first: a strided operand costs more at large E.)
    known_t = known.masked_fill(hq_then.active, 0.0).t().contiguous()  # [R, E]
    need_t = mech.subbands_needed(known_t, est.cap_t, est.max_sb_t, dim=1)
    metric_t = est.se_t / avg_thr.clamp(min=1e-3).t().contiguous().unsqueeze(1)
    is_free_t = mech.as_uint8(mech.to_envs_last(hq_then.sb)).amax(0) == 0  # [S, E]
    alloc_t = mech.pf_allocate_envs_last(metric_t, need_t, is_free_t, pf_rounds, est.pf_order,
                                         stop_early=stop_early)
    alloc = mech.to_envs_first(alloc_t)
    n_alloc = mech.count_true(alloc_t, 1).t().to(known.dtype, memory_format=torch.contiguous_format)
    eff_est = mech.effective_sinr_lin(est.x / n_alloc.clamp(min=1).unsqueeze(-1), alloc, n_alloc)
    mcs = mech.select_mcs(10.0 * torch.log10(eff_est.clamp(min=1e-30)), olla_db, sel_db)
    return (Grant(sb=alloc, mcs=mcs, tbs=torch.floor(n_alloc * torch.take(tbs_per_sb, mcs))), need_t.t(),
            metric_t.permute(2, 0, 1))


@dataclasses.dataclass
class _EagerRun:
    """The running tensors of the eager slot loop within one step (``NetL2Legacy._eager_slot`` moves
    them on by one slot). Per message ``[E, R, A]``, per robot ``[E, R]``; ``held`` ``[D, E, R, A]``,
    ``rlc_cnt`` is written in place, the HARQ and grant rings through ``harqs`` and
    ``grants`` (views of ``st``'s rings)."""

    st: L2State
    held: torch.Tensor
    rlc_cnt: torch.Tensor
    round_slot: torch.Tensor
    unsched: torch.Tensor  # bytes not yet in any TB nor held by RLC
    bytes_: torch.Tensor  # unacked bytes, +inf: can no longer complete
    usable: torch.Tensor  # bool, not lost by RLC
    finish_slot: torch.Tensor  # long, the delivery slot (-1: not yet)
    known: torch.Tensor
    outstanding: torch.Tensor
    olla: torch.Tensor
    avg: torch.Tensor
    is_held: list  # per RLC ring slot: may hold bytes
    harqs: list
    grants: list
    no_msgs: torch.Tensor  # [E, R, A] False
    no_robots: torch.Tensor  # [E, R] False
    log: dict  # per-slot events, for NetL2Legacy._count
    is_tx_by_slot: list


class NetL2Legacy(DiscreteLevel):
    """L2-legacy level: SR/BSR, PF per subband, fading, BLER, OLLA, HARQ and RLC (module doc).

    Besides the step KPIs, ``counters`` holds cumulative ``[E, R]`` tensors (reset with the
    env): ``tx_first`` new TBs, ``nack_first`` their NACKs, ``tx_retx`` HARQ retransmissions,
    ``harq_fail`` TBs handed to RLC, ``rlc_retx`` message retransmissions by RLC,
    ``rlc_lost`` messages lost by RLC, ``sr`` scheduling requests. ``l2_state`` holds the
    :class:`L2State`, ``gains`` the fading ring ``[H, E, R, S]``. Setting ``trace`` to a
    list makes each slot append a dict of its tensors (for tests; off by default; the eager loop
    runs then).

    ``slot_loop``: ``"numba"`` (the default on the CPU) runs each control step's slot loop as one numba
    kernel and its bookkeeping as two more (:mod:`._l2_numba`; ``make_engine(..., backend="numba")``);
    ``"eager"`` (the default elsewhere) runs each slot as torch ops. The same events from the same seed
    (docs/design.md §2).
    """

    name = "L2-legacy"

    def __init__(self, E: int, R: int, device="cpu", *, cfg=None, dtype=torch.float32,
                 seed: int | None = None, l2_cfg: L2LegacyConfig | None = None, slot_loop: str | None = None):
        super().__init__(E, R, device, cfg=cfg, dtype=dtype, seed=seed)
        if slot_loop is None:  # the numba kernel where it runs (the CPU), else eager torch ops
            slot_loop = "numba" if self.device.type == "cpu" else "eager"
        if slot_loop not in SLOT_LOOPS:
            raise ValueError(f"slot_loop: expected one of {', '.join(SLOT_LOOPS)}, got {slot_loop!r}")
        self.l2 = l2_cfg if l2_cfg is not None else L2LegacyConfig()
        if not isinstance(self.l2, L2LegacyConfig):
            raise TypeError(f"l2_cfg: expected an L2LegacyConfig, got {type(self.l2).__name__}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed: expected an integer or None, got {seed!r}")
        cfg, l2, dev = self.cfg, self.l2, self.device
        if cfg.is_calibrated:  # the ground truth the constants are fitted to has none of its own
            got = {name: getattr(cfg, name) for name in CALIBRATION_ONLY}
            raise ValueError(f"cfg: L2-legacy takes no calibration constants ({', '.join(CALIBRATION_ONLY)} "
                             f"are effective physics of the fluid levels); got {got}")
        S = cfg.num_subbands

        self.generator = torch.Generator(device=dev)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

        # Tables.
        se = torch.tensor(l2.mcs_se, dtype=torch.float64)
        self._thr_db = mech.mcs_thresholds_db(se, l2.bler_gap_db).to(dtype).to(dev)
        self._sel_db = mech.selection_bounds_db(self._thr_db)
        self._bytes_per_sb_se = cfg.subband_hz * cfg.slot_s / 8.0
        self._tbs_per_sb = (se * self._bytes_per_sb_se).to(dtype).to(dev)  # [M] bytes per subband
        self._se_max = float(max(l2.mcs_se))
        self._gap_lin = 10.0 ** (l2.bler_gap_db / 10.0)
        self._min_sinr_lin = 10.0 ** (float(self._thr_db[0]) / 10.0)
        # The BLER draw u < bler(mcs, sinr) in logit form: c ln(sinr_lin) + b[mcs] < -logit(u)
        # (the same test as mech.bler, fewer kernels per slot).
        self._bler_c = 10.0 / (math.log(10.0) * l2.bler_slope_db)
        self._bler_b = math.log(9.0) - self._thr_db / l2.bler_slope_db  # [M]
        # 0-d constants (a Python scalar in torch.where costs a conversion per call).
        self._zero = torch.zeros((), dtype=dtype, device=dev)
        self._sr_bytes = torch.full((), l2.sr_grant_bytes, dtype=dtype, device=dev)
        # On the CPU a branch on a tensor costs no device sync, so rare work can be skipped.
        self._host_branches = self.device.type == "cpu"
        # Slot k of the step is slot t_now * K + k: the absolute slots the state keeps as values (a TB's
        # first transmission, an RLC round's return) come from the device counter, as in a captured step.
        self._slot_in_step = torch.arange(cfg.num_slots, device=dev)
        r = torch.arange(R, device=dev)
        self._sr_occasion = (torch.arange(l2.sr_period_slots, device=dev).unsqueeze(1)
                             == (r % l2.sr_period_slots).unsqueeze(0))  # [period, R]
        self._has_occasion = [bool(x) for x in self._sr_occasion.any(1).tolist()]
        # Fading: a ring of the last H blocks covers both the current block and the
        # estimate's block (at most ceil(est_delay / coh) blocks back).
        self._num_blocks = -(-l2.est_delay_slots // l2.coh_slots) + 1
        self.gains = mech.rayleigh_power((self._num_blocks, E, R, S), self.generator, dtype, dev)
        self.l2_state = L2State.initial(E, R, cfg, l2, dtype, dev)
        self.counters = {k: torch.zeros(E, R, dtype=dtype, device=dev) for k in COUNTER_KEYS}
        self.trace: list | None = None
        # The last step's inputs but send, as given (bit-exact copies), and as checked: checked_inputs' memo.
        self._inputs_memo: tuple | None = None
        self.slot_loop = slot_loop
        if slot_loop == "numba":
            from isaac_net.core.levels import _l2_numba

            if not _l2_numba.available(self.device):
                raise ValueError(f"slot_loop: 'numba' runs on the CPU, got device={self.device}; "
                                 "use slot_loop='eager'")
            self._slot_inputs = _l2_numba.constants(self)

    # ------------------------------------------------------------------ capture (levels/graphed.py)
    @property
    def capturable(self) -> bool:
        """The eager slot loop can be captured (the numba one runs on the CPU)."""
        return self.slot_loop == "eager"

    @property
    def not_capturable_because(self) -> str:
        return (f"runs its slot loop {self.slot_loop!r} on the CPU" if self.slot_loop != "eager"
                else super().not_capturable_because)

    def prepare_capture(self) -> None:
        """No host-side branches on tensor values (they skip rare work on the CPU; the same events)."""
        self._host_branches = False

    def graph_phase(self, t: int) -> int:
        """What the eager step chooses on the host from ``t`` (ring rows, SR occasions, fading block
        starts) repeats with the slot ``t K`` modulo the rings' common period: one graph per phase."""
        return (t * self.cfg.num_slots) % self._period_slots

    @property
    def graph_period_steps(self) -> int:
        return self._period_slots // math.gcd(self._period_slots, self.cfg.num_slots)

    @property
    def _period_slots(self) -> int:
        """The common period of the slot rings, SR occasions and fading ring, slots."""
        l2 = self.l2
        return math.lcm(l2.harq_rtt_slots, l2.k2_slots, l2.rlc_delay_slots + 1, l2.sr_period_slots,
                        l2.coh_slots * self._num_blocks)

    def draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next step's random numbers from the level's generator (:meth:`_draw_step`)."""
        return self._draw_step(self.t)

    # ------------------------------------------------------------------ state
    def _reset_level(self, env_mask: torch.Tensor) -> None:
        fresh = L2State.initial(self.E, self.R, self.cfg, self.l2, self.dtype, self.device)
        self.l2_state = self.l2_state.reset_envs(env_mask, fresh)
        for x in self.counters.values():
            x[env_mask] = 0

    def _age_level(self) -> None:
        self.l2_state = self.l2_state.aged()

    def state(self) -> dict:
        """The queue's tensors (``DiscreteLevel.state``), the :class:`L2State` fields, the counters,
        the fading ring ``gains`` and ``rng_state``, the generator's state (a copy), by name."""
        return {**self.device_state(), "rng_state": self.generator.get_state()}

    def load_state(self, state: dict) -> None:
        """Point the level at ``state`` (as from :meth:`state`; no copy but of the generator's state)."""
        super().load_state(state)
        self.generator.set_state(state["rng_state"])

    def device_state(self) -> dict:
        """:meth:`state` without the generator's (a captured step draws nothing)."""
        return {**super().device_state(), **self.l2_state.tensors(), **self.counters, "gains": self.gains}

    def load_device_state(self, state: dict) -> None:
        super().load_device_state(state)
        self.l2_state = L2State(**{f.name: state[f.name] for f in dataclasses.fields(L2State)})
        self.counters = {k: state[k] for k in COUNTER_KEYS}
        self.gains = state["gains"]

    def _draw_step(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The random numbers of step ``t``, in a fixed order: BLER uniforms, then fading blocks.

        :output: ``[K, E, R]`` uniforms, ``[n, E, R, S]`` gains of the blocks that start in the step
            (:meth:`_block_starts`).
        """
        u = torch.rand((self.cfg.num_slots, self.E, self.R), generator=self.generator, dtype=self.dtype,
                       device=self.device)
        g = mech.rayleigh_power((len(self._block_starts(t)), self.E, self.R, self.cfg.num_subbands),
                                self.generator, self.dtype, self.device)
        return u, g

    def _block_starts(self, t: int) -> list[int]:
        """The slots ``k`` of step ``t`` that start a fading block."""
        K, coh = self.cfg.num_slots, self.l2.coh_slots
        return [k for k in range(K) if (t * K + k) % coh == 0]

    def _estimate(self, x_est: torch.Tensor) -> Estimate:
        """The gNB's view of a channel estimate ``x_est`` ``[E, R, S]`` (linear, full power in one
        subband)."""
        se_est = torch.log2(1.0 + x_est).clamp_(max=self._se_max)
        # PF ranks subbands the same way; equal ones by index (stable: the same order on every device).
        order = torch.argsort(se_est, dim=-1, descending=True, stable=True)
        cap, max_sb = mech.capacity_by_subbands(x_est.mean(-1), self._bytes_per_sb_se, self._se_max,
                                                self._gap_lin, self._min_sinr_lin, self.cfg.num_subbands)
        return Estimate(x_est, se_est, order, cap, max_sb, mech.to_envs_last(se_est), mech.PfOrder.of(order),
                        mech.to_envs_last(cap), max_sb.t().contiguous())

    # ------------------------------------------------------------------ service
    def checked_inputs(self, send, msg_bytes, snr_db=None, pos=None, tx_dbm=None, deadline=None) -> tuple:
        """``DiscreteLevel.checked_inputs``, its per-step cost cut where the inputs repeat: while
        ``msg_bytes``, ``snr_db``, ``pos``, ``tx_dbm`` and ``deadline`` are those of the last step (the same
        dtypes, shapes and bits: fixed sizes and powers, a fleet at rest) their checked values are the last
        step's (no SNR from the positions again), and a ``send`` already ``[E, R]`` of the level's dtype (or
        bool) on its device needs only its 0/1 check. Anything else takes the full checks: the same values,
        the same errors."""
        others = (msg_bytes, snr_db, pos, tx_dbm, deadline)
        memo = self._inputs_memo  # (cfg, the inputs kept, their checked values, those values' versions)
        if (memo is not None and memo[0] is self.cfg and all(map(_same_input, others, memo[1]))
                and all(x._version == v for x, v in zip(memo[2], memo[3], strict=True))  # not written to
                and isinstance(send, torch.Tensor) and send.shape == (self.E, self.R)
                and send.dtype in (self.dtype, torch.bool) and send.device == self.device
                and (send.dtype == torch.bool or bool(((send == 0) | (send == 1)).all()))):
            return (send != 0, *memo[2])
        checked = super().checked_inputs(send, *others)
        # (copies: the caller's tensors may change in place, and the checked values may be views of them)
        values = tuple(map(_input_copy, checked[1:]))
        self._inputs_memo = (self.cfg, tuple(map(_input_copy, others)), values, [x._version for x in values])
        return checked

    def _step(self, send, msg_bytes, snr_db, tx_dbm, deadline, draws=None) -> dict:
        if self.slot_loop == "numba" and self.trace is None:  # the whole step in numba kernels
            from isaac_net.core.levels import _l2_numba

            if draws is not None:
                raise ValueError("draws: the numba slot loop draws its own random numbers")
            return _l2_numba.step(self, send, msg_bytes, snr_db, tx_dbm, deadline)
        return super()._step(send, msg_bytes, snr_db, tx_dbm, deadline, draws)

    def _serve(self, q: Queue, ctx: StepContext) -> Service:
        return self._serve_eager(q, ctx)

    def _slot_channels(self, t: int, snr3: torch.Tensor, new_blocks: torch.Tensor, estimate=None):
        """Per UL slot of step ``t`` (the eager slot loop): ``(k, s, rx_now, est)``, the slot's channel and
        the gNB's estimate of it, from :meth:`_channel_blocks` (arguments as there)."""
        rx, rx_of_slot, est, est_of_slot = self._channel_blocks(t, snr3, new_blocks, estimate)
        for k in range(self.cfg.num_slots):
            yield k, t * self.cfg.num_slots + k, rx[rx_of_slot[k]], est[est_of_slot[k]]

    def _channel_blocks(self, t: int, snr3: torch.Tensor, new_blocks: torch.Tensor, estimate=None):
        """The channels of step ``t``'s UL slots (every slot loop), per fading block:
        ``(rx, rx_of_slot, est, est_of_slot)``. ``rx``: the distinct channels ``[E, R, S]`` of the step
        (SINR with the full power in one subband; ``snr3`` ``[E, R, 1]``), ``est``: the gNB's
        :class:`Estimate` of the channel ``est_delay_slots`` old (or what ``estimate(level, x_est)``
        makes of it), each list in the order its blocks start; ``*_of_slot`` ``[K]`` int64: each slot's
        entry. The fading blocks the step drew (``_draw_step``) enter the ring as they start; the work is
        done only at the slots where a block starts or a channel or an estimate changes block (the rest
        reuse the same objects), in slot order."""
        l2, K, H, coh = self.l2, self.cfg.num_slots, self._num_blocks, self.l2.coh_slots
        d, s0 = l2.est_delay_slots, t * K
        block_starts = self._block_starts(t)
        gains, rx, est = self.gains, [], []
        for k in sorted({0, *block_starts, *(k for k in range(K) if (s0 + k - d) % coh == 0)}):
            s = s0 + k
            if k in block_starts:
                gains[(s // coh) % H] = new_blocks[block_starts.index(k)]
            if k == 0 or s % coh == 0:
                rx.append(snr3 * gains[(s // coh) % H])
            if k == 0 or (s - d) % coh == 0:
                x_est = snr3 * gains[((s - d) // coh) % H]
                est.append(self._estimate(x_est) if estimate is None else estimate(self, x_est))
        # (Python ints: t may be past int64's range; the entries are small)
        rx_of_slot = np.array([(s0 + k) // coh - s0 // coh for k in range(K)], dtype=np.int64)
        est_of_slot = np.array([(s0 + k - d) // coh - (s0 - d) // coh for k in range(K)], dtype=np.int64)
        return rx, rx_of_slot, est, est_of_slot

    def _serve_eager(self, q: Queue, ctx: StepContext) -> Service:
        """The slot loop in eager torch ops, with host-side branches that skip rare work on the CPU."""
        t = ctx.t
        idx, bytes_, live = messages_by_age(q, self.t_now, self.cfg.timeout_steps)
        run = self._eager_begin(bytes_, live)
        snr3 = radio.db_to_lin(ctx.snr_db).unsqueeze(-1)  # [E, R, 1] full power in one subband
        uniforms, new_blocks = self._draw_step(t) if ctx.draws is None else ctx.draws
        nack_below = -torch.logit(uniforms)  # [K, E, R]: NACK iff c ln(sinr) + b[mcs] < this
        slot_now = self.t_now * self.cfg.num_slots + self._slot_in_step  # [K] long
        for k, s, rx_now, est in self._slot_channels(t, snr3, new_blocks):
            self._eager_slot(run, k, s, slot_now[k], rx_now, est, nack_below[k], uniforms[k])
        self._count(run.log)
        st = dataclasses.replace(run.st, rlc_cnt=run.rlc_cnt, round_slot=run.round_slot, known=run.known,
                                 outstanding=run.outstanding, olla_db=run.olla, avg_thr=run.avg)
        return self._close_step(q, st, idx, live, run.usable, run.bytes_, run.unsched, run.finish_slot,
                                mech.count_true(torch.stack(run.is_tx_by_slot), 0))

    def _eager_begin(self, bytes_: torch.Tensor, live: torch.Tensor) -> _EagerRun:
        """The eager loop's running tensors at the start of a step (``bytes_``, ``live``: the queue
        in age order, :func:`messages_by_age`)."""
        E, R, A, D = self.E, self.R, self.cfg.timeout_steps, self.l2.rlc_delay_slots + 1
        st = self.l2_state.forget(~live)
        held = st.held  # a ring, written in place
        # The RLC ring's slots that may hold bytes (on the CPU the others are skipped: adding 0 is a no-op).
        is_held = [True] * D
        if self._host_branches:
            flat = held.reshape(D, -1)
            is_held = ((flat.amax(1) != 0) | (flat.amin(1) != 0)).tolist()
        return _EagerRun(
            st=st, held=held, rlc_cnt=st.rlc_cnt, round_slot=st.round_slot,
            # Bytes not yet in any TB (nor held by RLC): the only ones a new TB may take.
            unsched=bytes_ - st.pending - held.sum(0),
            # Unacked bytes; +inf marks a message that can no longer complete (absent, done, lost).
            bytes_=bytes_.masked_fill(~live, math.inf),
            usable=live,  # not lost by RLC
            finish_slot=torch.full((E, R, A), -1, dtype=torch.long, device=self.device),
            known=st.known, outstanding=st.outstanding, olla=st.olla_db, avg=st.avg_thr, is_held=is_held,
            # Views of every HARQ process and grant slot, written in place (cheaper than indexing per slot).
            harqs=[st.harq(p) for p in range(self.l2.harq_rtt_slots)],
            grants=[st.grant(u) for u in range(self.l2.k2_slots)],
            no_msgs=torch.zeros(E, R, A, dtype=torch.bool, device=self.device),
            no_robots=torch.zeros(E, R, dtype=torch.bool, device=self.device),
            log={k: [] for k in ("new", "nack", "retx", "fail", "round", "lost", "sr")}, is_tx_by_slot=[])

    def _eager_slot(self, run: _EagerRun, k: int, s: int, s_now: torch.Tensor, rx_now: torch.Tensor,
                    est: Estimate, nack_below: torch.Tensor, u: torch.Tensor) -> None:
        """UL slot ``s`` (``k`` in the step) of the eager loop: ``run`` moves on by one slot. ``s`` picks
        the rings' rows (a function of the step's phase, ``graph_phase``); ``s_now`` (0-d long, the same
        number from the device counter) is the slot the state keeps."""
        l2, host, D = self.l2, self._host_branches, len(run.is_held)
        P, K2 = l2.harq_rtt_slots, l2.k2_slots
        # RLC: bytes held since slot s - rlc_delay_slots are back (those of a lost message vanish).
        if run.is_held[s % D]:
            run.unsched = run.unsched + torch.where(run.usable, run.held[s % D], self._zero)
            run.held[s % D] = 0
            run.is_held[s % D] = not host

        # Transmission: the retransmission due now, or a new TB on the grant of slot s.
        hq, gr = run.harqs[s % P], run.grants[s % K2]
        tx = transmit(run.unsched, hq, gr, rx_now, nack_below, self._bler_c, self._bler_b, l2.harq_max_tx)
        run.unsched = run.unsched - tx.take
        run.bytes_, run.finish_slot = deliver(run.bytes_, run.finish_slot, tx, k)

        # HARQ failure: RLC resends the bytes after rlc_delay_slots, or the message is lost.
        # A new TB starts here; a retransmission keeps its own. (torch.where: masked_fill with a tensor
        # value reads it on the host on CUDA.)
        first = torch.where(tx.is_new, s_now, hq.first)
        requeue, is_lost = self._eager_rlc(run, tx, first, s, s_now)
        for ring, v in zip(hq, harq_next(tx, first), strict=True):
            ring.copy_(v)

        run.olla = mech.olla_update(run.olla, tx.is_new, tx.nack, l2.olla_up_db, l2.olla_down_db,
                                    l2.olla_max_db)
        run.avg = torch.lerp(run.avg, tx.tb_bytes, 1.0 - l2.pf_beta)
        run.known, run.outstanding, left = buffer_report(run.known, run.outstanding, gr.tbs, tx)
        if self._has_occasion[s % l2.sr_period_slots]:
            is_sr, run.known = scheduling_request(self._sr_occasion[s % l2.sr_period_slots], left, run.known,
                                                  run.outstanding, self._sr_bytes)
        else:
            is_sr = run.no_robots

        # Grant for slot u = s + K2 (K2 < RTT: its retransmissions are known now).
        new, need, metric = grant(est, run.known, run.avg, run.olla, run.harqs[(s + K2) % P], l2.pf_rounds,
                                  self._sel_db, self._tbs_per_sb, stop_early=host)
        for ring, v in zip(gr, new, strict=True):  # slot s + K2 lives where slot s did
            ring.copy_(v)
        run.known = (run.known - new.tbs).clamp(min=0)
        run.outstanding = run.outstanding + new.tbs

        run.is_tx_by_slot.append(tx.is_tx)
        for key, v in (("new", tx.is_new), ("nack", tx.nack), ("retx", tx.is_retx), ("fail", tx.fail),
                       ("sr", is_sr)):
            run.log[key].append(v)
        if self.trace is not None:
            H, coh = self._num_blocks, l2.coh_slots
            self.trace.append(dict(
                s=s, k=k, gain=self.gains[(s // coh) % H].clone(), u=u, is_new=tx.is_new,
                is_retx=tx.is_retx, nack=tx.nack, fail=tx.fail, ntx=tx.ntx, tb_bytes=tx.tb_bytes,
                content=tx.content, sb=tx.sb, mcs=tx.mcs,
                bler=mech.bler(10.0 * torch.log10(tx.acc), tx.mcs, self._thr_db, l2.bler_slope_db),
                requeue=requeue, is_lost=is_lost, is_sr=is_sr, known=run.known, alloc=new.sb, need=need,
                tbs_grant=new.tbs, metric=metric, sendable=tx.sendable, unsched=run.unsched,
                held=run.held.sum(0), olla_db=run.olla))

    def _eager_rlc(self, run: _EagerRun, tx: Tx, first: torch.Tensor, s: int,
                   s_now: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager loop's HARQ failures of slot ``s`` (``s_now`` as in :meth:`_eager_slot`): RLC holds
        the bytes for ``rlc_delay_slots`` or the message is lost. :output: ``(requeue, is_lost)``
        ``[E, R, A]`` bool."""
        l2, host, D = self.l2, self._host_branches, len(run.is_held)
        if host and not bool(tx.fail.any()):
            return run.no_msgs, run.no_msgs
        is_lost, is_round, requeue = rlc_failure(tx, first, run.usable, run.round_slot, run.rlc_cnt,
                                                 l2.rlc_max_retx)
        # (In place: bytes_ and rlc_cnt are this step's own tensors.)
        if not host or bool(is_lost.any()):  # a loss is rare
            run.usable = run.usable ^ is_lost
            run.bytes_.masked_fill_(is_lost, math.inf)
            run.unsched = run.unsched.masked_fill(is_lost, 0.0)
            run.log["lost"].append(mech.count_true(is_lost, -1))
        run.rlc_cnt += is_round
        run.round_slot = torch.where(is_round, s_now + l2.rlc_delay_slots, run.round_slot)
        # TB contents are finite and >= 0: the product is torch.where(requeue, content, 0).
        run.held[(s + l2.rlc_delay_slots) % D] += tx.content * requeue
        run.is_held[(s + l2.rlc_delay_slots) % D] = True
        # Per robot: the [E, R, A] masks would cost a large stack at the end of the step.
        run.log["round"].append(mech.count_true(is_round, -1))
        return requeue, is_lost

    def _close_step(self, q: Queue, st: L2State, idx: torch.Tensor, live: torch.Tensor, usable: torch.Tensor,
                    bytes_: torch.Tensor, unsched: torch.Tensor, finish_slot: torch.Tensor,
                    tx_slots: torch.Tensor) -> Service:
        """The end of an eager step: the bytes in HARQ carried to the next step, the state
        ``st`` kept, and the step's :class:`Service` in the queue's layout (``tx_slots`` ``[E, R]``: the
        slots each robot transmitted in)."""
        done_a = finish_slot >= 0
        bytes_ = torch.where(usable & ~done_a, bytes_, 0.0)
        # Bytes in HARQ, carried to the next step.
        self.l2_state = dataclasses.replace(st, pending=bytes_ - unsched - st.held.sum(0))
        ix = idx.clamp(max=self.cfg.timeout_steps - 1)
        valid = q.valid
        return Service(
            done=torch.gather(done_a, -1, ix) & valid,
            finish_s=(torch.gather(finish_slot, -1, ix) + 1).to(self.dtype) * self.cfg.slot_s,
            remaining=torch.gather(bytes_, -1, ix),
            tx_time_s=tx_slots.to(self.dtype) * self.cfg.slot_s,
            lost=torch.gather(live & ~usable, -1, ix) & valid,
        )

    def _count(self, log: dict) -> None:
        """Add the step's per-slot events to ``counters`` (``log``: lists of ``[E, R]`` bool, and for
        ``round`` and ``lost``, of ``[E, R]`` counts of the slots that had any)."""
        st = {key: torch.stack(log[key]) for key in ("new", "nack", "retx", "fail", "sr")}
        c = self.counters
        c["tx_first"] += mech.count_true(st["new"], 0)
        c["nack_first"] += mech.count_true(st["nack"] & st["new"], 0)
        c["tx_retx"] += mech.count_true(st["retx"], 0)
        c["harq_fail"] += mech.count_true(st["fail"], 0)
        for key, name in (("round", "rlc_retx"), ("lost", "rlc_lost")):
            if log[key]:
                c[name] += torch.stack(log[key]).sum(0, dtype=torch.int32)
        c["sr"] += mech.count_true(st["sr"], 0)
