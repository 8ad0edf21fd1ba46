"""Shared bookkeeping of the discrete levels (docs/design.md §2).

A level owns capture, overflow, ageing, timeout, AoI, energy and the per-step KPI dict
here, once. Each level writes only its service rule, ``_serve`` (and, with state of its own,
``_reset_level`` and ``_age_level``, called by ``reset`` and at the end of each step). The queue is a
compacted FIFO per robot: ``bytes[e, r, j]`` for ``j < length[e, r]``, oldest first.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from isaac_net.core import _validate, radio
from isaac_net.core.config import CellConfig


@dataclasses.dataclass
class Queue:
    """Compacted FIFO per robot. ``bytes``/``size``/``gen`` are ``[E, R, F]``, ``length`` ``[E, R]``.

    ``bytes`` holds the unserved bytes of each message (0 past ``length``), ``size`` its bytes at
    capture (0 past ``length``; what a delivery adds to the throughput, exact whatever the sizes
    of the messages queued together) and ``gen`` the control step it was generated in.
    """

    bytes: torch.Tensor
    size: torch.Tensor
    gen: torch.Tensor
    length: torch.Tensor

    @property
    def valid(self) -> torch.Tensor:
        F = self.bytes.shape[-1]
        return torch.arange(F, device=self.bytes.device) < self.length.unsqueeze(-1)


@dataclasses.dataclass
class Service:
    """What a service rule did in one step.

    :field done: ``[E, R, F]`` bool, message delivered this step.
    :field finish_s: ``[E, R, F]`` finish time inside the step, s (read where ``done``).
    :field remaining: ``[E, R, F]`` unserved bytes after the step (0 where done).
    :field tx_time_s: ``[E, R]`` time the robot transmitted at full power, s.
    :field lost: ``[E, R, F]`` bool, dropped by the level itself (counted as a timeout), or None.
    """

    done: torch.Tensor
    finish_s: torch.Tensor
    remaining: torch.Tensor
    tx_time_s: torch.Tensor
    lost: torch.Tensor | None = None


@dataclasses.dataclass
class StepContext:
    """Per-step facts a service rule may need. All ``[E, R]`` but ``t`` and ``draws``."""

    t: int
    snr_db: torch.Tensor
    tx_dbm: torch.Tensor
    was_empty: torch.Tensor  # bool: queue empty before this step's capture
    captured: torch.Tensor  # bool: a message entered the queue this step
    msg_bytes: torch.Tensor
    draws: tuple | None = None  # the step's random numbers drawn beforehand (``DiscreteLevel.draw``)


class DiscreteLevel:
    """A discrete engine level. Subclasses implement ``_serve`` (and optionally level state).

    ``step`` returns per-robot ``[E, R]`` tensors for the step: ``offered, delivered,
    delay_sum`` (control steps), ``timeouts, overflow, aoi`` (control steps),
    ``energy_j``, ``throughput_bytes_per_s`` (the delivered messages' bytes over the step's
    duration) and ``queued_msgs``.
    """

    name = "?"
    # The step can be captured in CUDA graphs (backend "cuda_graph", levels/graphed.py): no
    # host-side branch on tensor values (after prepare_capture) and the Python step counter only
    # in choices that repeat with graph_phase(t).
    capturable = False
    # Why not, in words (the error of backend "cuda_graph" where ``capturable`` is False).
    not_capturable_because = "chooses work on the host from tensor values"

    def __init__(self, E: int, R: int, device="cpu", *, cfg: CellConfig | None = None,
                 dtype: torch.dtype = torch.float32, seed: int | None = None):
        _validate.check_dims(E, R)
        _validate.check_dtype(dtype)
        self.E, self.R = E, R
        self.device = _validate.check_device(device)
        self.cfg = cfg if cfg is not None else CellConfig()
        if not isinstance(self.cfg, CellConfig):
            raise TypeError(f"cfg: expected a CellConfig, got {type(self.cfg).__name__}")
        self.dtype = dtype
        self.seed = _validate.check_seed(seed)
        F = self.cfg.buffer_msgs
        self.t = 0
        # The step counter again, on the device: the step's tensor arithmetic reads this one, so
        # a captured step (backend "cuda_graph") stays right at every later t.
        self.t_now = torch.zeros((), dtype=torch.long, device=self.device)
        self.queue = Queue(
            bytes=torch.zeros(E, R, F, dtype=dtype, device=self.device),
            size=torch.zeros(E, R, F, dtype=dtype, device=self.device),
            gen=torch.zeros(E, R, F, dtype=torch.long, device=self.device),
            length=torch.zeros(E, R, dtype=torch.long, device=self.device),
        )
        # Generation step of the freshest delivered message (the reset time at reset).
        self.fresh_gen = torch.zeros(E, R, dtype=torch.long, device=self.device)

    # ------------------------------------------------------------------ hooks
    def _serve(self, q: Queue, ctx: StepContext) -> Service:
        raise NotImplementedError

    def _reset_level(self, env_mask: torch.Tensor) -> None:
        """Reset level-specific state of the envs in ``env_mask`` (``[E]`` bool)."""

    def _age_level(self) -> None:
        """Age level-specific per-message state by one step, with the queue (at the end of each step)."""

    # ------------------------------------------------------------------ capture hooks (levels/graphed.py)
    def prepare_capture(self) -> None:
        """Turn off whatever branches on tensor values on the host (nothing here)."""

    def graph_phase(self, t: int) -> int:
        """Which captured graph serves step ``t``: the steps of one phase make the same host-side
        choices (L1, QA: none, one graph)."""
        return 0

    @property
    def graph_period_steps(self) -> int:
        """The steps after which ``graph_phase`` repeats (each phase met once in as many steps)."""
        return 1

    def draw(self) -> tuple:
        """The next step's random numbers, drawn outside a captured step and passed in as ``draws``
        (L1, QA: none)."""
        return ()

    # ------------------------------------------------------------------ api
    def reset(self, env_ids=None) -> None:
        """Restart the envs ``env_ids`` (all when None); the others are left untouched."""
        mask = _validate.env_mask(env_ids, self.E, self.device)
        m3 = mask[:, None, None]
        q = self.queue
        self.queue = Queue(
            bytes=torch.where(m3, torch.zeros_like(q.bytes), q.bytes),
            size=torch.where(m3, torch.zeros_like(q.size), q.size),
            gen=torch.where(m3, torch.zeros_like(q.gen), q.gen),
            length=torch.where(mask[:, None], torch.zeros_like(q.length), q.length),
        )
        self.fresh_gen = torch.where(mask[:, None], self.t_now, self.fresh_gen)
        self._reset_level(mask)

    def state(self) -> dict:
        """The tensors that carry the queue from one step to the next, by name: the whole state
        of L1 and QA; L2-legacy adds its own."""
        return self.device_state()

    def load_state(self, state: dict) -> None:
        """Point the level at ``state`` (tensors as from :meth:`state`); no copy. The host's step
        counter ``t`` follows the state's ``t_now`` (the draws and the slot rings are keyed by it)."""
        self.load_device_state(state)
        self.t = int(state["t_now"])

    def device_state(self) -> dict:
        """The part of :meth:`state` on the level's device (what a captured step reads and writes)."""
        q = self.queue
        return {"bytes": q.bytes, "size": q.size, "gen": q.gen, "length": q.length,
                "fresh_gen": self.fresh_gen,
                "t_now": self.t_now}

    def load_device_state(self, state: dict) -> None:
        """Point the level at ``state`` (as from :meth:`device_state`); no copy."""
        self.queue = Queue(bytes=state["bytes"], size=state["size"], gen=state["gen"],
                           length=state["length"])
        self.fresh_gen, self.t_now = state["fresh_gen"], state["t_now"]

    def step(self, send, msg_bytes, snr_db=None, pos=None, tx_dbm=None, deadline=None) -> dict:
        """Advance every env by one control step.

        :input send: ``[E, R]`` 0/1 (or bool), a message captured at the start of the step.
        :input msg_bytes: ``[E, R]`` message size, bytes (> 0).
        :input snr_db: ``[E, R]`` SNR with full power in one subband, dB; or
        :input pos: ``[E, R, 2]`` positions, m (gNB at the origin), with
        :input tx_dbm: ``[E, R]`` transmit power, dBm (default ``cfg.tx_dbm``).
        :input deadline: ``[E, R]`` whole control steps in ``[1, timeout_steps]``.
        :output: dict of ``[E, R]`` tensors, keys ``kpi.KPI_KEYS``.
        """
        with torch.no_grad():
            return self._step(*self.checked_inputs(send, msg_bytes, snr_db, pos, tx_dbm, deadline))

    def checked_inputs(self, send, msg_bytes, snr_db=None, pos=None, tx_dbm=None, deadline=None) -> tuple:
        """``step``'s inputs checked and resolved: ``(send, msg_bytes, snr_db, tx_dbm, deadline)``,
        each ``[E, R]`` (send bool, deadline long)."""
        E, R, dt, dev, cfg = self.E, self.R, self.dtype, self.device, self.cfg
        if isinstance(send, torch.Tensor) and send.dtype == torch.bool:
            send = send.to(dt)
        send = _validate.per_robot(send, "send", E, R, dt, dev)
        if bool(((send != 0) & (send != 1)).any()):
            raise ValueError("send: expected binary sends (0 or 1) for a discrete level; "
                             "use DiffFluid for send weights in [0, 1]")
        msg_bytes = _validate.msg_bytes(msg_bytes, E, R, dt, dev)
        snr, tx = _validate.radio_inputs(snr_db, pos, tx_dbm, cfg, E, R, dt, dev)
        dl = _validate.deadline_steps(deadline, cfg, E, R, dt, dev, integer=True).long()
        return send.bool(), msg_bytes, snr, tx, dl

    # ------------------------------------------------------------------ core
    def _step(self, send, msg_bytes, snr_db, tx_dbm, deadline, draws=None) -> dict:
        cfg, q, t, t_now, dt = self.cfg, self.queue, self.t, self.t_now, self.dtype
        F = cfg.buffer_msgs
        slots = torch.arange(F, device=self.device)

        # 1. Capture: drop the new message when F are already queued.
        was_empty = q.length == 0
        is_full = q.length >= F
        captured = send & ~is_full
        overflow = send & is_full
        at_tail = captured.unsqueeze(-1) & (slots == q.length.unsqueeze(-1))
        q = Queue(
            bytes=torch.where(at_tail, msg_bytes.unsqueeze(-1), q.bytes),
            size=torch.where(at_tail, msg_bytes.unsqueeze(-1), q.size),
            gen=torch.where(at_tail, t_now, q.gen),
            length=q.length + captured.long(),
        )

        # 2. Service (the level's rule).
        ctx = StepContext(t=t, snr_db=snr_db, tx_dbm=tx_dbm, was_empty=was_empty,
                          captured=captured, msg_bytes=msg_bytes, draws=draws)
        svc = self._serve(q, ctx)
        valid = q.valid
        done = svc.done & valid
        age = (t_now - q.gen).to(dt)
        delay = torch.where(done, age + svc.finish_s / cfg.step_s, torch.zeros_like(age))
        delivered_bytes = torch.where(done, q.size, torch.zeros_like(q.size)).sum(-1)
        fresh = torch.where(done, q.gen, torch.full_like(q.gen, -(2**62))).amax(-1)
        self.fresh_gen = torch.maximum(self.fresh_gen, fresh)

        # 3. Ageing and timeout: a message whose new age reaches the deadline is dropped.
        alive = valid & ~done
        timed_out = alive & ((t_now - q.gen + 1) >= deadline.unsqueeze(-1))
        if svc.lost is not None:
            timed_out = timed_out | (alive & svc.lost)
        keep = alive & ~timed_out
        self.queue = _compact(Queue(bytes=torch.where(keep, svc.remaining, torch.zeros_like(q.bytes)),
                                    size=q.size, gen=q.gen, length=q.length), keep)
        self._age_level()
        self.t = t + 1
        self.t_now = t_now + 1

        # 4.-5. AoI at the end of the step, and transmit energy.
        aoi = (self.t_now - self.fresh_gen).to(dt)
        energy_j = radio.dbm_to_w(tx_dbm) * svc.tx_time_s
        return {
            "offered": send.to(dt),
            "delivered": done.sum(-1).to(dt),
            "delay_sum": delay.sum(-1),
            "timeouts": timed_out.sum(-1).to(dt),
            "overflow": overflow.to(dt),
            "aoi": aoi,
            "energy_j": energy_j,
            "throughput_bytes_per_s": delivered_bytes / cfg.step_s,
            "queued_msgs": self.queue.length.to(dt),
        }


def _compact(q: Queue, keep: torch.Tensor) -> Queue:
    """Move the kept messages to the front, preserving their order.

    :input keep: ``[E, R, F]`` bool.
    """
    # Stable sort of "not kept" puts kept entries first in their original order.
    order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices
    k_sorted = torch.gather(keep, -1, order)
    return Queue(
        bytes=torch.where(k_sorted, torch.gather(q.bytes, -1, order), torch.zeros_like(q.bytes)),
        size=torch.where(k_sorted, torch.gather(q.size, -1, order), torch.zeros_like(q.size)),
        gen=torch.where(k_sorted, torch.gather(q.gen, -1, order), torch.zeros_like(q.gen)),
        length=keep.sum(-1),
    )


def partial_remaining(q: Queue, cum: torch.Tensor, served: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """Unserved bytes per message after ``served`` bytes ``[E, R]`` went out FIFO.

    The message being served when the step ended keeps ``cum - served``; messages not
    yet reached keep their bytes; done messages keep 0.
    """
    started = (cum - q.bytes) < served.unsqueeze(-1)
    rem = torch.where(started, cum - served.unsqueeze(-1), q.bytes)
    return torch.where(done, torch.zeros_like(rem), rem)


def on_air_s(sent_bytes: torch.Tensor, snr_lin: torch.Tensor, cfg, own_rate: torch.Tensor | None = None,
             n_busy: torch.Tensor | None = None) -> torch.Tensor:
    """Transmit time of L1 and QA ``[E, R]``, s: the bytes a robot sent in the step ``sent_bytes``
    ``[E, R]`` at the rate of the whole band, ``S min(log2(1 + snr / S), se_max) bytes_per_se_s`` (its
    power spread over the S subbands; ``snr_lin`` ``[E, R]`` with it in one subband), or at the rate it
    was served at ``own_rate`` ``[E, R]`` B/s where that is the faster (QA's, whose PF gain can make it
    so: a robot is not on air longer than it was served). L1's own rate never is. Sharing the band
    makes a robot wait for its turn, not transmit longer: L2-legacy grants each subband of a slot to
    one robot and charges a robot's energy by the slots it is granted, whatever their width, so its
    energy per byte hardly moves with the fleet size where an equal split of every slot's band would
    charge a robot for the whole time it waits (docs/design.md, "Transmit energy").

    A calibrated cell (``not cfg.air_is_plain``) multiplies that time by
    ``air_factor * max(n_busy, 1)^air_crowd_exp``, ``n_busy`` ``[E, 1]`` the robots backlogged in the
    cell at the step's service, and caps it at the step: L2-legacy's PF grants each robot of a busier
    cell fewer subbands per granted slot at full power, so its energy per byte grows with the crowd
    (docs/design.md, "Energy in a crowd")."""
    S = float(cfg.num_subbands)
    se = torch.clamp(torch.log1p(snr_lin / S) / math.log(2.0), max=cfg.se_max)  # log1p: > 0 at -150 dB
    rate = S * se * cfg.bytes_per_se_s
    tx_s = sent_bytes / (rate if own_rate is None else torch.maximum(rate, own_rate))
    if cfg.air_is_plain:
        return tx_s
    if n_busy is None:
        raise ValueError("n_busy: a cell with a time-on-air calibration (air_factor, air_crowd_exp) needs "
                         "the robots backlogged [E, 1]")
    crowd = cfg.air_factor * torch.clamp(n_busy.to(tx_s.dtype), min=1.0) ** cfg.air_crowd_exp
    return torch.clamp(tx_s * crowd, max=cfg.step_s)
