"""Cell constants shared by every level and relaxation (docs/design.md §1)."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class CellConfig:
    """Constants of one cell. Frozen: build a new one with ``dataclasses.replace``.

    A control step of ``step_s`` seconds holds ``num_slots`` uplink slots of
    ``slot_s = step_s / num_slots``.
    """

    step_s: float = 0.020  # control step, s
    num_slots: int = 40  # K: UL slots per control step (0.5 ms each)
    num_subbands: int = 12  # S: subbands shared by the robots of a cell
    subband_hz: float = 1.44e6  # subband width, Hz (4 PRBs at 30 kHz SCS)
    se_max: float = 5.5  # spectral-efficiency cap, b/s/Hz
    buffer_msgs: int = 8  # F: at most F messages queued per robot
    timeout_steps: int = 10  # A: age buffer length; a deadline may not exceed it
    fc_ghz: float = 3.5  # carrier, GHz
    noise_figure_db: float = 9.0  # gNB noise figure, dB
    tx_dbm: float = 23.0  # default transmit power, dBm
    qa_snr_req_db: float = 15.0  # QA power headroom: per-subband SNR a robot must keep, dB
    qa_sr_slots: int = 4  # QA scheduling-request offset, slots
    # Calibration constants (docs/design.md, "Calibration"): effective physics of the fluid levels
    # L1 and QA (and so of L1D and QAD) fitted to L2-legacy; the defaults are the plain fluid physics.
    rate_factor: float = 1.0  # capacity factor on the bytes a backlogged robot is served
    snr_offset_db: float = 0.0  # added to the SNR that sets the spectral efficiency (not the energy), dB
    l1_sr_slots: int = 0  # L1 latency floor: a robot whose queue was empty starts service this late, slots
    # Time on air (L1, QA): the band-rate time times air_factor * max(n, 1)^air_crowd_exp, n the
    # robots backlogged in the cell, capped at the step (on_air_s; docs/design.md, "Energy in a crowd").
    air_factor: float = 1.0  # factor on a robot's time on air
    air_crowd_exp: float = 0.0  # exponent of the robots backlogged on the time on air
    # Mean-field sends (DiffFluid's rollout only): the cell's offered load spread per step as binary
    # sends' binomial spread times load_spread (relax.spread_sends; docs/design.md, "Calibration").
    load_spread: float = 0.0  # scale of the mean-field sends' load spread (0: p at every step)
    # Mean-field sends (QAD): a robot holding an expected m messages is backlogged with the chance
    # 1 - exp(-m) of a Poisson count and then holds whole messages (relax.backlog_closure;
    # docs/design.md, "Calibration", probe (22)). Off: QAD's own backlog weight smin(m, 1).
    mf_backlog_closure: bool = False
    # QA's interval (QA and QAD): the share of the band's time of a robot not being served (its queue
    # drained, or its scheduling request pending) that goes to the robots being served; 0: each robot's
    # share held for the step (docs/design.md, "Calibration", probe (26)).
    qa_reshare: float = 0.0
    # QA's spectral efficiency (QA and QAD): a robot's power is spread over at least this many subbands
    # (its share of the band, or more: L2-legacy's PF grants a backlogged robot the subbands its buffer
    # needs, more than its even share in a crowd); 1: QA's rule (docs/design.md, "Calibration", (33)).
    qa_min_grant_subbands: float = 1.0

    def __post_init__(self) -> None:
        positive = ("step_s", "subband_hz", "se_max", "fc_ghz", "rate_factor", "air_factor")
        for name in positive:
            value = getattr(self, name)
            if not (_is_real(value) and math.isfinite(value) and value > 0):
                raise ValueError(f"CellConfig.{name} must be a finite number > 0, got {value!r}")
        at_least_one = ("num_slots", "num_subbands", "buffer_msgs", "timeout_steps")
        for name in at_least_one:
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"CellConfig.{name} must be an integer >= 1, got {value!r}")
        # An SR offset of num_slots is allowed: a robot that was empty is then not served that step.
        for name in ("qa_sr_slots", "l1_sr_slots"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= self.num_slots):
                raise ValueError(f"CellConfig.{name} must be an integer in [0, num_slots], got {value!r}")
        if not isinstance(self.mf_backlog_closure, bool):
            raise ValueError(f"CellConfig.mf_backlog_closure must be a bool, got {self.mf_backlog_closure!r}")
        if self.mf_backlog_closure and self.qa_reshare != 0:
            raise ValueError(f"CellConfig.qa_reshare must be 0 with mf_backlog_closure "
                             f"({RESHARE_WITH_CLOSURE_WHY}), got {self.qa_reshare!r}")
        for name in ("noise_figure_db", "tx_dbm", "qa_snr_req_db", "snr_offset_db", "air_crowd_exp",
                     "load_spread", "qa_reshare", "qa_min_grant_subbands"):
            value = getattr(self, name)
            if not (_is_real(value) and math.isfinite(value)):
                raise ValueError(f"CellConfig.{name} must be a finite number, got {value!r}")
        grant = self.qa_min_grant_subbands
        if not 1.0 <= grant <= self.num_subbands:
            raise ValueError(f"CellConfig.qa_min_grant_subbands must lie in [1, "
                             f"num_subbands={self.num_subbands}] (subbands a robot's power is spread over), "
                             f"got {grant!r}")
        for name, (lo, hi, unit) in PHYSICAL_RANGES.items():
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"CellConfig.{name} must lie in [{lo:g}, {hi:g}]{unit}, got {value!r}: "
                                 f"{_RANGE_WHY[name]}")

    @property
    def slot_s(self) -> float:
        """Duration of one UL slot, s."""
        return self.step_s / self.num_slots

    @property
    def bytes_per_se_s(self) -> float:
        """Bytes a robot is served per second, per subband and per b/s/Hz of spectral efficiency
        (``subband_hz / 8`` times the capacity factor ``rate_factor``)."""
        return self.subband_hz * self.rate_factor / 8.0

    @property
    def bytes_per_se_slot(self) -> float:
        """``bytes_per_se_s`` over one UL slot."""
        return self.subband_hz * self.rate_factor * self.slot_s / 8.0

    @property
    def air_is_plain(self) -> bool:
        """Whether the time on air is the band-rate time itself (``air_factor`` 1, ``air_crowd_exp``
        0): the levels then skip the crowd factor and the cap, which leave it unchanged."""
        return self.air_factor == 1.0 and self.air_crowd_exp == 0.0

    @property
    def is_calibrated(self) -> bool:
        """Whether a constant that exists only for calibration (``CALIBRATION_ONLY``) differs from
        its plain-physics default."""
        return any(getattr(self, name) != _DEFAULTS[name] for name in CALIBRATION_ONLY)

    @property
    def noise_dbm(self) -> float:
        """Thermal noise in one subband at the gNB, dBm."""
        return -174.0 + 10.0 * math.log10(self.subband_hz) + self.noise_figure_db


#: The constants that exist only for calibration: at their defaults they are the plain fluid
#: physics, and a cell that differs in any of them is calibrated (``CellConfig.is_calibrated``).
CALIBRATION_ONLY = ("rate_factor", "snr_offset_db", "l1_sr_slots", "air_factor", "air_crowd_exp",
                    "load_spread", "mf_backlog_closure", "qa_reshare", "qa_min_grant_subbands")
#: Every constant a calibration sets: those, and QA's own SR offset and headroom requirement, which
#: the plain model has physical values of and a calibration refits (so a cell that differs in
#: them alone is not calibrated).
CALIBRATED_FIELDS = (*CALIBRATION_ONLY, "qa_sr_slots", "qa_snr_req_db")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(CellConfig)}

#: Transmit power, dBm (10 nW .. 1 kW): the range every level and DiffFluid accept as an input too.
TX_DBM_RANGE = (-50.0, 60.0)

#: Why a share of an idle robot's time cannot go with QAD's backlog closure (CellConfig's words and
#: the calibration's, ``calibrate.store.check_reshare``).
RESHARE_WITH_CLOSURE_WHY = "the closure's service holds each robot's share"

#: The physical range of each constant, ``(lo, hi, unit)``: generous around any real cell, and
#: narrow enough that the models stay finite in float32 (gradients included) and their buffers
#: allocate. Out of it a ValueError naming the field (``_RANGE_WHY`` says why the bound).
PHYSICAL_RANGES = {
    "step_s": (1e-6, 60.0, " s"),
    "num_slots": (1, 10_000, " slots"),
    "num_subbands": (1, 1_000, " subbands"),
    "subband_hz": (1e3, 1e9, " Hz"),
    "se_max": (1e-3, 20.0, " b/s/Hz"),
    "buffer_msgs": (1, 1_000, " messages"),
    "timeout_steps": (1, 1_000, " control steps"),
    "fc_ghz": (0.1, 100.0, " GHz"),
    "noise_figure_db": (0.0, 30.0, " dB"),
    "tx_dbm": (*TX_DBM_RANGE, " dBm"),
    "qa_snr_req_db": (-30.0, 60.0, " dB"),
    "rate_factor": (1e-3, 10.0, ""),
    "snr_offset_db": (-60.0, 60.0, " dB"),
    "air_factor": (1e-3, 100.0, ""),
    "air_crowd_exp": (-2.0, 2.0, ""),
    "load_spread": (0.0, 4.0, ""),
    "qa_reshare": (0.0, 1.0, ""),
}
_RANGE_WHY = {
    "step_s": "a control step from a microsecond to a minute (beyond, the delays and energies leave float32)",
    "num_slots": "UL slots per control step (each one a slot of L1D's loop)",
    "num_subbands": "subbands of one carrier (NR has at most 275 resource blocks)",
    "subband_hz": "a subband from 1 kHz to 1 GHz",
    "se_max": "a spectral-efficiency cap of a real modulation (NR's 1024-QAM: ~9 b/s/Hz)",
    "buffer_msgs": "messages queued per robot (the discrete levels allocate [E, R, F])",
    "timeout_steps": "age slots per robot (every model allocates [E, R, A])",
    "fc_ghz": "a carrier of the UMi path-loss law (0.5 .. 100 GHz) with margin",
    "noise_figure_db": "a receiver's noise figure is >= 0 dB",
    "tx_dbm": "the transmit powers every level accepts as inputs",
    "qa_snr_req_db": "a per-subband SNR requirement (10^(dB/10) must stay finite in float32)",
    "rate_factor": "a capacity factor of order one (calibrations fit 0.05 .. 2)",
    "snr_offset_db": "an offset that keeps the rate SNR finite in float32 (calibrations fit about -12 .. 4)",
    "air_factor": "a factor on the time on air of order one (calibrations fit about 0.3 .. 3)",
    "air_crowd_exp": "an exponent of the robots backlogged (64^2 keeps the time on air finite)",
    "load_spread": "a scale of the binomial load spread (1 is binary sends' own; 0 none)",
    "qa_reshare": "a share of a robot's time (0: none goes to the others; 1: all of it)",
}


def _is_real(value) -> bool:
    """A Python int or float, not a bool (``True`` is an int to Python, not a step length)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
