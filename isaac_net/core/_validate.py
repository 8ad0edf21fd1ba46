"""Input checks at the boundary of every level and of DiffFluid.

Each error names the argument and says what was expected. Inside the models the
tensors are trusted.
"""

from __future__ import annotations

import math
import numbers

import torch

from isaac_net.core import radio
from isaac_net.core.config import TX_DBM_RANGE, CellConfig  # noqa: F401 (TX_DBM_RANGE: re-exported)

#: Validated ranges of the physical inputs (every level and DiffFluid). Beyond them float32
#: overflows (a 1e38-byte message; 1000 dBm is 1e67 W) or the models leave their physics.
MSG_BYTES_MAX = 1e9  # message size, bytes: (0, 1 GB]
SNR_DB_RANGE = (-150.0, 150.0)  # SNR given directly, dB (positions give about -100 .. 130 dB)
SEED_RANGE = (0, 2**64 - 1)  # what torch.Generator.manual_seed takes
DEVICE_TYPES = ("cpu", "cuda")


def per_robot(
    x,
    name: str,
    E: int,
    R: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    trailing: tuple[int, ...] = (),
) -> torch.Tensor:
    """Return ``x`` as a ``[E, R, *trailing]`` tensor of ``dtype`` (a view when it broadcasts).

    Accepts a Python number, or a tensor broadcastable to ``[E, R, *trailing]`` on the
    engine's device. Floating inputs are cast to ``dtype`` (autograd flows through the cast).
    """
    expected = [E, R, *trailing]
    if isinstance(x, bool) or isinstance(x, numbers.Number):
        if isinstance(x, complex):
            raise TypeError(f"{name}: expected a real number or tensor, got complex {x!r}")
        x = torch.tensor(float(x), dtype=dtype, device=device)
    elif not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or a number, got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(f"{name}: expected a real tensor, got dtype {x.dtype}")
    if x.device.type != torch.device(device).type:
        raise ValueError(f"{name}: expected a tensor on device {device}, got {x.device}")
    try:
        out = torch.broadcast_to(x, expected)
    except RuntimeError:
        raise ValueError(
            f"{name}: expected shape {expected} (or broadcastable to it), got {list(x.shape)}"
        ) from None
    if out.dtype != dtype:
        out = out.to(dtype)
    if not bool(torch.isfinite(out).all()):
        raise ValueError(f"{name}: expected finite values, got NaN or inf")
    return out


def check_range(x: torch.Tensor, name: str, lo: float | None, hi: float | None, what: str) -> None:
    bad = torch.zeros((), dtype=torch.bool, device=x.device)
    if lo is not None:
        bad = bad | (x < lo).any()
    if hi is not None:
        bad = bad | (x > hi).any()
    if bool(bad):
        raise ValueError(f"{name}: expected {what}, got values in [{x.min().item():g}, {x.max().item():g}]")


def radio_inputs(
    snr_db,
    pos,
    tx_dbm,
    cfg: CellConfig,
    E: int,
    R: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Resolve the radio inputs of a step into ``(snr_db, tx_dbm)``, each ``[E, R]``.

    Exactly one of ``snr_db`` and ``pos`` is given. ``tx_dbm`` (default ``cfg.tx_dbm``)
    sets the SNR through the radio model when ``pos`` is given, and the transmit energy
    in both cases.
    """
    if (snr_db is None) == (pos is None):
        raise ValueError("snr_db, pos: expected exactly one of them, got "
                         + ("both" if snr_db is not None else "neither"))
    tx = per_robot(cfg.tx_dbm if tx_dbm is None else tx_dbm, "tx_dbm", E, R, dtype, device)
    check_range(tx, "tx_dbm", *TX_DBM_RANGE, f"transmit powers in {list(TX_DBM_RANGE)} dBm")
    if pos is not None:
        pos = per_robot(pos, "pos", E, R, dtype, device, trailing=(2,))
        return radio.snr_db(pos, tx, cfg), tx
    snr = per_robot(snr_db, "snr_db", E, R, dtype, device)
    check_range(snr, "snr_db", *SNR_DB_RANGE, f"SNRs in {list(SNR_DB_RANGE)} dB")
    return snr, tx


def deadline_steps(deadline, cfg: CellConfig, E: int, R: int, dtype, device, *, integer: bool):
    """``[E, R]`` deadline in control steps, in ``[1, cfg.timeout_steps]``; default the timeout."""
    if deadline is None:
        return torch.full((E, R), float(cfg.timeout_steps), dtype=dtype, device=device)
    d = per_robot(deadline, "deadline", E, R, dtype, device)
    check_range(d, "deadline", 1.0, float(cfg.timeout_steps),
                f"values in [1, timeout_steps={cfg.timeout_steps}] control steps")
    if integer and bool((d != torch.round(d)).any()):
        raise ValueError("deadline: expected whole control steps for a discrete level, got fractions")
    return d


def env_mask(env_ids, E: int, device) -> torch.Tensor:
    """``[E]`` bool mask of the envs to reset: all when None, else integer indices or an ``[E]`` bool mask.

    An empty list or tuple (like an empty integer tensor) selects no env.

    Floats (``0.7``), strings and other types are refused: an index is never rounded.
    """
    mask = torch.zeros(E, dtype=torch.bool, device=device)
    if env_ids is None:
        mask[:] = True
        return mask
    if isinstance(env_ids, (str, bytes)):
        raise TypeError(f"env_ids: expected integer env indices or a bool mask of {E} envs, got {env_ids!r}")
    try:
        ids = torch.as_tensor(env_ids, device=device).reshape(-1)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"env_ids: expected integer env indices or a bool mask of {E} envs, "
                        f"got {type(env_ids).__name__}") from None
    if ids.numel() == 0 and not isinstance(env_ids, torch.Tensor):
        return mask  # reset([]): no env, a no-op (torch.as_tensor([]) is float32, not an index)
    if ids.dtype == torch.bool:
        if ids.numel() != E:
            raise ValueError(f"env_ids: expected a bool mask of {E} envs, got {ids.numel()}")
        return ids
    if ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"env_ids: expected integer env indices or a bool mask of {E} envs, "
                        f"got dtype {ids.dtype}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= E):
        raise ValueError(f"env_ids: expected indices in [0, {E}), got {ids.tolist()}")
    mask[ids.long()] = True
    return mask


def check_dims(E, R) -> None:
    for name, v in (("E", E), ("R", R)):
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")


def check_dtype(dtype) -> None:
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype: expected torch.float32 or torch.float64, got {dtype}")


def msg_bytes(x, E: int, R: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[E, R]`` message sizes in ``(0, MSG_BYTES_MAX]`` bytes; a bool is refused (not a size)."""
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool):
        raise TypeError("msg_bytes: expected message sizes in bytes (a number or a real tensor), got a bool")
    out = per_robot(x, "msg_bytes", E, R, dtype, device)
    if bool((out <= 0).any()):
        raise ValueError("msg_bytes: expected sizes > 0 bytes")
    check_range(out, "msg_bytes", None, MSG_BYTES_MAX, f"sizes in (0, {MSG_BYTES_MAX:g}] bytes")
    return out


#: Largest temperature accepted: every relaxation is a smooth step whose width is the temperature
#: (in log ratio or in messages / steps); far above 1 nothing is left of the step, and at ~1e3 the
#: soft minima overflow (NaN KPIs).
TEMPERATURE_MAX = 10.0


def temperature(value, name: str, *, allow_none: bool = False) -> float | None:
    """A temperature as a Python float in ``[0, TEMPERATURE_MAX]`` (a number or a one-element tensor)."""
    if value is None and allow_none:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        what = f"a tensor of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)
        raise TypeError(f"{name}: expected a real number >= 0{' or None' if allow_none else ''}, got {what}")
    value = float(value)
    if not (math.isfinite(value) and 0 <= value <= TEMPERATURE_MAX):
        raise ValueError(f"{name}: expected a finite temperature in [0, {TEMPERATURE_MAX:g}], got {value}")
    return value


def check_seed(value) -> int | None:
    """A seed: None or an integer in ``SEED_RANGE``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"seed: expected an integer in [0, 2**64 - 1] or None, got {value!r}")
    if not SEED_RANGE[0] <= int(value) <= SEED_RANGE[1]:
        raise ValueError(f"seed: expected an integer in [0, 2**64 - 1] or None, got {value!r}")
    return int(value)


def check_device(value) -> torch.device:
    """``value`` as a ``torch.device`` the models can run on: the CPU, or an available CUDA device."""
    try:
        dev = torch.device(value)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected one of {', '.join(DEVICE_TYPES)} (e.g. 'cpu', 'cuda:0'), "
                         f"got {value!r}") from None
    if dev.type not in DEVICE_TYPES:
        raise ValueError(f"device: expected one of {', '.join(DEVICE_TYPES)}, got {value!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {value!r} requested but CUDA is not available; use device='cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device: expected a CUDA index in [0, {torch.cuda.device_count()}), "
                             f"got {value!r}")
    return dev
