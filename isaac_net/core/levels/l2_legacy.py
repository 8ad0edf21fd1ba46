"""L2-legacy: the packet-level uplink level, slot by slot (DESIGN.md §2 "L2-legacy").

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

import torch

from isaac_net.core import radio
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
            if not (isinstance(v, numbers.Real) and math.isfinite(v) and v > 0):
                raise ValueError(f"L2LegacyConfig.{name} must be a finite number > 0, got {v!r}")
        for name in ("olla_up_db", "bler_gap_db"):
            v = getattr(self, name)
            if not (isinstance(v, numbers.Real) and math.isfinite(v) and v >= 0):
                raise ValueError(f"L2LegacyConfig.{name} must be a finite number >= 0, got {v!r}")
        if not (0 < self.olla_target_bler < 1):
            raise ValueError(
                f"L2LegacyConfig.olla_target_bler must be in (0, 1), got {self.olla_target_bler!r}")
        if not (0 <= self.pf_beta < 1):
            raise ValueError(f"L2LegacyConfig.pf_beta must be in [0, 1), got {self.pf_beta!r}")
        se = tuple(self.mcs_se)
        if not (len(se) >= 1 and all(isinstance(x, numbers.Real) and x > 0 for x in se)):
            raise ValueError(
                f"L2LegacyConfig.mcs_se must be a non-empty tuple of SE > 0, got {self.mcs_se!r}")

    @property
    def olla_down_db(self) -> float:
        """OLLA step on an ACK, dB: ``up * T / (1 - T)`` so the stationary BLER is ``T``."""
        return self.olla_up_db * self.olla_target_bler / (1.0 - self.olla_target_bler)


COUNTER_KEYS = ("tx_first", "nack_first", "tx_retx", "harq_fail", "rlc_retx", "rlc_lost", "sr")


class NetL2Legacy(DiscreteLevel):
    """L2-legacy level: SR/BSR, PF per subband, fading, BLER, OLLA, HARQ and RLC (module doc).

    Besides the step KPIs, ``counters`` holds cumulative ``[E, R]`` tensors (reset with the
    env): ``tx_first`` new TBs, ``nack_first`` their NACKs, ``tx_retx`` HARQ retransmissions,
    ``harq_fail`` TBs handed to RLC, ``rlc_retx`` message retransmissions by RLC,
    ``rlc_lost`` messages lost by RLC, ``sr`` scheduling requests. Setting ``trace`` to a
    list makes each slot append a dict of its tensors (for tests; off by default).
    """

    name = "L2-legacy"

    def __init__(self, E: int, R: int, device="cpu", *, cfg=None, dtype=torch.float32,
                 seed: int | None = None, l2_cfg: L2LegacyConfig | None = None):
        super().__init__(E, R, device, cfg=cfg, dtype=dtype, seed=seed)
        self.l2 = l2_cfg if l2_cfg is not None else L2LegacyConfig()
        if not isinstance(self.l2, L2LegacyConfig):
            raise TypeError(f"l2_cfg: expected an L2LegacyConfig, got {type(self.l2).__name__}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed: expected an integer or None, got {seed!r}")
        cfg, l2, dev = self.cfg, self.l2, self.device
        if cfg.is_calibrated:  # the ground truth the constants are fitted to has none of its own
            raise ValueError("cfg: L2-legacy takes no calibration constants (rate_factor, snr_offset_db, "
                             "l1_sr_slots are effective physics of the fluid levels); got "
                             f"{(cfg.rate_factor, cfg.snr_offset_db, cfg.l1_sr_slots)}")
        A, S, P, K2 = cfg.timeout_steps, cfg.num_subbands, l2.harq_rtt_slots, l2.k2_slots

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
        self._zero_l = torch.zeros((), dtype=torch.long, device=dev)
        self._sr_bytes = torch.full((), l2.sr_grant_bytes, dtype=dtype, device=dev)
        # On the CPU a branch on a tensor costs no device sync, so rare work can be skipped.
        self._host_branches = self.device.type == "cpu"
        r = torch.arange(R, device=dev)
        self._sr_occasion = (torch.arange(l2.sr_period_slots, device=dev).unsqueeze(1)
                             == (r % l2.sr_period_slots).unsqueeze(0))  # [period, R]
        self._has_occasion = [bool(x) for x in self._sr_occasion.any(1).tolist()]
        # Fading: a ring of the last H blocks covers both the current block and the
        # estimate's block (at most ceil(est_delay / coh) blocks back).
        self._num_blocks = -(-l2.est_delay_slots // l2.coh_slots) + 1
        self._gains = mech.rayleigh_power((self._num_blocks, E, R, S), self.generator, dtype, dev)

        z = dict(dtype=dtype, device=dev)
        zl = dict(dtype=torch.long, device=dev)
        # Per message, in age order: index j = A - 1 - age (oldest first, FIFO order).
        self._pending = torch.zeros(E, R, A, **z)  # bytes in TBs in HARQ
        # Bytes waiting for an RLC retransmission, by the slot they return: slot u at u % D.
        self._held = torch.zeros(l2.rlc_delay_slots + 1, E, R, A, **z)
        self._rlc_cnt = torch.zeros(E, R, A, **zl)  # RLC retransmission rounds so far
        self._round_slot = torch.zeros(E, R, A, **zl)  # slot the last round's bytes returned
        # HARQ processes, process-major: process p serves the slots s with s % P == p.
        self._hq_active = torch.zeros(P, E, R, dtype=torch.bool, device=dev)
        self._hq_content = torch.zeros(P, E, R, A, **z)  # bytes of each message in the TB
        self._hq_sb = torch.zeros(P, E, R, S, dtype=torch.bool, device=dev)
        self._hq_mcs = torch.zeros(P, E, R, **zl)
        self._hq_acc = torch.zeros(P, E, R, **z)  # chase-combined SINR, linear
        self._hq_ntx = torch.zeros(P, E, R, **zl)
        self._hq_first = torch.zeros(P, E, R, **zl)  # slot of the TB's first transmission
        # Grants issued for the next K2 slots: slot u lives at u % K2.
        self._gr_sb = torch.zeros(K2, E, R, S, dtype=torch.bool, device=dev)
        self._gr_mcs = torch.zeros(K2, E, R, **zl)
        self._gr_tbs = torch.zeros(K2, E, R, **z)
        self._outstanding = torch.zeros(E, R, **z)  # bytes granted, not yet sent
        self._known = torch.zeros(E, R, **z)  # the gNB's view of the robot's ungranted buffer
        self._olla_db = torch.zeros(E, R, **z)
        self._avg_thr = torch.full((E, R), l2.pf_avg_init_bytes, **z)
        self.counters = {k: torch.zeros(E, R, **z) for k in COUNTER_KEYS}
        self.trace: list | None = None

    # ------------------------------------------------------------------ state
    def _reset_level(self, env_mask: torch.Tensor) -> None:
        m = env_mask
        for name in ("_pending", "_rlc_cnt", "_round_slot", "_outstanding", "_known", "_olla_db"):
            getattr(self, name)[m] = 0
        for name in ("_held", "_hq_active", "_hq_content", "_hq_sb", "_hq_mcs", "_hq_acc", "_hq_ntx",
                     "_hq_first", "_gr_sb", "_gr_mcs", "_gr_tbs"):  # [*, E, ...]
            getattr(self, name)[:, m] = 0
        self._avg_thr[m] = self.l2.pf_avg_init_bytes
        for x in self.counters.values():
            x[m] = 0

    def _draw_step(self, t: int) -> tuple[torch.Tensor, list[int], torch.Tensor]:
        """The step's random numbers, in a fixed order: BLER uniforms, then fading blocks.

        :output: ``[K, E, R]`` uniforms, the slots ``k`` that start a block, ``[n, E, R, S]`` gains.
        """
        K, coh = self.cfg.num_slots, self.l2.coh_slots
        u = torch.rand((K, self.E, self.R), generator=self.generator, dtype=self.dtype, device=self.device)
        starts = [k for k in range(K) if (t * K + k) % coh == 0]
        g = mech.rayleigh_power((len(starts), self.E, self.R, self.cfg.num_subbands), self.generator,
                                self.dtype, self.device)
        return u, starts, g

    # ------------------------------------------------------------------ service
    def _serve(self, q: Queue, ctx: StepContext) -> Service:
        cfg, l2 = self.cfg, self.l2
        E, R, A, S, K = self.E, self.R, cfg.timeout_steps, cfg.num_subbands, cfg.num_slots
        P, K2, H, coh = l2.harq_rtt_slots, l2.k2_slots, self._num_blocks, l2.coh_slots
        t, dt, dev = ctx.t, self.dtype, self.device
        inf = math.inf
        zero, zero_l, sr_bytes = self._zero, self._zero_l, self._sr_bytes
        bler_c, bler_b, host = self._bler_c, self._bler_b, self._host_branches

        # Messages in age order (index A-1-age, oldest first); the state aged by one step.
        self._shift_ages()
        valid = q.valid
        idx = torch.where(valid, A - 1 - (t - q.gen), A)  # [E, R, F]
        bytes_ = torch.zeros(E, R, A + 1, dtype=dt, device=dev).scatter_(
            -1, idx, torch.where(valid, torch.ceil(q.bytes), 0.0))[..., :A]
        live = torch.zeros(E, R, A + 1, dtype=torch.bool, device=dev).scatter_(-1, idx, valid)[..., :A]
        # Messages gone since the last step (delivered, timed out, lost) leave nothing behind.
        dead = ~live
        for x in (self._pending, self._held, self._rlc_cnt, self._round_slot):  # (held: [D, E, R, A])
            x.masked_fill_(dead, 0)
        self._hq_content.masked_fill_(dead, 0)
        held, rlc_cnt, round_slot = self._held, self._rlc_cnt, self._round_slot
        D = held.shape[0]
        # Bytes not yet in any TB (nor held by RLC): the only ones a new TB may take.
        unsched = bytes_ - self._pending - held.sum(0)
        # Unacked bytes; +inf marks a message that can no longer complete (absent, done, lost).
        bytes_ = bytes_.masked_fill(dead, inf)
        usable = live.clone()  # not lost by RLC

        known, outstanding, olla, avg = self._known, self._outstanding, self._olla_db, self._avg_thr
        hq_active, hq_content, hq_sb = self._hq_active, self._hq_content, self._hq_sb
        hq_mcs, hq_acc, hq_ntx, hq_first = self._hq_mcs, self._hq_acc, self._hq_ntx, self._hq_first
        gr_sb, gr_mcs, gr_tbs = self._gr_sb, self._gr_mcs, self._gr_tbs
        gains, thr_db, sel_db, tbs_per_sb = self._gains, self._thr_db, self._sel_db, self._tbs_per_sb
        up, down, omax, beta = l2.olla_up_db, l2.olla_down_db, l2.olla_max_db, l2.pf_beta

        snr3 = radio.db_to_lin(ctx.snr_db).unsqueeze(-1)  # [E, R, 1] full power in one subband
        finish_slot = torch.full((E, R, A), -1, dtype=torch.long, device=dev)
        uniforms, block_starts, new_blocks = self._draw_step(t)
        nack_below = -torch.logit(uniforms)  # [K, E, R]: NACK iff c ln(sinr) + b[mcs] < this
        no_msgs = torch.zeros(E, R, A, dtype=torch.bool, device=dev)
        no_robots = torch.zeros(E, R, dtype=torch.bool, device=dev)
        log = {k: [] for k in ("tx", "new", "nack", "retx", "fail", "round", "lost", "sr")}
        b_now = b_est = None

        for k in range(K):
            s = t * K + k
            if k in block_starts:
                gains[(s // coh) % H] = new_blocks[block_starts.index(k)]
            if s // coh != b_now:  # the channel: a new block
                b_now = s // coh
                rx_now = snr3 * gains[b_now % H]  # [E, R, S] SINR with the full power in one subband
            if (s - l2.est_delay_slots) // coh != b_est:  # the gNB's estimate: a new block
                b_est = (s - l2.est_delay_slots) // coh
                x_est = snr3 * gains[b_est % H]
                se_est = torch.log2(1.0 + x_est).clamp_(max=self._se_max)
                order = torch.argsort(se_est, dim=-1, descending=True)  # PF ranks subbands the same way
                cap, max_sb = mech.capacity_by_subbands(x_est.mean(-1), self._bytes_per_sb_se, self._se_max,
                                                        self._gap_lin, self._min_sinr_lin, S)

            # RLC: bytes held since slot s - rlc_delay_slots are back (those of a lost message vanish).
            unsched += torch.where(usable, held[s % D], zero)
            held[s % D] = 0

            # Transmission: the retransmission due now, or a new TB on the grant of slot s.
            p, gi = s % P, s % K2
            is_retx = hq_active[p].clone()  # the process is overwritten below
            tbs = gr_tbs[gi]
            cum = unsched.cumsum(-1)
            take = torch.minimum((tbs.unsqueeze(-1) - cum + unsched).clamp_(min=0), unsched)  # FIFO
            tb_bytes = take.sum(-1)
            sendable = cum[..., -1]
            is_new = tb_bytes > 0
            is_tx = is_retx | is_new
            sb = torch.where(is_retx.unsqueeze(-1), hq_sb[p], gr_sb[gi])
            n_sb = torch.count_nonzero(sb, -1).clamp_(min=1).to(dt)
            acc = hq_acc[p] + mech.effective_sinr_lin(rx_now / n_sb.unsqueeze(-1), sb, n_sb)  # chase
            mcs = torch.where(is_retx, hq_mcs[p], gr_mcs[gi])
            nack = ((bler_c * torch.log(acc) + torch.take(bler_b, mcs)) < nack_below[k]) & is_tx
            ack = is_tx ^ nack
            ntx = hq_ntx[p] + 1
            fail = nack & (ntx >= l2.harq_max_tx)
            keep = nack ^ fail
            content = hq_content[p] + take  # [E, R, A] bytes of each message in the TB
            unsched -= take

            # ACK: the bytes leave the queue; a message is delivered with its last byte.
            bytes_ -= torch.where(ack.unsqueeze(-1), content, zero)
            is_done = bytes_ <= 0
            finish_slot.masked_fill_(is_done, k)
            bytes_.masked_fill_(is_done, inf)

            # HARQ failure: RLC resends the bytes after rlc_delay_slots. A failed TB first sent
            # before the message's last RLC return belongs to that round; one sent after it
            # starts a new round. A message beyond rlc_max_retx rounds is lost.
            hq_first[p].masked_fill_(is_new, s)  # a new TB starts here; a retransmission keeps its own
            first = hq_first[p]
            if host and not bool(fail.any()):
                is_lost = is_round = requeue = no_msgs
            else:
                failed = (content > 0) & fail.unsqueeze(-1) & usable
                new_round = failed & (first.unsqueeze(-1) >= round_slot)
                is_lost = new_round & (rlc_cnt >= l2.rlc_max_retx)
                requeue = failed ^ is_lost
                is_round = new_round ^ is_lost
                usable ^= is_lost
                bytes_.masked_fill_(is_lost, inf)
                unsched.masked_fill_(is_lost, 0.0)
                rlc_cnt += is_round
                round_slot.masked_fill_(is_round, s + l2.rlc_delay_slots)
                held[(s + l2.rlc_delay_slots) % D] += torch.where(requeue, content, zero)

            hq_active[p] = keep
            hq_content[p] = torch.where(keep.unsqueeze(-1), content, zero)
            hq_sb[p] = sb & keep.unsqueeze(-1)
            hq_mcs[p] = mcs
            hq_acc[p] = torch.where(keep, acc, zero)
            hq_ntx[p] = torch.where(keep, ntx, zero_l)

            olla = mech.olla_update(olla, is_new, nack, up, down, omax)  # first transmissions
            avg = torch.lerp(avg, tb_bytes, 1.0 - beta)

            # BSR with the TB on the grant of slot s: the bytes left, less those already granted.
            outstanding = outstanding - tbs
            left = sendable - tb_bytes
            known = torch.where(tbs > 0, (left - outstanding).clamp(min=0), known)
            # SR: unreported data and nothing known or granted, at the robot's occasion.
            if self._has_occasion[s % l2.sr_period_slots]:
                is_occ = self._sr_occasion[s % l2.sr_period_slots]
                is_sr = is_occ & (left > 0) & (known <= 0) & (outstanding <= 0)
                known = torch.where(is_sr, sr_bytes, known)
            else:
                is_sr = no_robots

            # Grant for slot u = s + K2 (K2 < RTT: its retransmissions are known now), on the
            # subbands they leave free, PF subband by subband, up to what each robot needs.
            pu = (s + K2) % P
            need = mech.subbands_needed(torch.where(hq_active[pu], zero, known), cap, max_sb)
            metric = se_est / avg.clamp(min=1e-3).unsqueeze(-1)
            alloc = mech.pf_allocate(metric, need, ~hq_sb[pu].any(1), l2.pf_rounds, order, stop_early=host)
            n_alloc = torch.count_nonzero(alloc, -1).to(dt)
            eff_est = mech.effective_sinr_lin(x_est / n_alloc.clamp(min=1).unsqueeze(-1), alloc, n_alloc)
            mcs_new = mech.select_mcs(10.0 * torch.log10(eff_est.clamp(min=1e-30)), olla, sel_db)
            tbs_new = torch.floor(n_alloc * torch.take(tbs_per_sb, mcs_new))
            gr_sb[gi] = alloc
            gr_mcs[gi] = mcs_new
            gr_tbs[gi] = tbs_new
            known = (known - tbs_new).clamp(min=0)
            outstanding = outstanding + tbs_new

            for key, v in (("tx", is_tx), ("new", is_new), ("nack", nack), ("retx", is_retx), ("fail", fail),
                           ("round", is_round), ("lost", is_lost), ("sr", is_sr)):
                log[key].append(v)
            if self.trace is not None:
                self.trace.append(dict(
                    s=s, k=k, gain=gains[b_now % H].clone(), u=uniforms[k], is_new=is_new, is_retx=is_retx,
                    nack=nack, fail=fail, ntx=ntx, tb_bytes=tb_bytes, content=content, sb=sb, mcs=mcs,
                    bler=mech.bler(10.0 * torch.log10(acc), mcs, thr_db, l2.bler_slope_db),
                    requeue=requeue, is_lost=is_lost, is_sr=is_sr, known=known, alloc=alloc, need=need,
                    tbs_grant=tbs_new, metric=metric, sendable=sendable, unsched=unsched.clone(),
                    held=held.sum(0), olla_db=olla))

        self._known, self._outstanding, self._olla_db, self._avg_thr = known, outstanding, olla, avg
        done_a = finish_slot >= 0
        bytes_ = torch.where(usable & ~done_a, bytes_, 0.0)
        self._pending = bytes_ - unsched - held.sum(0)  # bytes in HARQ, carried to the next step
        st = {key: torch.stack(v) for key, v in log.items()}
        c = self.counters
        c["tx_first"] += st["new"].sum(0)
        c["nack_first"] += (st["nack"] & st["new"]).sum(0)
        c["tx_retx"] += st["retx"].sum(0)
        c["harq_fail"] += st["fail"].sum(0)
        c["rlc_retx"] += st["round"].sum((0, 3))
        c["rlc_lost"] += st["lost"].sum((0, 3))
        c["sr"] += st["sr"].sum(0)

        # Back to the queue's layout.
        ix = idx.clamp(max=A - 1)
        return Service(
            done=torch.gather(done_a, -1, ix) & valid,
            finish_s=(torch.gather(finish_slot, -1, ix) + 1).to(dt) * cfg.slot_s,
            remaining=torch.gather(bytes_, -1, ix),
            tx_time_s=st["tx"].sum(0).to(dt) * cfg.slot_s,
            lost=torch.gather(live & ~usable, -1, ix) & valid,
        )

    def _shift_ages(self) -> None:
        """Every message is one step older: index ``j`` moves to ``j - 1``; the newest slot is empty."""
        for name in ("_pending", "_held", "_rlc_cnt", "_round_slot", "_hq_content"):
            x = getattr(self, name)
            setattr(self, name, torch.cat([x[..., 1:], torch.zeros_like(x[..., :1])], -1))
