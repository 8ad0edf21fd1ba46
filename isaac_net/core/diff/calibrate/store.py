"""A fitted calibration (:class:`Calibration`) and its file: save, load and the checks of every
field of an entry read back.

A calibration file is a JSON object ``{"format": FORMAT, "version": VERSION, "calibrations": [...]}``
with one entry per ``(mode, sends)``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path

from isaac_net.core.config import CALIBRATED_FIELDS, PHYSICAL_RANGES, RESHARE_WITH_CLOSURE_WHY, CellConfig
from isaac_net.core.diff.calibrate.targets import (
    _check_points,
    _is_integer,
    _is_number,
    _one_fleet_size,
    fleet_sizes,
)
from isaac_net.core.diff.model import MODES, DiffFluid, mode_spec
from isaac_net.core.levels import L2LegacyConfig

FORMAT = "isaac_net.calibration"
VERSION = 1
#: The send relaxations a calibration is fitted for (``rollout``'s ``sends`` but ``"binary"``).
CALIBRATED_SENDS = ("mean_field", "relaxed")
_WARNED: set = set()


def check_backlog_closure(closure, mode: str, sends: str) -> None:
    """Refuse a backlog closure (``CellConfig.mf_backlog_closure``) that is not a bool, or True for
    another model than QAD with mean-field sends (it lives in QAD's service, and a sampled robot holds
    whole messages already): a ValueError naming ``mf_backlog_closure``."""
    if not isinstance(closure, bool):
        raise ValueError(f"mf_backlog_closure: expected a bool, got {closure!r}")
    if closure and (mode != "QA" or sends != "mean_field"):
        raise ValueError(f"mf_backlog_closure: QAD's with mean-field sends; expected False for mode {mode!r} "
                         f"and sends {sends!r}")


def _check_in_range(name: str, value) -> None:
    """Refuse a value of the cell's constant ``name`` that is not a finite number in its range
    (``config.PHYSICAL_RANGES``, which :meth:`Calibration.apply` would refuse later): a ValueError
    naming it."""
    lo, hi, _ = PHYSICAL_RANGES[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and lo <= value <= hi):
        raise ValueError(f"{name}: expected a finite number in [{lo:g}, {hi:g}], got {value!r}")


def check_reshare(reshare, mode: str, closure: bool = False) -> None:
    """Refuse a re-shared share of an idle robot's time (``CellConfig.qa_reshare``) outside the cell's
    range for it (``config.PHYSICAL_RANGES``), or one > 0 for another mode than QA (it lives in QA's
    interval) or with the backlog closure ``closure`` (``CellConfig.mf_backlog_closure``): a
    ValueError naming ``qa_reshare``."""
    _check_in_range("qa_reshare", reshare)
    if reshare > 0 and mode != "QA":
        raise ValueError(f"qa_reshare: a share of QA's interval; expected 0 for mode {mode!r}, "
                         f"got {reshare!r}")
    if reshare > 0 and closure:
        raise ValueError(f"qa_reshare: expected 0 with mf_backlog_closure ({RESHARE_WITH_CLOSURE_WHY}), "
                         f"got {reshare!r}")


def check_grant(grant, mode: str, num_subbands: int) -> None:
    """Refuse a fewest number of subbands a robot's power is spread over
    (``CellConfig.qa_min_grant_subbands``) outside [1, ``num_subbands``], or one other than 1 for another
    mode than QA (it lives in QA's spectral efficiency): a ValueError naming ``qa_min_grant_subbands``."""
    if isinstance(grant, bool) or not isinstance(grant, (int, float)) or not (
            math.isfinite(grant) and 1 <= grant <= num_subbands):
        raise ValueError(f"qa_min_grant_subbands: expected a number of subbands in [1, "
                         f"num_subbands={num_subbands}], got {grant!r}")
    if grant != 1 and mode != "QA":
        raise ValueError(f"qa_min_grant_subbands: a rule of QA's spectral efficiency; expected 1 for mode "
                         f"{mode!r}, got {grant!r}")


def check_load_spread(spread, sends: str) -> None:
    """Refuse a load spread (``CellConfig.load_spread``'s scale) outside the cell's range for it
    (``config.PHYSICAL_RANGES``, which :meth:`Calibration.apply` would refuse later), or one > 0 for
    sends other than mean-field (a relaxed rollout would ignore it): a ValueError naming
    ``load_spread``."""
    _check_in_range("load_spread", spread)
    if spread > 0 and sends != "mean_field":
        raise ValueError(f"load_spread: a load spread of mean-field sends; expected 0 for "
                         f"sends={sends!r}, got {spread!r}")


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Effective constants of one model (``mode``, ``sends``) fitted to L2-legacy, and what they
    were fitted for. Frozen; build with :func:`fit` or :meth:`load`.

    :field rate_factor, snr_offset_db, sr_slots: the constants (``sr_slots``: ``l1_sr_slots``
        for L1D, ``qa_sr_slots`` for QAD).
    :field qa_snr_req_db: QAD's per-subband SNR requirement of its headroom rule, dB (None: not
        fitted, the cell's own; always None for L1D).
    :field tau: the relaxation temperature they were fitted at, the model's to run at:
        ``DiffFluid(..., tau=cal.tau, cfg=cal.apply(cfg))`` (another temperature moves the operating
        point). An entry without one was fitted at a single temperature: the fit's ``setup["tau"]``.
    :field train_loss, heldout_loss: mean point loss on the training grid and on the held-out
        points (None without them, or for constants interpolated between fleet sizes), calibrated;
        ``uncalibrated_*``: the same for the plain model.
    :field grid, heldout_grid: the points ``(p, msg_bytes, tx_dbm)``.
    :field R: the fleet sizes (robots per cell) of the training cells, a tuple (a file with one
        integer gives a tuple of one).
    :field area_m: the square of the positions, m.
    :field cell, l2_config: the ``CellConfig`` the constants apply to and the ``L2LegacyConfig``
        they were fitted against, as dicts.
    :field setup: the fit's settings (T, warmup, the plain model's tau, lam, envs, seed, search
        grid, loss weights, the slope term's weight and number of pairs).
    :field gradient_check: the record of :func:`~.evaluate.check_gradients` on the fitted constants
        at the training points (``stable``, the worst error and where) and the choices ``rejected``
        for unusable gradients; None: not checked.
    :field air_factor, air_crowd_exp: the time on air's factor and the exponent of the robots
        backlogged (``CellConfig``'s; 1 and 0, the plain rule, in an entry fitted without them).
    :field load_spread: the scale of mean-field sends' load spread (``CellConfig``'s; 0, none, for
        relaxed sends and in an entry fitted without it).
    :field mf_backlog_closure: QAD mean-field's backlog closure (``CellConfig``'s; False in an entry
        fitted without it).
    :field qa_reshare: the share of an idle robot's time QAD's interval gives the others
        (``CellConfig``'s; 0 in an entry fitted without it).
    :field qa_min_grant_subbands: the fewest subbands QAD spreads a robot's power over
        (``CellConfig``'s; 1, QA's rule, in an entry fitted without it).
    """

    mode: str
    sends: str
    rate_factor: float
    snr_offset_db: float
    sr_slots: int
    train_loss: float | None
    heldout_loss: float | None
    uncalibrated_train_loss: float
    uncalibrated_heldout_loss: float | None
    grid: tuple
    heldout_grid: tuple
    R: tuple
    area_m: tuple
    cell: dict
    l2_config: dict
    setup: dict
    gradient_check: dict | None = None
    tau: float | None = None
    qa_snr_req_db: float | None = None
    provenance: dict = dataclasses.field(default_factory=dict)
    air_factor: float = 1.0
    air_crowd_exp: float = 0.0
    load_spread: float = 0.0
    mf_backlog_closure: bool = False
    qa_reshare: float = 0.0
    qa_min_grant_subbands: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "R", fleet_sizes(self.R))
        if self.tau is None:  # an entry fitted at a single temperature: the fit's own
            object.__setattr__(self, "tau", float(self.setup["tau"]))
        if not (isinstance(self.tau, (int, float)) and math.isfinite(self.tau) and self.tau > 0):
            raise ValueError(f"tau: expected a finite temperature > 0, got {self.tau!r}")
        req = self.qa_snr_req_db
        is_db = isinstance(req, (int, float)) and not isinstance(req, bool) and math.isfinite(req)
        with_rule = [m for m, spec in MODES.items() if spec.snr_req_field is not None]  # QA
        if req is not None and (self.mode not in with_rule or not is_db):
            modes = " or ".join(map(repr, with_rule))
            raise ValueError(f"qa_snr_req_db: expected None or, for mode {modes}, a finite number of dB; "
                             f"got {req!r}")
        check_load_spread(self.load_spread, self.sends)
        check_backlog_closure(self.mf_backlog_closure, self.mode, self.sends)
        check_reshare(self.qa_reshare, self.mode, self.mf_backlog_closure)
        check_grant(self.qa_min_grant_subbands, self.mode,
                    int(self.cell.get("num_subbands", CellConfig.num_subbands)))

    @property
    def constants(self) -> dict:
        """The ``CellConfig`` fields this calibration sets, by name."""
        spec = mode_spec(self.mode)
        out = {
            "rate_factor": self.rate_factor,
            "snr_offset_db": self.snr_offset_db,
            spec.sr_field: self.sr_slots,
        }
        if self.qa_snr_req_db is not None:
            out[spec.snr_req_field] = self.qa_snr_req_db
        out["air_factor"], out["air_crowd_exp"] = self.air_factor, self.air_crowd_exp
        out["load_spread"] = self.load_spread
        out["mf_backlog_closure"] = self.mf_backlog_closure
        out["qa_reshare"] = self.qa_reshare
        out["qa_min_grant_subbands"] = self.qa_min_grant_subbands
        return out

    def apply(
        self,
        cfg: CellConfig | None = None,
        *,
        R: int | None = None,
        area_m=None,
        l2_config: L2LegacyConfig | None = None,
    ) -> CellConfig:
        """``cfg`` (default ``CellConfig()``) with this calibration's constants; run the model at
        :attr:`tau` (the temperature is the model's, not the cell's).

        Name what it is used for to have it checked: another ``R`` or ``area_m`` than fitted for
        is allowed and warns once (the held-out points measure how well it transfers; ``R`` counts
        as fitted for when it is one of the fleet sizes of the fit); a cell
        that differs in other constants warns once too; another ``l2_config`` than it was fitted
        against is refused (``ValueError``).
        """
        cfg = CellConfig() if cfg is None else cfg
        if not isinstance(cfg, CellConfig):
            raise TypeError(f"cfg: expected a CellConfig, got {type(cfg).__name__}")
        if l2_config is not None:
            if not isinstance(l2_config, L2LegacyConfig):
                raise TypeError(f"l2_config: expected an L2LegacyConfig, got {type(l2_config).__name__}")
            theirs = _jsonable(dataclasses.asdict(l2_config))
            if theirs != self.l2_config:
                diff = sorted(k for k in theirs if theirs[k] != self.l2_config.get(k))
                raise ValueError(
                    f"l2_config: this calibration ({self.mode}, {self.sends}) was fitted against "
                    f"another L2LegacyConfig (differs in {', '.join(diff)}); refit it"
                )
        if R is not None:
            R = _one_fleet_size(R)
        differs = []
        if R is not None and R not in self.R:
            differs.append(f"R = {R} (fitted for {' and '.join(map(str, self.R))})")
        if area_m is not None and tuple(float(a) for a in area_m) != tuple(self.area_m):
            differs.append(f"area_m = {list(area_m)} (fitted for {list(self.area_m)})")
        mine = {k: v for k, v in _jsonable(dataclasses.asdict(cfg)).items() if k not in CALIBRATED_FIELDS}
        base = {k: v for k, v in self.cell.items() if k not in CALIBRATED_FIELDS}
        cell_diff = sorted(k for k in mine if mine[k] != base.get(k))
        if cell_diff:
            differs.append(f"cell constants {', '.join(cell_diff)} differ from those fitted on")
        key = (self.mode, self.sends, tuple(self.constants.items()), self.tau, tuple(differs))
        if differs and key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(
                f"calibration ({self.mode}, {self.sends}) used outside what it was fitted for: "
                + "; ".join(differs),
                stacklevel=2,
            )
        return dataclasses.replace(cfg, **self.constants)

    def at(self, R: int) -> "Calibration":
        """This calibration, for ``R`` robots per cell (a :class:`~.fleet.FleetCalibration` gives the
        constants of the size asked; one fitted on one set of sizes is the same at every ``R``, and
        :meth:`apply` with ``R=`` warns outside them)."""
        _one_fleet_size(R)
        return self

    def model(self, E: int, R: int, device="cpu", *, cfg: CellConfig | None = None, area_m=None,
              l2_config: L2LegacyConfig | None = None, **kwargs) -> DiffFluid:
        """The calibrated model as fitted: ``DiffFluid(E, R, device, mode=self.mode, tau=self.tau,
        cfg=self.apply(cfg, R=R, area_m=area_m, l2_config=l2_config), **kwargs)`` (``kwargs``: the
        rest of ``DiffFluid``'s, e.g. ``dtype``, ``compile``). Roll it out with ``sends=self.sends``."""
        if "mode" in kwargs or "tau" in kwargs:
            raise TypeError("model: mode and tau are the calibration's "
                            "(build DiffFluid yourself to change them)")
        return DiffFluid(E, R, device, mode=self.mode, tau=self.tau,
                         cfg=self.apply(cfg, R=R, area_m=area_m, l2_config=l2_config), **kwargs)

    def to_dict(self) -> dict:
        return _jsonable(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict, source: str = "the dict") -> "Calibration":
        """A calibration from its dict (:meth:`to_dict`, an entry of a calibration file), every field
        checked: a ValueError or TypeError names ``source`` (the file) and the field."""
        if not isinstance(d, dict):
            raise TypeError(f"{source}: expected a calibration entry (a JSON object), got {type(d).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        optional = ("provenance", "gradient_check", "tau", "qa_snr_req_db", "air_factor", "air_crowd_exp",
                    "load_spread", "mf_backlog_closure", "qa_reshare", "qa_min_grant_subbands")
        missing = [n for n in names if n not in d and n not in optional]
        if missing:
            raise ValueError(f"{source}: a calibration entry lacks {', '.join(missing)}")
        kw = {n: d[n] for n in names if n in d}
        _check_fields(kw, source)
        kw["grid"] = tuple(tuple(pt) for pt in kw["grid"])
        kw["heldout_grid"] = tuple(tuple(pt) for pt in kw["heldout_grid"])
        kw["area_m"] = tuple(kw["area_m"])
        try:
            return cls(**kw)
        except (TypeError, ValueError) as err:  # the checks of __post_init__ (R, tau, qa_snr_req_db)
            raise type(err)(f"{source}: {err}") from None

    def save(self, path) -> None:
        """Write this calibration into the calibration file ``path``, replacing an entry of the same
        ``(mode, sends)`` and fleet sizes and keeping the others (a new file when there is none)."""
        path = Path(path)
        entries = _read_file(path) if path.exists() else []
        mine = (self.mode, self.sends, list(self.R))
        entries = [e for e in entries if (e["mode"], e["sends"], list(fleet_sizes(e["R"]))) != mine] + [
            self.to_dict()
        ]
        save_all(path, entries)

    @classmethod
    def load(cls, path, *, mode: str, sends: str):
        """The calibration of ``(mode, sends)`` from the calibration file ``path`` (or from several,
        a sequence of paths, e.g. the pipeline's one fit file per model and fleet size): a
        :class:`Calibration`, or a :class:`~.fleet.FleetCalibration` when the files hold fits of it at
        several fleet sizes (one entry each). Either gives the constants for ``R`` robots per cell
        with ``.at(R)``, ``.apply(cfg, R=R)`` and ``.model(E, R)``."""
        _check_model(mode, sends)
        paths = [path] if isinstance(path, (str, Path)) else list(path)
        if not paths or any(not isinstance(p, (str, Path)) for p in paths):
            raise TypeError(f"path: expected a calibration file's path or a non-empty sequence of them, "
                            f"got {path!r}")
        source = str(paths[0]) if len(paths) == 1 else f"{[str(p) for p in paths]}"
        entries = [(e, str(p)) for p in paths for e in _read_file(Path(p))]
        mine = [cls.from_dict(e, src) for e, src in entries if (e["mode"], e["sends"]) == (mode, sends)]
        if len(mine) == 1:
            return mine[0]
        if mine:
            from isaac_net.core.diff.calibrate.fleet import FleetCalibration

            try:
                return FleetCalibration(mode, sends, tuple(mine))
            except ValueError as err:
                raise ValueError(f"{source}: {err}") from None
        have = ", ".join(f"({e.get('mode')}, {e.get('sends')})" for e, _ in entries) or "none"
        raise ValueError(f"{source}: no calibration for mode={mode!r}, sends={sends!r}; "
                         f"the file holds: {have}")


def save_all(path, calibrations) -> None:
    """Write several calibrations (``Calibration``, ``FleetCalibration`` or their dicts) as one
    calibration file.

    A non-finite number (a loss or a gradient check's error of inf) is written as JSON's
    extension ``Infinity`` / ``NaN``, which :meth:`Calibration.load` reads back as it was."""
    entries = []
    for c in calibrations:  # a FleetCalibration is one entry per fleet size
        one = c.to_dict() if isinstance(c, Calibration) else c
        entries += c.to_dicts() if hasattr(c, "to_dicts") else [one]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(
        json.dumps({"format": FORMAT, "version": VERSION, "calibrations": entries}, indent=1, allow_nan=True)
        + "\n"
    )


def _field_error(source: str, name: str, expected: str, value, kind=ValueError):
    return kind(f"{source}: calibration field {name!r}: expected {expected}, got {value!r}")


def _checked_field(source: str, name: str, check, *args) -> None:
    """Run the shared ``check(*args)`` of field ``name``; its ValueError again with ``source`` and the
    field before the check's own words (which start with the field's name)."""
    try:
        check(*args)
    except ValueError as err:
        raise ValueError(f"{source}: calibration field {name!r}: {str(err).partition(': ')[2]}") from None


def _check_fields(kw: dict, source: str) -> None:
    """Every field of a calibration entry of the right type and range (the error names ``source``
    and the field). A loss may be inf (a point the model could not meet) or null (none measured,
    or written as null by a strict-JSON writer such as the pipeline's artifacts)."""
    def number(name, *, finite=True, optional=False, lo=None, lo_open=False):
        v = kw.get(name)
        if v is None and optional:
            return
        what = "a finite number" if finite else "a number"
        what += "" if lo is None else f" {'>' if lo_open else '>='} {lo:g}"
        what += " or null" if optional else ""
        if not _is_number(v):
            raise _field_error(source, name, what, v, TypeError)
        if math.isnan(v) or (finite and not math.isfinite(v)) or (
                lo is not None and (v <= lo if lo_open else v < lo)):
            raise _field_error(source, name, what, v)

    for name in ("mode", "sends"):
        allowed = list(MODES) if name == "mode" else CALIBRATED_SENDS
        if kw[name] not in allowed:
            raise _field_error(source, name, f"one of {list(allowed)}", kw[name])
    number("rate_factor", lo=0.0, lo_open=True)
    number("snr_offset_db")
    if "air_factor" in kw:  # absent in an entry fitted without the time on air's constants
        number("air_factor", lo=0.0, lo_open=True)
    if "air_crowd_exp" in kw:
        number("air_crowd_exp")
    # absent in an entry fitted without them; the shared checks' words after the file's and the field's
    if "load_spread" in kw:
        _checked_field(source, "load_spread", check_load_spread, kw["load_spread"], kw["sends"])
    if "mf_backlog_closure" in kw:
        _checked_field(source, "mf_backlog_closure", check_backlog_closure, kw["mf_backlog_closure"],
                       kw["mode"], kw["sends"])
    if "qa_reshare" in kw:
        _checked_field(source, "qa_reshare", check_reshare, kw["qa_reshare"], kw["mode"],
                       kw.get("mf_backlog_closure", False))
    if "qa_min_grant_subbands" in kw:
        cell = kw.get("cell") if isinstance(kw.get("cell"), dict) else {}
        _checked_field(source, "qa_min_grant_subbands", check_grant, kw["qa_min_grant_subbands"], kw["mode"],
                       int(cell.get("num_subbands", CellConfig.num_subbands)))
    if not _is_integer(kw["sr_slots"]) or kw["sr_slots"] < 0:
        raise _field_error(source, "sr_slots", "an integer >= 0 (slots)", kw["sr_slots"],
                           TypeError if not _is_integer(kw["sr_slots"]) else ValueError)
    for name in ("train_loss", "uncalibrated_train_loss", "heldout_loss", "uncalibrated_heldout_loss"):
        number(name, finite=False, optional=True, lo=0.0)
    for name in ("grid", "heldout_grid"):
        v = kw[name]
        if not isinstance(v, (list, tuple)):
            raise _field_error(source, name, "a list of points [p, msg_bytes, tx_dbm]", v, TypeError)
        if not all(isinstance(pt, (list, tuple)) for pt in v):
            raise _field_error(source, name, "a list of points [p, msg_bytes, tx_dbm]", v, TypeError)
        try:
            _check_points(v, repr(name), allow_empty=name == "heldout_grid")
        except (TypeError, ValueError) as err:
            raise type(err)(f"{source}: calibration field {err}") from None
    try:
        fleet_sizes(kw["R"])
    except (TypeError, ValueError) as err:
        raise type(err)(f"{source}: calibration field {err}") from None
    area = kw["area_m"]
    if not (isinstance(area, (list, tuple)) and len(area) == 2 and all(_is_number(a) for a in area)
            and all(math.isfinite(a) for a in area) and 0 <= area[0] < area[1]):
        raise _field_error(source, "area_m", "[low, high] m with 0 <= low < high", area)
    cell = kw["cell"]
    if not isinstance(cell, dict):
        raise _field_error(source, "cell", "the CellConfig fitted on, as an object", cell, TypeError)
    try:
        CellConfig(**cell)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{source}: calibration field 'cell': not a valid CellConfig: {err}") from None
    l2 = kw["l2_config"]
    if not isinstance(l2, dict):
        raise _field_error(source, "l2_config", "the L2LegacyConfig fitted against, as an object", l2,
                           TypeError)
    try:
        L2LegacyConfig(**l2)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{source}: calibration field 'l2_config': not a valid L2LegacyConfig: "
                         f"{err}") from None
    if not isinstance(kw["setup"], dict):
        raise _field_error(source, "setup", "the fit's settings, as an object", kw["setup"], TypeError)
    number("tau", optional=True, lo=0.0, lo_open=True)
    if kw.get("tau") is None:  # an entry fitted at a single temperature: the fit's own
        t = kw["setup"].get("tau")
        if not (_is_number(t) and math.isfinite(t) and t > 0):
            raise _field_error(source, "tau", "a temperature > 0 (or, in a file without one, setup.tau)",
                               t, TypeError if not _is_number(t) else ValueError)
    number("qa_snr_req_db", optional=True)
    for name in ("gradient_check", "provenance"):
        v = kw.get(name)
        if v is not None and not isinstance(v, dict):
            raise _field_error(source, name, "an object or null", v, TypeError)
    if "provenance" in kw and kw["provenance"] is None:
        raise _field_error(source, "provenance", "an object", None, TypeError)


def _read_file(path: Path) -> list:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such calibration file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a calibration file (not readable JSON: {err})") from None
    if not (isinstance(data, dict) and data.get("format") == FORMAT):
        raise ValueError(f"{path}: not a calibration file (expected a JSON object with format {FORMAT!r})")
    if data.get("version") != VERSION or not isinstance(data.get("calibrations"), list):
        raise ValueError(
            f"{path}: calibration file version {data.get('version')!r}; this library reads "
            f"version {VERSION} with a list 'calibrations'"
        )
    for i, e in enumerate(data["calibrations"]):
        if not isinstance(e, dict):
            raise TypeError(f"{path}: calibrations[{i}]: expected a calibration entry (a JSON object), "
                            f"got {e!r}")
        for name, allowed in (("mode", list(MODES)), ("sends", CALIBRATED_SENDS)):
            if e.get(name) not in allowed:
                raise ValueError(f"{path}: calibrations[{i}]: field {name!r}: expected one of "
                                 f"{list(allowed)}, got {e.get(name)!r}")
    return data["calibrations"]


def _jsonable(x):
    """``x`` as JSON's types: dicts with string keys, lists; numbers as they are (a non-finite one is
    written as ``Infinity`` / ``NaN`` by :func:`save_all` and read back unchanged)."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _check_model(mode, sends) -> None:
    mode_spec(mode)
    if sends not in CALIBRATED_SENDS:
        raise ValueError(f"sends: expected one of {', '.join(CALIBRATED_SENDS)}, got {sends!r}")

