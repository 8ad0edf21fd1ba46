"""Input checks at the boundary of every level and of DiffFluid.

Each error names the argument and says what was expected. Inside the models the
tensors are trusted.
"""

from __future__ import annotations

import numbers

import torch

from isaac_net.core import radio
from isaac_net.core.config import CellConfig


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
    if pos is not None:
        pos = per_robot(pos, "pos", E, R, dtype, device, trailing=(2,))
        return radio.snr_db(pos, tx, cfg), tx
    return per_robot(snr_db, "snr_db", E, R, dtype, device), tx


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
    """``[E]`` bool mask of the envs to reset: all when None, else indices or a bool mask."""
    mask = torch.zeros(E, dtype=torch.bool, device=device)
    if env_ids is None:
        mask[:] = True
        return mask
    ids = torch.as_tensor(env_ids, device=device).reshape(-1)
    if ids.dtype == torch.bool:
        if ids.numel() != E:
            raise ValueError(f"env_ids: expected a bool mask of {E} envs, got {ids.numel()}")
        return ids
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
