"""Neural proxy: an MLP fitted to per-robot KPIs of engine rollouts (the seed's recipe).

The proxy maps a robot's own decisions and channel, plus the load context of its cell
(what the other robots of the cell offer, which a robot cannot see alone), to its
per-robot KPIs over a stationary rollout. It is differentiable in the send probability,
the message size and the SNR, so gradients reach transmit power and position through
:mod:`isaac_net.core.radio`.

Its gradients are those of a regression fit: only as good as the training distribution
(stationary Bernoulli sends, the level's constants, one cell of ``R`` robots, the sampling
ranges). So a proxy remembers what it was fitted on (``Proxy.fitted_on``: level, ``R``,
``T``, warm-up, the ``CellConfig`` as a dict; ``Proxy.ranges``) and its file stores it:
``predict`` refuses another ``R`` or ``CellConfig`` (ValueError) and warns once when an input
leaves the training ranges.

Every prediction respects its KPI's physical bounds by construction, at any input and any
weights (:meth:`Proxy._decode`): the delivery ratio is a sigmoid, in [0, 1]; delay and energy
are ``softplus`` heads, >= 0; the AoI is ``1 + softplus``, >= 1 (a message generated and
delivered in one step has AoI 1). Format version 2 had affine delay, AoI and energy heads, which
left those bounds (the last version-2 proxy of the full profile predicted energies < 0 for 0.58 %
and AoIs < 1 for 0.34 % of robots drawn uniformly from its own ranges); version 3 files hold the
new heads, and a version-2 file is refused with the advice to refit.

Recipe::

    data = collect("L2-legacy", num_cells=512, R=8, T=100, warmup=20, seed=0)
    proxy, report = fit(data, seed=0)          # collect's dict: x, y and what they came from
    kpi = proxy.predict(p, msg_bytes, snr_db)   # dict of [E, R], differentiable
    proxy.save("proxy.pt"); proxy = Proxy.load("proxy.pt")
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import warnings

import torch
from torch import nn

from isaac_net.core import _validate, kpi
from isaac_net.core.config import CellConfig
from isaac_net.core.diff.reference import discrete_rollout

#: Tag and version of the file :meth:`Proxy.save` writes; :meth:`Proxy.load` refuses others.
FORMAT = "isaac_net.proxy"
FORMAT_VERSION = 3

#: Sampling ranges of the per-robot inputs. ``p`` and ``snr_db`` uniform, ``msg_bytes``
#: log-uniform.
RANGES = {
    "p": (0.05, 0.95),  # send probability per control step
    "msg_bytes": (2_000.0, 40_000.0),  # message size, bytes
    "snr_db": (5.0, 35.0),  # SNR with full power in one subband, dB
}

#: Raw inputs of one sample: the robot's own (``p, msg_bytes, snr_db``) and the context of
#: its cell, from the other robots: sum of their send probabilities, sum of their offered
#: bytes per step ``p * msg_bytes`` (kB) and their mean SNR (dB).
INPUTS = ("p", "msg_bytes", "snr_db", "ctx_rate", "ctx_load_kb", "ctx_snr_db")

#: Per-robot KPIs the proxy predicts (the keys of the engine's per-robot rollout result):
#: delay (control steps), delivery ratio, mean AoI (control steps), energy per step (J).
TARGETS = tuple(k.key for k in kpi.PROXY_KPIS)

#: Targets predicted through a sigmoid (within [0, 1] by construction).
PROB_TARGETS = ("delivery",)

#: The lower bound of each other target, predicted as ``floor + softplus`` (above it by construction):
#: a delay (control steps) and an energy (J) are >= 0, an AoI (control steps) >= 1.
FLOORS = {"delay": 0.0, "aoi": 1.0, "energy_j": 0.0}

#: Sharpness of the softplus heads in units of the target's spread: ``softplus(beta (a - floor)) / beta``
#: with ``a`` the affine head and ``beta = SOFTPLUS_SHARPNESS / y_std``, so a prediction more than a
#: tenth of the spread above its floor is the affine head's (to 5e-5 of the spread).
SOFTPLUS_SHARPNESS = 10.0

#: The keys of ``Proxy.fitted_on`` (None where unknown: a proxy fitted on raw tensors).
FITTED_ON_KEYS = ("level", "R", "T", "warmup", "cfg")


def context(p: torch.Tensor, msg_bytes: torch.Tensor, snr_db: torch.Tensor) -> torch.Tensor:
    """Raw proxy inputs of every robot from the decisions of its cell.

    :input p, msg_bytes, snr_db: ``[E, R]``.
    :output: ``[E, R, len(INPUTS)]``; the context columns sum over the other robots
        (``R = 1`` gives zero load and the robot's own SNR).
    """
    R = p.shape[-1]
    load_kb = p * msg_bytes / 1000.0
    ctx_rate = p.sum(-1, keepdim=True) - p
    ctx_load = load_kb.sum(-1, keepdim=True) - load_kb
    if R > 1:
        ctx_snr = (snr_db.sum(-1, keepdim=True) - snr_db) / (R - 1)
    else:
        ctx_snr = snr_db
    return torch.stack([p, msg_bytes, snr_db, ctx_rate, ctx_load, ctx_snr], dim=-1)


def _features(raw: torch.Tensor) -> torch.Tensor:
    """Raw inputs ``[..., len(INPUTS)]`` to network features: message size in log kB."""
    return torch.cat([raw[..., :1], torch.log(raw[..., 1:2] / 1000.0), raw[..., 2:]], dim=-1)


def sample_inputs(num_cells: int, R: int, generator: torch.Generator, ranges: dict | None = None,
                  dtype: torch.dtype = torch.float64, device="cpu") -> dict:
    """Per-robot inputs drawn from ``ranges`` (default ``RANGES``). Each ``[num_cells, R]``."""
    rg = RANGES if ranges is None else ranges
    _check_ranges(rg)

    def uni(lo, hi):
        return lo + (hi - lo) * torch.rand(num_cells, R, generator=generator, dtype=dtype, device=device)

    lb_lo, lb_hi = (math.log(v) for v in rg["msg_bytes"])
    return {
        "p": uni(*rg["p"]),
        "msg_bytes": torch.exp(uni(lb_lo, lb_hi)),
        "snr_db": uni(*rg["snr_db"]),
    }


def collect(level: str, num_cells: int, R: int, T: int, *, warmup: int, seed: int,
            ranges: dict | None = None, cfg=None, dtype: torch.dtype = torch.float64,
            device="cpu", batch_cells: int | None = None, progress=None, **engine_kwargs) -> dict:
    """Per-robot KPIs of ``level`` rollouts with random stationary decisions per robot.

    Cells are run ``batch_cells`` at a time (all at once by default), each batch one
    engine with seed ``seed + batch index``. Inputs are drawn on the CPU (the same samples
    on every device); the returned tensors are on the CPU.

    :output: ``x`` ``[N, len(INPUTS)]`` raw inputs, ``y`` ``[N, len(TARGETS)]`` per-robot
        KPIs (``delay`` NaN where nothing was delivered), ``cell`` ``[N]`` cell index;
        ``N = num_cells * R``; ``meta``: what the samples come from (``FITTED_ON_KEYS`` and
        ``ranges``), which :func:`fit` of this dict keeps in the proxy.
    """
    for name, v in (("num_cells", num_cells), ("R", R)):
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
    if batch_cells is not None and not (isinstance(batch_cells, int) and not isinstance(batch_cells, bool)
                                        and batch_cells >= 1):
        raise ValueError(f"batch_cells: expected an integer >= 1 or None (all cells at once), "
                         f"got {batch_cells!r}")
    ranges = _resolved_ranges(RANGES if ranges is None else ranges)
    cfg = CellConfig() if cfg is None else cfg
    if not isinstance(cfg, CellConfig):
        raise TypeError(f"cfg: expected a CellConfig, got {type(cfg).__name__}")
    gen = torch.Generator(device="cpu").manual_seed(_validate.check_seed(seed))
    batch = num_cells if batch_cells is None else batch_cells
    xs, ys = [], []
    starts = list(range(0, num_cells, batch))
    it = starts if progress is None else progress(starts)
    for i, start in enumerate(it):
        n = min(batch, num_cells - start)
        inp = sample_inputs(n, R, gen, ranges, dtype=dtype)
        u = torch.rand(T, n, R, generator=gen, dtype=dtype)
        on_dev = {k: v.to(device) for k, v in inp.items()}
        res = discrete_rollout(level, T, on_dev["p"], on_dev["msg_bytes"], snr_db=on_dev["snr_db"],
                               warmup=warmup, u=u.to(device), cfg=cfg, dtype=dtype, device=device,
                               seed=int(seed) + i, **engine_kwargs)
        xs.append(context(inp["p"], inp["msg_bytes"], inp["snr_db"]).reshape(n * R, -1))
        ys.append(torch.stack([res[k].detach().cpu() for k in TARGETS], dim=-1).reshape(n * R, -1))
    x, y = torch.cat(xs), torch.cat(ys)
    cell = torch.arange(num_cells).repeat_interleave(R)
    meta = {"level": level, "R": R, "T": T, "warmup": warmup, "cfg": dataclasses.asdict(cfg),
            "ranges": ranges}
    return {"x": x, "y": y, "cell": cell, "meta": meta}


def _resolved_ranges(ranges: dict) -> dict:
    """Checked ranges as ``{name: (low, high)}`` of floats."""
    if not isinstance(ranges, dict):
        raise TypeError(f"ranges: expected a dict with keys {list(RANGES)}, got {type(ranges).__name__}")
    _check_ranges(ranges)
    return {k: (float(ranges[k][0]), float(ranges[k][1])) for k in RANGES}


def _check_ranges(ranges: dict) -> None:
    missing = [k for k in RANGES if k not in ranges]
    if missing:
        raise ValueError(f"ranges: expected keys {list(RANGES)}, missing {missing}")
    for k in RANGES:
        pair = ranges[k]
        numbers = isinstance(pair, (list, tuple)) and len(pair) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)
        if not numbers:  # a string "4" or a bool is not a bound (float() would read it)
            raise ValueError(f"ranges[{k!r}]: expected (low, high) numbers, got {pair!r}")
        lo, hi = (float(v) for v in pair)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(f"ranges[{k!r}]: expected finite low <= high, got {ranges[k]}")
    if not (0.0 <= ranges["p"][0] and ranges["p"][1] <= 1.0):
        raise ValueError(f"ranges['p']: expected probabilities in [0, 1], got {ranges['p']}")
    if ranges["msg_bytes"][0] <= 0:
        raise ValueError(f"ranges['msg_bytes']: expected sizes > 0 bytes, got {ranges['msg_bytes']}")


class Proxy(nn.Module):
    """MLP from standardised features to per-robot KPIs.

    :param hidden: widths of the hidden layers (SiLU, smooth so that gradients are).
    :param ranges: the training ranges of ``p, msg_bytes, snr_db`` (default ``RANGES``);
        ``predict`` warns once when an input leaves them.
    :param fitted_on: what the samples came from (``FITTED_ON_KEYS``; missing keys None).
    The delivery head is a sigmoid (``PROB_TARGETS``), the other heads affine in the
    network's output. Normalisation constants are buffers, so ``state_dict`` carries the weights.
    """

    def __init__(self, hidden=(64, 64), ranges: dict | None = None, fitted_on: dict | None = None):
        super().__init__()
        try:
            self.hidden = tuple(int(h) for h in hidden)
        except (TypeError, ValueError):
            raise ValueError(f"hidden: expected a sequence of layer widths >= 1, got {hidden!r}") from None
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden: expected layer widths >= 1, got {hidden!r}")
        self.ranges = _resolved_ranges(RANGES if ranges is None else ranges)
        fitted_on = {} if fitted_on is None else dict(fitted_on)
        self.fitted_on = {k: fitted_on.get(k) for k in FITTED_ON_KEYS}
        self._warned_ranges = False
        layers, width = [], len(INPUTS)
        for h in self.hidden:
            layers += [nn.Linear(width, h), nn.SiLU()]
            width = h
        layers.append(nn.Linear(width, len(TARGETS)))
        self.net = nn.Sequential(*layers)
        self.register_buffer("x_mean", torch.zeros(len(INPUTS)))
        self.register_buffer("x_std", torch.ones(len(INPUTS)))
        self.register_buffer("y_mean", torch.zeros(len(TARGETS)))
        self.register_buffer("y_std", torch.ones(len(TARGETS)))
        self.register_buffer("is_prob", torch.tensor([k in PROB_TARGETS for k in TARGETS]), persistent=False)
        self.register_buffer("floor", torch.tensor([FLOORS.get(k, 0.0) for k in TARGETS]), persistent=False)

    def _decode(self, h: torch.Tensor) -> torch.Tensor:
        """Network outputs ``[..., len(TARGETS)]`` to KPIs, each within its physical bounds for any ``h``.

        The sigmoid heads (``PROB_TARGETS``): ``sigmoid(logit(m) + h y_std / (m (1 - m)))``,
        ``m = y_mean``, in [0, 1] and equal to the affine head ``h y_std + y_mean`` to first order at
        ``h = 0`` (so both train alike). The others: ``floor + softplus(beta (a - floor)) / beta``
        with ``a`` the affine head and ``beta = SOFTPLUS_SHARPNESS / y_std``: above ``FLOORS`` (delay,
        energy >= 0, AoI >= 1), and the affine head itself where it is well above the floor."""
        m = self.y_mean.clamp(1e-3, 1.0 - 1e-3)
        prob = torch.sigmoid(torch.logit(m) + h * (self.y_std / (m * (1.0 - m))))
        affine = h * self.y_std + self.y_mean
        beta = SOFTPLUS_SHARPNESS / self.y_std
        above = self.floor + torch.nn.functional.softplus(beta * (affine - self.floor)) / beta
        return torch.where(self.is_prob, prob, above)

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        """:input raw: ``[..., len(INPUTS)]`` raw inputs. :output: ``[..., len(TARGETS)]`` KPIs."""
        z = (_features(raw.to(self.x_mean.dtype)) - self.x_mean) / self.x_std
        return self._decode(self.net(z))

    def predict(self, p, msg_bytes, snr_db, *, cfg: CellConfig | None = None) -> dict:
        """Per-robot KPIs of a cell configuration, differentiable in every input.

        :input p: ``[E, R]`` send probability; :input msg_bytes: ``[E, R]`` bytes;
        :input snr_db: ``[E, R]`` dB (e.g. :func:`isaac_net.core.radio.snr_db` of positions
            and transmit power).
        :param cfg: the cell the prediction is for; a ValueError if the proxy was fitted on
            another (None: not checked). ``R`` must be the proxy's (when known).
        :output: dict ``TARGETS`` -> ``[E, R]``; ``delivery`` in [0, 1].
        """
        tensors = [t for t in (p, msg_bytes, snr_db) if isinstance(t, torch.Tensor)]
        if not tensors:
            raise ValueError("p, msg_bytes, snr_db: expected at least one [E, R] tensor")
        try:
            shape = torch.broadcast_shapes(*(t.shape for t in tensors))
        except RuntimeError:
            shape = None
        if shape is None or len(shape) != 2:
            raise ValueError("p, msg_bytes, snr_db: expected [E, R] inputs, got shapes "
                             f"{[list(t.shape) for t in tensors]}")
        E, R = shape
        self.check_fitted_on(R=R, cfg=cfg, what="predict")
        dt, dev = self.x_mean.dtype, self.x_mean.device
        p = _validate.per_robot(p, "p", E, R, dt, dev)
        msg_bytes = _validate.msg_bytes(msg_bytes, E, R, dt, dev)
        snr_db = _validate.per_robot(snr_db, "snr_db", E, R, dt, dev)
        _validate.check_range(p, "p", 0.0, 1.0, "probabilities in [0, 1]")
        self._warn_outside_ranges({"p": p, "msg_bytes": msg_bytes, "snr_db": snr_db})
        out = self(context(p, msg_bytes, snr_db))
        return {k: out[..., i] for i, k in enumerate(TARGETS)}

    def check_fitted_on(self, *, level: str | None = None, R: int | None = None, cfg=None,
                        what: str = "proxy") -> None:
        """ValueError if ``level``, ``R`` or ``cfg`` (a CellConfig or its dict; None: not checked)
        differ from what the proxy was fitted on (where that is known)."""
        on = self.fitted_on
        if level is not None and on["level"] is not None and level != on["level"]:
            raise ValueError(f"level: the proxy was fitted on level {on['level']!r}, got {level!r}")
        if R is not None and on["R"] is not None and int(R) != on["R"]:
            raise ValueError(f"R: the proxy was fitted on cells of R={on['R']} robots, {what} got R={R}")
        if cfg is not None and on["cfg"] is not None:
            got = dataclasses.asdict(cfg) if isinstance(cfg, CellConfig) else dict(cfg)
            diff = sorted(k for k in set(got) | set(on["cfg"]) if got.get(k) != on["cfg"].get(k))
            if diff:
                raise ValueError(f"cfg: the proxy was fitted on another CellConfig (differs in {diff})")

    def _warn_outside_ranges(self, inputs: dict) -> None:
        if self._warned_ranges:
            return
        for k, v in inputs.items():
            lo, hi = self.ranges[k]
            if bool(((v < lo) | (v > hi)).any()):
                self._warned_ranges = True
                warnings.warn(f"{k}: values in [{v.min().item():g}, {v.max().item():g}] leave the proxy's "
                              f"training range [{lo:g}, {hi:g}]; its predictions there are extrapolations "
                              "(warned once per proxy)", stacklevel=3)
                return

    def save(self, path) -> None:
        """Write the weights, the architecture and what the proxy was fitted on to ``path``."""
        torch.save({"format": FORMAT, "version": FORMAT_VERSION, "hidden": list(self.hidden),
                    "ranges": {k: list(v) for k, v in self.ranges.items()}, "fitted_on": dict(self.fitted_on),
                    "inputs": list(INPUTS), "targets": list(TARGETS), "prob_targets": list(PROB_TARGETS),
                    "floors": dict(FLOORS),
                    "dtype": str(self.x_mean.dtype).removeprefix("torch."),
                    "state_dict": self.state_dict()}, path)

    @classmethod
    def load(cls, path, map_location="cpu", *, level: str | None = None, R: int | None = None,
             cfg=None) -> "Proxy":
        """Rebuild a proxy written by :meth:`save` (``weights_only`` loading: no code runs).

        :param level, R, cfg: what the caller will use it for; a ValueError when the proxy was
            fitted on something else (None: not checked).
        A file that is not a proxy of this format (truncated, empty, foreign, an older format,
        weights that do not match the stored architecture) is a ValueError naming the file.
        """
        try:
            blob = torch.load(path, map_location=map_location, weights_only=True)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            raise
        except (pickle.UnpicklingError, EOFError, RuntimeError, OSError, ValueError, AttributeError) as e:
            raise ValueError(f"{path}: not a readable proxy file (empty, truncated, or not written by "
                             f"Proxy.save: {type(e).__name__})") from None
        if not isinstance(blob, dict):
            raise ValueError(f"{path}: expected a dict written by Proxy.save, got a {type(blob).__name__}")
        if blob.get("format") != FORMAT:
            raise ValueError(f"{path}: no proxy format tag {FORMAT!r} (a foreign file, or one from before "
                             "format version 2: refit and save it again)")
        if blob.get("version") == 2:
            raise ValueError(f"{path}: proxy format version 2, whose delay, AoI and energy heads are "
                             "affine and can predict values out of their physical bounds (energy or delay "
                             f"< 0, AoI < 1); this library reads version {FORMAT_VERSION} (softplus heads): "
                             "refit the proxy (proxy.fit, or the pipeline's nn_proxy stage) and save it "
                             "again")
        if blob.get("version") != FORMAT_VERSION:
            raise ValueError(f"{path}: proxy format version {blob.get('version')!r}, "
                             f"expected {FORMAT_VERSION}")
        if (blob.get("inputs") != list(INPUTS) or blob.get("targets") != list(TARGETS)
                or blob.get("prob_targets") != list(PROB_TARGETS)):
            raise ValueError(f"{path}: expected a proxy with inputs {list(INPUTS)} and targets "
                             f"{list(TARGETS)}, got {blob.get('inputs')} and {blob.get('targets')}")
        fields = ("hidden", "ranges", "fitted_on", "dtype", "state_dict", "floors")
        missing = [k for k in fields if k not in blob]
        if missing:
            raise ValueError(f"{path}: a proxy file without {missing}")
        _check_blob(blob, path)
        try:
            proxy = cls(hidden=blob["hidden"], ranges=blob["ranges"], fitted_on=blob["fitted_on"])
            proxy = proxy.to(getattr(torch, blob["dtype"]))
            proxy.load_state_dict(blob["state_dict"])
        except (ValueError, TypeError, RuntimeError, KeyError) as e:
            reason = str(e).splitlines()[0][:200]
            raise ValueError(f"{path}: the stored weights do not fit the stored architecture "
                             f"(hidden={blob['hidden']}): {type(e).__name__}: {reason}") from None
        proxy.check_fitted_on(level=level, R=R, cfg=cfg, what="load")
        return proxy.eval()


def _check_blob(blob: dict, path) -> None:
    """Every field of a proxy file of the right type and range: a ValueError or TypeError naming the
    file and the field (before the proxy is built from them)."""
    def bad(field, expected, got, kind=ValueError):
        return kind(f"{path}: field {field}: expected {expected}, got {got!r}")

    def integer(v, lo):
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo

    if blob["floors"] != FLOORS:
        raise bad("floors", f"the softplus heads' floors {FLOORS}", blob["floors"])
    if blob["dtype"] not in ("float32", "float64"):
        raise bad("dtype", "'float32' or 'float64'", blob["dtype"])
    hidden = blob["hidden"]
    if not (isinstance(hidden, (list, tuple)) and hidden and all(integer(h, 1) for h in hidden)):
        raise bad("hidden", "a non-empty list of layer widths (integers >= 1)", hidden,
                  TypeError if not isinstance(hidden, (list, tuple)) else ValueError)
    ranges = blob["ranges"]
    if not isinstance(ranges, dict):
        raise bad("ranges", f"a dict of (low, high) for {list(RANGES)} (the training ranges)", ranges,
                  TypeError)
    try:
        _resolved_ranges(ranges)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{path}: field {e}") from None
    on = blob["fitted_on"]
    if not isinstance(on, dict):
        raise bad("fitted_on", f"a dict with keys {list(FITTED_ON_KEYS)}", on, TypeError)
    unknown = sorted(set(on) - set(FITTED_ON_KEYS))
    if unknown:
        raise bad("fitted_on", f"keys among {list(FITTED_ON_KEYS)}", unknown)
    checks = {"level": (lambda v: isinstance(v, str), "a level name (a string)"),
              "R": (lambda v: integer(v, 1), "an integer >= 1 (robots per cell)"),
              "T": (lambda v: integer(v, 1), "an integer >= 1 (control steps)"),
              "warmup": (lambda v: integer(v, 0), "an integer >= 0 (control steps)"),
              "cfg": (lambda v: isinstance(v, dict), "a CellConfig as a dict")}
    for k, (ok, what) in checks.items():
        v = on.get(k)
        if v is not None and not ok(v):
            raise bad(f"fitted_on[{k!r}]", f"{what} or None", v, TypeError)
    if on.get("cfg") is not None:
        try:
            CellConfig(**on["cfg"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: field fitted_on['cfg']: not a valid CellConfig: {e}") from None
    sd = blob["state_dict"]
    if not (isinstance(sd, dict) and all(isinstance(v, torch.Tensor) for v in sd.values())):
        raise bad("state_dict", "a dict of tensors (Proxy.state_dict())", type(sd).__name__, TypeError)
    for k, v in sd.items():
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise bad(f"state_dict[{k!r}]", "finite weights", "NaN or inf values")
    for k in ("x_std", "y_std"):
        if k in sd and not bool((sd[k] > 0).all()):
            raise bad(f"state_dict[{k!r}]", "spreads > 0", sd[k].tolist())


def fit(x, y: torch.Tensor | None = None, *, hidden=(64, 64), epochs: int = 300, lr: float = 3e-3,
        batch_size: int = 512, weight_decay: float = 0.0, seed: int = 0, ranges: dict | None = None,
        fitted_on: dict | None = None, dtype: torch.dtype = torch.float32,
        progress=None) -> tuple[Proxy, dict]:
    """Fit a :class:`Proxy` to samples by Adam on the standardised squared error.

    NaN targets (a robot that delivered nothing has no delay) are left out of the loss;
    the inputs must be finite. The learning rate follows a cosine schedule to ``lr / 20``.

    :input x: :func:`collect`'s dict (then ``y`` is None: its ``x``, ``y`` and ``meta``), or
        ``[N, len(INPUTS)]`` raw inputs with :input y: ``[N, len(TARGETS)]``.
    :param ranges: the training ranges the proxy keeps: default the ``meta``'s of a
        :func:`collect` dict, else the inputs' own extent (never silently ``RANGES``).
    :param fitted_on: level, ``R``, ``T``, warm-up and ``cfg`` of the samples (``FITTED_ON_KEYS``);
        default the ``meta``'s of a :func:`collect` dict, else unknown (not checked at predict).
    :output: the proxy (eval mode) and ``{"loss": final training loss}``.
    """
    meta = {}
    if isinstance(x, dict):
        if y is not None:
            raise ValueError("y: expected None when x is collect()'s dict (its 'y' is used)")
        meta = x.get("meta") or {}
        x, y = x["x"], x["y"]
    _check_fit_args(x, y, epochs, batch_size, lr, weight_decay)
    ranges = _fit_ranges(x, ranges, meta)
    if fitted_on is None:
        fitted_on = {k: meta.get(k) for k in FITTED_ON_KEYS}
    torch.manual_seed(_validate.check_seed(seed))
    gen = torch.Generator().manual_seed(int(seed))
    proxy = Proxy(hidden, ranges, fitted_on).to(dtype)
    x, y = x.to(dtype), y.to(dtype)
    z, y0, finite = _standardise(proxy, x, y)
    loss_val = _train(proxy, z, y0, finite, epochs=epochs, lr=lr, batch_size=batch_size,
                      weight_decay=weight_decay, gen=gen, progress=progress)
    return proxy.eval(), {"loss": loss_val}


def _check_fit_args(x, y, epochs, batch_size, lr, weight_decay) -> None:
    """:func:`fit`'s samples and settings checked (a TypeError or ValueError naming the first wrong one)."""
    for name, t in (("x", x), ("y", y)):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            raise TypeError(f"{name}: expected a floating-point tensor, got "
                            f"{type(t).__name__ if not isinstance(t, torch.Tensor) else t.dtype}")
    if x.ndim != 2 or x.shape[-1] != len(INPUTS):
        raise ValueError(f"x: expected [N, {len(INPUTS)}] raw inputs, got {list(x.shape)}")
    if y.ndim != 2 or y.shape != (x.shape[0], len(TARGETS)):
        raise ValueError(f"y: expected [{x.shape[0]}, {len(TARGETS)}] KPIs, got {list(y.shape)}")
    if x.shape[0] < 2:
        raise ValueError(f"x: expected at least 2 samples to standardise, got {x.shape[0]}")
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).any(-1).sum())
        raise ValueError(f"x: expected finite raw inputs, got NaN or inf in {bad} samples")
    if bool((x[:, 1] <= 0).any()) or bool(((x[:, 0] < 0) | (x[:, 0] > 1)).any()):
        raise ValueError("x: expected p in [0, 1] and msg_bytes > 0 in the first two columns (INPUTS)")
    if bool(torch.isinf(y).any()):
        raise ValueError("y: expected finite KPIs or NaN (missing), got inf")
    empty = [k for i, k in enumerate(TARGETS) if not bool(torch.isfinite(y[:, i]).any())]
    if empty:
        raise ValueError(f"y: expected some finite values of every target, got none for {empty}")
    for name, v in (("epochs", epochs), ("batch_size", batch_size)):
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
    for name, v, lo_ok in (("lr", lr, False), ("weight_decay", weight_decay, True)):
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and (v >= 0 if lo_ok else v > 0)):
            raise ValueError(f"{name}: expected a finite number {'>= 0' if lo_ok else '> 0'}, got {v!r}")


def _fit_ranges(x, ranges, meta: dict) -> dict:
    """The training ranges :func:`fit` keeps: ``ranges``, which must be the samples' own (``meta``'s)
    where they have some, else those, else the inputs' own extent."""
    if ranges is None:
        ranges = meta.get("ranges")
    elif meta.get("ranges") is not None and _resolved_ranges(ranges) != _resolved_ranges(meta["ranges"]):
        raise ValueError(f"ranges: {ranges} differ from the ranges the samples were collected over, "
                         f"{meta['ranges']}")
    if ranges is None:  # the inputs' own extent
        ranges = {k: (float(x[:, i].min()), float(x[:, i].max())) for i, k in enumerate(RANGES)}
    return ranges


def _standardise(proxy: "Proxy", x, y) -> tuple:
    """Set ``proxy``'s input and target standardisation from the samples (NaN targets left out):
    ``(z, y0, finite)``, the standardised features, the targets with NaN as 0, where they are finite."""
    f = _features(x)
    finite = torch.isfinite(y)
    y0 = torch.where(finite, y, torch.zeros_like(y))
    cnt = finite.sum(0).clamp(min=1)
    y_mean = y0.sum(0) / cnt
    dev = torch.where(finite, y - y_mean, torch.zeros_like(y))
    y_std = torch.sqrt((dev ** 2).sum(0) / cnt).clamp(min=1e-12)
    proxy.x_mean.copy_(f.mean(0))
    proxy.x_std.copy_(f.std(0).clamp(min=1e-12))
    proxy.y_mean.copy_(y_mean)
    proxy.y_std.copy_(y_std)
    z = (f - proxy.x_mean) / proxy.x_std
    return z, y0, finite


def _train(proxy: "Proxy", z, y0, finite, *, epochs: int, lr: float, batch_size: int, weight_decay: float,
           gen: torch.Generator, progress) -> float:
    """Adam on the standardised squared error of the finite targets, the learning rate on a cosine
    schedule to ``lr / 20``, ``proxy`` left in train mode: the last epoch's mean loss."""
    opt = torch.optim.Adam(proxy.net.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs, eta_min=lr / 20)
    N = z.shape[0]
    epochs_it = range(epochs) if progress is None else progress(range(epochs))
    loss_val = float("nan")
    proxy.train()
    for _ in epochs_it:
        perm = torch.randperm(N, generator=gen)
        total, seen = 0.0, 0
        for i in range(0, N, batch_size):
            idx = perm[i:i + batch_size]
            m = finite[idx]
            # the error of the decoded KPIs in units of their spread (an affine head: its plain
            # standardised error)
            err = torch.where(m, (proxy._decode(proxy.net(z[idx])) - y0[idx]) / proxy.y_std,
                              torch.zeros_like(y0[idx]))
            loss = (err ** 2).sum() / m.sum().clamp(min=1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            seen += len(idx)
        sched.step()
        loss_val = total / max(seen, 1)
    return loss_val


def evaluate(proxy: Proxy, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Fit quality per KPI on samples ``(x, y)``, NaN targets left out.

    :output: ``{kpi: {"r2", "mean_rel_err", "n"}}``; ``r2 = 1 - SSE / SST`` about the
        samples' own mean, ``mean_rel_err`` the mean of ``|pred - y| / |y|`` over samples
        with ``y != 0``.
    """
    with torch.no_grad():
        pred = proxy(x).to(torch.float64)
    y = y.to(torch.float64)
    out = {}
    for i, k in enumerate(TARGETS):
        m = torch.isfinite(y[:, i])
        yi, pi = y[m, i], pred[m, i]
        sst = ((yi - yi.mean()) ** 2).sum()
        r2 = float(1.0 - ((pi - yi) ** 2).sum() / sst) if float(sst) > 0 else float("nan")
        nz = yi != 0
        mre = float(((pi[nz] - yi[nz]).abs() / yi[nz].abs()).mean()) if bool(nz.any()) else float("nan")
        out[k] = {"r2": r2, "mean_rel_err": mre, "n": int(m.sum())}
    return out


__all__ = ["FORMAT", "FORMAT_VERSION", "INPUTS", "PROB_TARGETS", "RANGES", "TARGETS", "Proxy",
           "collect", "context", "evaluate", "fit", "sample_inputs"]
