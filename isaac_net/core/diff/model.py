"""DiffFluid: differentiable L1D and QAD with an age-indexed queue.

State layout. A robot enqueues at most one message per control step and a message
leaves after at most ``timeout`` steps, so slot ``a`` of a ``[E, R, A]`` buffer holds the
message captured ``a`` steps ago and FIFO order is age order (oldest = highest ``a``).
Each slot carries the expected remaining bytes ``x`` and the mass ``w``, the
probability-like weight of the message still being queued. The buffer shifts by one
slot per step.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from isaac_net.core import _validate, radio
from isaac_net.core.config import CellConfig
from isaac_net.core.diff import relax
from isaac_net.core.diff._l1_loop import TENSORS_PER_SLOT, L1SlotLoop

MODES = ("L1", "QA")


@dataclasses.dataclass(frozen=True)
class FluidState:
    """Queue and AoI state, ``x``/``w`` ``[E, R, A]`` (bytes, mass), ``aoi`` ``[E, R]`` steps."""

    x: torch.Tensor
    w: torch.Tensor
    aoi: torch.Tensor

    def detach(self) -> "FluidState":
        return FluidState(self.x.detach(), self.w.detach(), self.aoi.detach())


def _fifo_cum(x: torch.Tensor) -> torch.Tensor:
    """Bytes queued up to and including each slot in FIFO (oldest-first) order. ``[E, R, A]``."""
    return x.flip(-1).cumsum(-1).flip(-1)


def _l1_slot(w, w_sum, c, c_sum, served, tx_frac, log_cum, snr_lin, tau, num_subbands: float,
             se_max: float, bytes_per_sb_se: float):
    """One UL slot of L1D for ``tau > 0``, differentiated by autograd: the plain per-slot design.

    ``DiffFluid`` runs the K slots through ``_l1_loop.L1SlotLoop`` (one node with a
    hand-written backward); the tests check that node against this recursion.

    :input c: ``[E, R, A]`` completion before the slot; :input log_cum: ``log(cum) / tau``.
    :output: ``(c, c_sum, served, tx_frac)`` after the slot.
    """
    busy = relax.smin_const(w_sum - (w * c).sum(-1), 1.0, tau)  # [E, R] soft_busy
    n = busy.sum(-1, keepdim=True)  # [E, 1] soft count of backlogged robots
    share = num_subbands / relax.smax_const(n, 1.0, tau)
    se = relax.smin_const(torch.log2(1.0 + snr_lin / relax.smax_const(share, 1.0, tau)), se_max, tau)
    served = served + share * se * bytes_per_sb_se
    tx_frac = tx_frac + busy * relax.smin_const(share, 1.0, tau)
    c_sum = c_sum + c
    c = torch.sigmoid(relax._log_pos(served).unsqueeze(-1) / tau - log_cum)
    return c, c_sum, served, tx_frac


def _service_l1(x, w, snr_lin, cfg: CellConfig, tau, slots: str = "recompute"):
    """L1D: K UL slots with equal subband shares among backlogged robots.

    :param slots: how the slot loop is differentiated (``tau > 0``): ``"recompute"`` and
        ``"tape"``, the ``L1SlotLoop`` node recomputing or keeping the per-slot values;
        ``"autograd"``, autograd through every slot (the plain per-slot design, a baseline).

    :output: completion ``c`` ``[E, R, A]``, finish-time term ``fin`` ``[E, R, A]`` (the
        completion increase in each slot times ``(k + 1) / K``, summed; control steps),
        bytes offered ``served`` ``[E, R]``, transmit time ``tx_s`` ``[E, R]``, and ``cum``.
    """
    K = cfg.num_slots
    cum = _fifo_cum(x)
    bytes_per_sb_se = cfg.subband_hz * cfg.slot_s / 8.0
    c = relax.soft_ge(torch.zeros_like(cum), cum, tau)  # nothing served yet
    c_sum = torch.zeros_like(x)
    w_sum = w.sum(-1)
    served = torch.zeros_like(w_sum)
    tx_frac = torch.zeros_like(w_sum)
    if not relax.is_hard(tau):
        # Inside the loop the completion needs only log(served) against log(cum), computed once.
        log_cum = relax._log_pos(cum) / tau
        consts = (float(cfg.num_subbands), float(cfg.se_max), bytes_per_sb_se)
        if slots == "autograd":
            for _ in range(K):
                c, c_sum, served, tx_frac = _l1_slot(w, w_sum, c, c_sum, served, tx_frac, log_cum, snr_lin,
                                                     tau, *consts)
        else:
            keep_tape = slots == "tape"
            served, tx_frac, c_sum = L1SlotLoop.apply(w, log_cum, snr_lin, c, tau, K, *consts, keep_tape)
        c = relax.soft_ge(served.unsqueeze(-1), cum, tau)  # c_K again, exact at cum = 0
    else:
        for _ in range(K):
            busy = relax.soft_busy(w_sum - (w * c).sum(-1), tau)
            n = busy.sum(-1, keepdim=True)
            share = cfg.num_subbands / relax.smax(n, 1.0, tau)
            se = relax.smin(torch.log2(1.0 + snr_lin / relax.smax(share, 1.0, tau)), cfg.se_max, tau)
            served = served + share * se * bytes_per_sb_se
            tx_frac = tx_frac + busy * relax.smin(share, 1.0, tau)
            c_sum = c_sum + c
            c = relax.soft_ge(served.unsqueeze(-1), cum, tau)
    # sum_k (c_{k+1} - c_k) (k + 1) / K telescopes to c_K - mean_{k<K} c_k.
    fin = c - c_sum / K
    return c, fin, served, tx_frac * cfg.slot_s, cum


def _service_qa(x, w, mass_before, snr_lin, cfg: CellConfig, tau: float, tau_n: float):
    """QAD: one processor-sharing interval per step with PF gain, headroom cap and SR offset."""
    cum = _fifo_cum(x)
    total = cum[..., 0]
    busy = relax.soft_busy(w.sum(-1), tau)  # [E, R]
    n = busy.sum(-1, keepdim=True)
    share = cfg.num_subbands / relax.smax(n, 1.0, tau)
    req_lin = 10.0 ** (cfg.qa_snr_req_db / 10.0)
    m = relax.smax(relax.soft_floor(snr_lin / req_lin, cfg.num_subbands, tau_n), 1.0, tau)
    alloc = relax.smin(share.expand_as(m), m, tau)
    gain = relax.harmonic(n)
    se = relax.smin(torch.log2(1.0 + gain * snr_lin / relax.smax(alloc, 1.0, tau)), cfg.se_max, tau)
    rate = alloc * se * cfg.subband_hz / 8.0  # B/s while backlogged
    # With no robot backlogged (n = 0, G = 0) the rate is 0 and nothing is queued: avoid 0/0.
    rate = torch.where(rate > 0, rate, torch.ones_like(rate))
    sr_s = relax.soft_empty(mass_before, tau) * (cfg.qa_sr_slots * cfg.slot_s)
    avail_s = cfg.step_s - sr_s
    served = rate * avail_s
    c = relax.soft_ge(served.unsqueeze(-1), cum, tau)
    finish_s = sr_s.unsqueeze(-1) + relax.smin(cum, served.unsqueeze(-1), tau) / rate.unsqueeze(-1)
    fin = c * finish_s / cfg.step_s
    tx_s = busy * relax.smin(alloc, 1.0, tau) * relax.smin(total, served, tau) / rate
    return c, fin, served, tx_s, cum


def fluid_step(state: FluidState, send, msg_bytes, snr_db, tx_dbm, deadline, *,
               cfg: CellConfig, mode: str, tau: float, tau_n: float, compiled: bool = False,
               slots: str = "recompute"):
    """One control step of L1D or QAD as a pure function of the state.

    :input send: ``[E, R]`` send weight in [0, 1]; :input msg_bytes: ``[E, R]`` bytes;
    :input snr_db, tx_dbm, deadline: ``[E, R]``.
    :param compiled: run the step through ``torch.compile`` (both temperatures must be > 0;
        at 0 the hard operations run eager).
    :param slots: how L1D's slot loop is differentiated (see ``_service_l1``).
    :output: ``(next_state, kpis)``, kpis ``[E, R]`` as expectations.
    """
    if compiled and tau > 0 and tau_n > 0:
        x = state.x
        temps = torch.tensor([tau, tau_n], dtype=x.dtype, device=x.device)
        out = _compiled_step(mode, slots)(x, state.w, state.aoi, send, msg_bytes, snr_db, tx_dbm, deadline,
                                          temps[0], temps[1], cfg)
    else:
        out = _step(state.x, state.w, state.aoi, send, msg_bytes, snr_db, tx_dbm, deadline, tau, tau_n, cfg,
                    mode, slots)
    x, w, aoi, *values = out
    return FluidState(x, w, aoi), dict(zip(KPIS, values, strict=True))


KPIS = ("offered", "delivered", "delay_sum", "timeouts", "overflow", "aoi", "energy_j", "queued_msgs")
_COMPILED_STEPS: dict = {}


def _compiled_step(mode: str, slots: str):
    """``_step`` through ``torch.compile``: one graph per (mode, slots) and per shape and dtype,
    forward and backward each fused by inductor; the temperatures are tensor inputs."""
    key = (mode, slots)
    if key not in _COMPILED_STEPS:
        _COMPILED_STEPS[key] = torch.compile(functools.partial(_step, mode=mode, slots=slots), dynamic=False)
    return _COMPILED_STEPS[key]


def _step(x, w, aoi, send, msg_bytes, snr_db, tx_dbm, deadline, tau, tau_n, cfg: CellConfig, mode: str,
          slots: str = "recompute"):
    """The step on plain tensors: ``(x, w, aoi, *kpis in KPIS order)``."""
    A = x.shape[-1]

    # 1. Capture into the youngest slot; the buffer limit acts on the soft message count.
    mass_before = w.sum(-1)
    admit = relax.step_add(cfg.buffer_msgs - 0.5 - mass_before, tau_n)
    w0 = send * admit
    w = torch.cat([w0.unsqueeze(-1), w[..., 1:]], dim=-1)
    x = torch.cat([(w0 * msg_bytes).unsqueeze(-1), x[..., 1:]], dim=-1)
    overflow = send * (1.0 - admit)

    # 2. Service.
    snr_lin = radio.db_to_lin(snr_db)
    if mode == "L1":
        c, fin, served, tx_s, cum = _service_l1(x, w, snr_lin, cfg, tau, slots)
    else:
        c, fin, served, tx_s, cum = _service_qa(x, w, mass_before, snr_lin, cfg, tau, tau_n)
    ages = torch.arange(A, dtype=x.dtype, device=x.device)
    done = w * c  # delivered mass per age slot
    delivered = done.sum(-1)
    delay_sum = (done * ages + w * fin).sum(-1)
    x = relax.fifo_remainder(x, cum, served.unsqueeze(-1), tau)
    w = w - done

    # 3. AoI: the freshest delivered message (youngest slot first) sets it.
    not_done = 1.0 - done
    before = torch.cumprod(torch.cat([torch.ones_like(not_done[..., :1]), not_done[..., :-1]], -1), -1)
    aoi = (done * before * (ages + 1.0)).sum(-1) + (aoi + 1.0) * before[..., -1] * not_done[..., -1]

    # 4. Ageing and timeout, then the shift by one slot.
    keep = relax.survival(deadline, A, tau_n)
    timeouts = (w * (1.0 - keep)).sum(-1)
    w = w * keep
    x = x * keep
    zero = torch.zeros_like(w[..., :1])
    w = torch.cat([zero, w[..., :-1]], dim=-1)
    x = torch.cat([zero, x[..., :-1]], dim=-1)
    energy_j = radio.dbm_to_w(tx_dbm) * tx_s
    return x, w, aoi, send, delivered, delay_sum, timeouts, overflow, aoi, energy_j, w.sum(-1)


class DiffFluid:
    """Differentiable fluid model of the uplink: ``mode="L1"`` (L1D) or ``"QA"`` (QAD).

    :param tau: temperature of every relaxation (``0`` runs the hard operations); may be
        changed between steps (annealing).
    :param tau_n: temperature of the additive relaxations (buffer limit, timeout,
        headroom floor), in messages / control steps; defaults to ``tau``.
    :param compile: run each step through ``torch.compile`` (L1D and QAD; inductor fuses
        the forward into one C++ kernel and the backward into a few). Compiled once per
        process, mode, shape and dtype; the temperatures are tensor inputs, so annealing does not
        recompile. Warm-up: the first L1D step compiles K unrolled slots (about 3 min on
        one core with a cold inductor cache, under a minute with a warm one; the cache
        lives in ``TORCHINDUCTOR_CACHE_DIR``, by default ``/tmp/torchinductor_$USER``). At
        ``tau = 0`` or ``tau_n = 0`` the step runs eager (the hard operations).
    :param checkpoint: L1D's slot loop keeps only ``served`` per slot (``[K, E, R]``) and its
        backward recomputes the rest (``True``), or keeps ~12 ``[E, R]`` values per slot for a
        third fewer ops in the eager backward (``False``). ``None`` (default): keep them
        when they take at most 4 MiB per step, recompute otherwise and when compiled.
    """

    def __init__(self, E: int, R: int, device="cpu", mode: str = "L1", tau: float = 0.05,
                 tau_n: float | None = None, *, cfg: CellConfig | None = None,
                 dtype: torch.dtype = torch.float32, compile: bool = False, checkpoint: bool | None = None):
        _validate.check_dims(E, R)
        _validate.check_dtype(dtype)
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of: {', '.join(MODES)}")
        self.cfg = cfg if cfg is not None else CellConfig()
        if not isinstance(self.cfg, CellConfig):
            raise TypeError(f"cfg: expected a CellConfig, got {type(self.cfg).__name__}")
        self.E, self.R, self.mode, self.dtype = E, R, mode, dtype
        self.device = torch.device(device)
        self.tau = tau
        self.tau_n = tau_n
        self.compile = bool(compile)
        if checkpoint not in (None, True, False):
            raise TypeError(f"checkpoint: expected True, False or None, got {checkpoint!r}")
        if checkpoint is None:
            tape_bytes = TENSORS_PER_SLOT * E * R * self.cfg.num_slots * torch.finfo(dtype).bits // 8
            checkpoint = self.compile or tape_bytes > 4 * 2**20
        # "recompute" / "tape": the slot loop's custom backward; "autograd" (set by the
        # benchmarks): autograd through every slot, the plain per-slot design.
        self.slots = "recompute" if checkpoint else "tape"
        A = self.cfg.timeout_steps
        z = torch.zeros(E, R, A, dtype=dtype, device=self.device)
        self.state = FluidState(z, z.clone(), torch.zeros(E, R, dtype=dtype, device=self.device))

    @property
    def tau(self) -> float:
        return self._tau

    @tau.setter
    def tau(self, value: float) -> None:
        value = float(value)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"tau: expected a finite temperature >= 0, got {value}")
        self._tau = value

    @property
    def tau_n(self) -> float:
        return self._tau if self._tau_n is None else self._tau_n

    @tau_n.setter
    def tau_n(self, value: float | None) -> None:
        if value is not None:
            value = float(value)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"tau_n: expected a finite temperature >= 0 or None, got {value}")
        self._tau_n = value

    def reset(self, env_ids=None) -> None:
        """Re-initialise the envs ``env_ids`` (all when None: a fresh state with no history).

        Out of place: the other envs keep their values and their gradient history.
        """
        if env_ids is None:  # a fresh state: no link to the previous graph
            z = torch.zeros_like(self.state.x, requires_grad=False)
            self.state = FluidState(z, z.clone(), torch.zeros_like(self.state.aoi, requires_grad=False))
            return
        mask = _validate.env_mask(env_ids, self.E, self.device)
        s = self.state
        m3 = mask[:, None, None]
        self.state = FluidState(
            x=torch.where(m3, torch.zeros_like(s.x), s.x),
            w=torch.where(m3, torch.zeros_like(s.w), s.w),
            aoi=torch.where(mask[:, None], torch.zeros_like(s.aoi), s.aoi),
        )

    def detach(self) -> None:
        """Truncate backpropagation through time: later losses see the state as a constant."""
        self.state = self.state.detach()

    def step(self, send, msg_bytes, snr_db=None, pos=None, tx_dbm=None, deadline=None) -> dict:
        """Advance one control step; returns the per-step KPIs as expectations.

        :input send: ``[E, R]`` send weight in [0, 1] (probability, relaxed or binary sample).
        :input msg_bytes: ``[E, R]`` message size, bytes (> 0).
        :input snr_db: ``[E, R]`` dB, or :input pos: ``[E, R, 2]`` m with :input tx_dbm: ``[E, R]`` dBm.
        :input deadline: ``[E, R]`` continuous, in ``[1, timeout_steps]`` control steps.
        :output: dict of ``[E, R]`` tensors: offered, delivered, delay_sum, timeouts,
            overflow, aoi, energy_j, queued_msgs.
        """
        send = _validate.per_robot(send, "send", self.E, self.R, self.dtype, self.device)
        _validate.check_range(send, "send", 0.0, 1.0, "send weights in [0, 1]")
        return self.advance(send, *self.inputs(msg_bytes, snr_db, pos, tx_dbm, deadline))

    def inputs(self, msg_bytes, snr_db=None, pos=None, tx_dbm=None, deadline=None) -> tuple:
        """Check the per-step inputs once: ``(msg_bytes, snr_db, tx_dbm, deadline)``, each ``[E, R]``.

        ``pos`` goes through the radio model here, so a rollout with constant positions
        computes (and differentiates) the path loss once rather than at every step.
        """
        E, R, dt, dev, cfg = self.E, self.R, self.dtype, self.device, self.cfg
        msg_bytes = _validate.per_robot(msg_bytes, "msg_bytes", E, R, dt, dev)
        if bool((msg_bytes <= 0).any()):
            raise ValueError("msg_bytes: expected sizes > 0 bytes")
        snr, tx = _validate.radio_inputs(snr_db, pos, tx_dbm, cfg, E, R, dt, dev)
        dl = _validate.deadline_steps(deadline, cfg, E, R, dt, dev, integer=False)
        return msg_bytes, snr, tx, dl

    def advance(self, send, msg_bytes, snr_db, tx_dbm, deadline) -> dict:
        """``step`` on inputs already checked by :meth:`inputs` (``send`` ``[E, R]`` in [0, 1]).

        No checks: the loop of ``rollout``, where the inputs are checked once.
        """
        self.state, kpis = fluid_step(self.state, send, msg_bytes, snr_db, tx_dbm, deadline, cfg=self.cfg,
                                      mode=self.mode, tau=self.tau, tau_n=self.tau_n, compiled=self.compile,
                                      slots=self.slots)
        return kpis
