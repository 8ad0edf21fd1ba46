"""The mechanisms of L2-legacy as small pure functions (docs/design.md §2 "L2-legacy").

Each one takes tensors and returns tensors, with no engine state, so that it can be
tested alone. The level (:mod:`isaac_net.core.levels.l2_legacy`) strings them together
slot by slot. Shapes use ``E`` envs, ``R`` robots, ``S`` subbands, ``M`` MCS indices.
"""

from __future__ import annotations

import math

import torch

# NR PUSCH/PDSCH MCS table for 64QAM, TS 38.214 Table 5.1.3.1-1: spectral efficiency
# Qm * R / 1024 of MCS 0..28, b/s/Hz.
NR_MCS_SE = (
    0.2344, 0.3066, 0.3770, 0.4902, 0.6016, 0.7402, 0.8770, 1.0273, 1.1758, 1.3262,
    1.3281, 1.4766, 1.6953, 1.9141, 2.1602, 2.4063, 2.5703, 2.5664, 2.7305, 3.0293,
    3.3223, 3.6094, 3.9023, 4.2129, 4.5234, 4.8164, 5.1152, 5.3320, 5.5547,
)

_LN9 = math.log(9.0)


def mcs_thresholds_db(mcs_se: torch.Tensor, gap_db: float) -> torch.Tensor:
    """SINR at which each MCS has 10 % BLER, dB: a Shannon gap above capacity.

    .. math:: \\gamma_m = \\Gamma + 10 \\log_{10}(2^{SE_m} - 1)

    :input mcs_se: ``[M]`` spectral efficiency per MCS, b/s/Hz (ascending).
    :output: ``[M]`` thresholds, dB. Ascending wherever ``mcs_se`` is (MCS 17 of the NR
        table has a slightly lower SE than MCS 16; with :func:`selection_bounds_db` the
        selection skips MCS 16).
    """
    return gap_db + 10.0 * torch.log10(torch.pow(2.0, mcs_se) - 1.0)


def bler(sinr_db: torch.Tensor, mcs: torch.Tensor, thr_db: torch.Tensor, slope_db: float) -> torch.Tensor:
    """Block error rate of a TB sent with MCS ``mcs`` at effective SINR ``sinr_db``.

    A logistic curve per MCS with 10 % BLER at its threshold:

    .. math:: \\mathrm{BLER} = \\frac{1}{1 + 9 \\exp((\\mathrm{sinr} - \\gamma_m) / s)}

    so BLER = 0.1 at ``sinr = thr_db[mcs]`` and it falls from 90 % to 10 % over
    ``2 ln 9 * slope_db`` dB.

    :input sinr_db: ``[...]`` dB. :input mcs: ``[...]`` long. :input thr_db: ``[M]`` dB.
    :output: ``[...]`` in (0, 1).
    """
    return torch.sigmoid(-((sinr_db - torch.take(thr_db, mcs)) / slope_db + _LN9))


def select_mcs(sinr_est_db: torch.Tensor, offset_db: torch.Tensor, thr_db: torch.Tensor) -> torch.Tensor:
    """Highest MCS whose threshold is at most the estimate minus the OLLA offset (MCS 0 if none).

    :input sinr_est_db: ``[...]`` estimated effective SINR, dB.
    :input offset_db: broadcastable to ``[...]``, OLLA offset, dB (positive = more careful).
    :input thr_db: ``[M]`` thresholds, dB, non-decreasing (see :func:`selection_bounds_db`).
    :output: ``[...]`` long MCS index in ``[0, M)``.
    """
    x = (sinr_est_db - offset_db).contiguous()
    return (torch.searchsorted(thr_db, x, right=True) - 1).clamp_(min=0)


def selection_bounds_db(thr_db: torch.Tensor) -> torch.Tensor:
    """Thresholds made non-decreasing by a running max, for :func:`select_mcs`.

    MCS 17 of the NR table has a lower SE (and threshold) than MCS 16; with the running max
    the selection never picks MCS 16, whose threshold exceeds that of a faster MCS.

    :input thr_db: ``[M]`` dB. :output: ``[M]`` dB.
    """
    return torch.cummax(thr_db, 0).values


def olla_update(offset_db: torch.Tensor, is_tx: torch.Tensor, is_nack: torch.Tensor,
                up_db: float, down_db: float, max_db: float) -> torch.Tensor:
    """Outer-loop link adaptation: ``+up_db`` on a NACK, ``-down_db`` on an ACK, clamped to ``±max_db``.

    With ``down_db = up_db * T / (1 - T)`` the offset is stationary when the BLER is ``T``.

    :input offset_db, is_tx, is_nack: ``[...]`` (is_tx: the robot got HARQ feedback).
    :output: ``[...]`` new offset, dB (unchanged where not ``is_tx``).
    """
    step = torch.where(is_nack, up_db, -down_db)
    return torch.where(is_tx, (offset_db + step).clamp(-max_db, max_db), offset_db)


def effective_sinr_lin(sinr_lin: torch.Tensor, is_alloc: torch.Tensor,
                       num_alloc: torch.Tensor | None = None) -> torch.Tensor:
    """Effective SINR of a TB spread over several subbands (Shannon mutual-information ESM).

    The equivalent of EESM with the Shannon capacity as the information measure (MIESM):

    .. math::
        \\gamma_\\mathrm{eff} = 2^{\\frac{1}{n}\\sum_{b \\in \\mathrm{alloc}} \\log_2(1 + \\gamma_b)} - 1

    It has no per-MCS calibration factor, is exact for a flat channel, and lies between
    the smallest and the mean per-subband SINR.

    :input sinr_lin: ``[..., S]`` per-subband SINR, linear. :input is_alloc: ``[..., S]`` bool.
    :input num_alloc: ``[...]`` the number of allocated subbands, if the caller has it.
    :output: ``[...]`` linear (0 where nothing is allocated).
    """
    if num_alloc is None:
        num_alloc = torch.count_nonzero(is_alloc, -1)
    zero = torch.zeros((), dtype=sinr_lin.dtype, device=sinr_lin.device)
    mi = torch.where(is_alloc, torch.log2(1.0 + sinr_lin), zero).sum(-1) / num_alloc.clamp(min=1)
    return torch.exp2(mi) - 1.0


def capacity_by_subbands(sinr1_lin: torch.Tensor, bytes_per_sb_se: float, se_max: float, gap_lin: float,
                         min_sinr_lin: float, num_subbands: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Estimated TB capacity with ``n = 1..S`` subbands, and the power-headroom limit on ``n``.

    With the power split over ``n`` subbands, ``cap(n) = n * min(log2(1 + x / (n Γ)), se_max)
    * bytes_per_sb_se`` (increasing in ``n``). The headroom limit is the most subbands that
    keep ``x / n >= min_sinr_lin`` (the lowest MCS's threshold), at least one.

    :input sinr1_lin: ``[E, R]`` estimated SINR with the full power in one subband, linear.
    :output: ``[E, R, S]`` capacity, bytes, and ``[E, R]`` long limit.
    """
    n = torch.arange(1, num_subbands + 1, dtype=sinr1_lin.dtype, device=sinr1_lin.device)
    x = sinr1_lin.unsqueeze(-1) / n  # per-subband SINR with the power split over n
    cap = n * torch.clamp(torch.log2(1.0 + x / gap_lin), max=se_max) * bytes_per_sb_se
    return cap, torch.count_nonzero(x >= min_sinr_lin, -1).clamp_(min=1)


def subbands_needed(known_bytes: torch.Tensor, cap: torch.Tensor, max_sb: torch.Tensor) -> torch.Tensor:
    """Fewest subbands whose capacity covers the known buffer, at most ``max_sb`` (0 when empty).

    :input known_bytes: ``[E, R]`` bytes the gNB knows of. :input cap: ``[E, R, S]`` from
        :func:`capacity_by_subbands`. :input max_sb: ``[E, R]`` long.
    :output: ``[E, R]`` long.
    """
    need = torch.minimum(torch.count_nonzero(cap < known_bytes.unsqueeze(-1), -1) + 1, max_sb)
    return need * (known_bytes > 0)


def pf_allocate(metric: torch.Tensor, need: torch.Tensor, is_free: torch.Tensor, num_rounds: int,
                order: torch.Tensor | None = None, *, stop_early: bool = False) -> torch.Tensor:
    """Subband-by-subband proportional-fair allocation, bounded by what each robot needs.

    Each round, every free subband goes to the robot with the highest metric among those
    that still need subbands; a robot offered more than it needs keeps its best ones
    (by metric) and the rest stay free for the next round. At most ``num_rounds`` rounds
    (each round settles at least one subband while demand and supply remain).

    :input metric: ``[E, R, S]`` PF metric (achievable rate over average throughput), > -inf.
    :input need: ``[E, R]`` subbands each robot can use (0: nothing known, never scheduled).
    :input is_free: ``[E, S]`` bool, subbands open to new transmissions.
    :input order: ``[E, R, S]`` each robot's subbands by decreasing metric (``argsort`` of
        ``metric``; a caller whose metric ranks subbands the same way for many calls may
        pass it once computed).
    :input stop_early: stop once no open subband has a robot that needs it (a host-side
        branch: on a GPU it costs a sync per round, so leave it off there).
    :output: ``[E, R, S]`` bool; each subband goes to at most one robot.
    """
    if order is None:
        order = torch.argsort(metric, dim=-1, descending=True)
    alloc = torch.zeros_like(metric, dtype=torch.bool)
    need_left = need
    is_open = is_free  # [E, S] subbands still to settle
    neg_inf = torch.full((), -math.inf, dtype=metric.dtype, device=metric.device)
    for i in range(num_rounds):
        is_cand = (need_left > 0).unsqueeze(-1) & is_open.unsqueeze(1)  # [E, R, S]
        if stop_early and i > 0 and not bool(is_cand.any()):
            break
        m = torch.where(is_cand, metric, neg_inf)
        best = m.max(1)  # over robots: [E, S]
        has = best.values > neg_inf
        winner = best.indices.unsqueeze(1)  # [E, 1, S]
        offered = torch.zeros_like(alloc).scatter_(1, winner, has.unsqueeze(1))
        offered_sorted = torch.gather(offered, -1, order)
        rank = offered_sorted.cumsum(-1)  # [E, R, S] offered subbands so far, best first
        kept = torch.zeros_like(alloc).scatter_(-1, order, offered_sorted & (rank <= need_left.unsqueeze(-1)))
        alloc |= kept
        need_left = need_left - torch.minimum(rank[..., -1], need_left)
        # A subband nobody wanted stays unwanted (needs only shrink); a declined one reopens.
        is_open = has & ~torch.gather(kept, 1, winner).squeeze(1)
    return alloc


def rayleigh_power(shape, generator: torch.Generator, dtype: torch.dtype, device) -> torch.Tensor:
    """Rayleigh-fading power gains ``|h|^2 ~ Exp(1)`` (mean 1), from the given generator.

    :output: ``[*shape]``.
    """
    u = torch.rand(shape, generator=generator, dtype=dtype, device=device)
    return -torch.log1p(-u)
