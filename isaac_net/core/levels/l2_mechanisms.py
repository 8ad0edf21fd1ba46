"""The mechanisms of L2-legacy as small pure functions (docs/design.md §2 "L2-legacy").

Each one takes tensors and returns tensors, with no engine state, so that it can be
tested alone. The level (:mod:`isaac_net.core.levels.l2_legacy`) strings them together
slot by slot. Shapes use ``E`` envs, ``R`` robots, ``S`` subbands, ``M`` MCS indices.
"""

from __future__ import annotations

import math
import typing

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
                       num_alloc: torch.Tensor | None = None, dim: int = -1) -> torch.Tensor:
    """Effective SINR of a TB spread over several subbands (Shannon mutual-information ESM).

    The equivalent of EESM with the Shannon capacity as the information measure (MIESM):

    .. math::
        \\gamma_\\mathrm{eff} = 2^{\\frac{1}{n}\\sum_{b \\in \\mathrm{alloc}} \\log_2(1 + \\gamma_b)} - 1

    It has no per-MCS calibration factor, is exact for a flat channel, and lies between
    the smallest and the mean per-subband SINR.

    :input sinr_lin: ``[..., S]`` per-subband SINR, linear (finite, >= 0). :input is_alloc: ``[..., S]`` bool.
    :input num_alloc: ``[...]`` the number of allocated subbands, if the caller has it.
    :param dim: the subbands' dimension (the last by default).
    :output: ``[...]`` linear (0 where nothing is allocated).
    """
    if num_alloc is None:
        num_alloc = torch.count_nonzero(is_alloc, dim)
    # log2(1 + sinr) is finite and >= 0, so a product with the 0/1 mask gives the values of
    # torch.where(is_alloc, ., 0) (a data-dependent branch per element, several times slower).
    mi = torch.add(sinr_lin, 1.0).log2_().mul_(as_float(is_alloc, sinr_lin.dtype)).sum(dim)
    return torch.exp2(mi / num_alloc.clamp(min=1)) - 1.0


def as_float(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as 0/1 of ``dtype`` (through uint8: a direct bool conversion is several times slower)."""
    return as_uint8(mask).to(dtype)


# A bool mask and its 0/1 bytes are the same storage: a view converts for free.
def as_bool(mask01: torch.Tensor) -> torch.Tensor:
    """A uint8 0/1 mask as bool."""
    return mask01.view(torch.bool)


def as_uint8(mask: torch.Tensor) -> torch.Tensor:
    """A bool mask as uint8 0/1."""
    return mask.view(torch.uint8)


def count_true(mask: torch.Tensor, dim: int) -> torch.Tensor:
    """``count_nonzero(mask, dim)`` of a bool mask in a small integer type (uint8 below 255, so that
    adding 1 cannot wrap): no conversion of the mask to int64, several times faster on the CPU."""
    return as_uint8(mask).sum(dim, dtype=torch.uint8 if mask.shape[dim] < 255 else torch.int32)


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


def subbands_needed(known_bytes: torch.Tensor, cap: torch.Tensor, max_sb: torch.Tensor,
                    dim: int = -1) -> torch.Tensor:
    """Fewest subbands whose capacity covers the known buffer, at most ``max_sb`` (0 when empty).

    :input known_bytes: ``[E, R]`` bytes the gNB knows of. :input cap: ``[E, R, S]`` from
        :func:`capacity_by_subbands`. :input max_sb: ``[E, R]`` long.
    :param dim: the subbands' dimension of ``cap`` (``known_bytes`` and ``max_sb`` lack it): the
        default for ``[E, R, S]``, 1 for the allocation's envs-last layout (``cap`` ``[R, S, E]``,
        the others ``[R, E]``).
    :output: ``[E, R]`` (or ``[R, E]``) long.
    """
    need = torch.minimum(count_true(cap < known_bytes.unsqueeze(dim), dim) + 1, max_sb)
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
    alloc = pf_allocate_envs_last(to_envs_last(metric), need.t(), is_free.t(), num_rounds,
                                  PfOrder.of(order), stop_early=stop_early)
    return to_envs_first(alloc)


# The allocation runs with the envs on the last dimension ([R, S, E]: robots, subbands, envs).
# There a per-robot ([R, 1, E]) or per-subband ([1, S, E]) operand broadcasts over an outer
# dimension and a reduction over the robots or subbands is one over an outer dimension: each
# operation is vectorised over the envs, where on [E, R, S] it would be an element-by-element
# loop of 8 or 12. The allocation's arithmetic is exact (comparisons, max), so the layout
# changes no bit.
def to_envs_last(x: torch.Tensor) -> torch.Tensor:
    """``[E, R, S]`` -> ``[R, S, E]`` (contiguous)."""
    E, R, S = x.shape
    return x.reshape(E, R * S).t().contiguous().view(R, S, E)


def to_envs_first(x: torch.Tensor) -> torch.Tensor:
    """``[R, S, E]`` -> ``[E, R, S]`` (contiguous)."""
    R, S, E = x.shape
    return x.reshape(R * S, E).t().contiguous().view(E, R, S)


# A robot's offered subbands as a bit mask in its own order (bit j: its j-th best subband) give
# through a table the positions it keeps: a table of 2^S * (S + 1) entries up to this many subbands.
_TABLE_MAX_SUBBANDS = 16
_tables: dict = {}


def _keep_table(S: int, device) -> torch.Tensor:
    """For each offered mask ``b`` in ``[0, 2^S)`` and need ``k`` in ``[0, S]``, at ``b * (S + 1) + k``:
    ``thr`` such that the robot keeps the positions ``j < thr`` of ``b`` (its first ``k`` offered). uint8."""
    key = ("keep", S, device)
    if key not in _tables:
        bits = (torch.arange(2 ** S).unsqueeze(1) >> torch.arange(S)) & 1  # [2^S, S]
        rank = bits.cumsum(1)  # offered so far, best first
        thr = (rank.unsqueeze(1) <= torch.arange(S + 1).view(1, -1, 1)).sum(-1)  # [2^S, S + 1]
        _tables[key] = thr.to(torch.uint8).flatten().to(device)
    return _tables[key]


def _out_table(S: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``[S + 1]``: -inf at a need of 0 (the robot takes no part), 0 above."""
    key = ("out", S, dtype, device)
    if key not in _tables:
        _tables[key] = torch.zeros(S + 1, dtype=dtype, device=device)
        _tables[key][0] = -math.inf
    return _tables[key]


class PfOrder(typing.NamedTuple):
    """Each robot's subbands by decreasing metric, in the forms :func:`pf_allocate_envs_last` uses.
    All ``[R, S, E]``."""

    rank: torch.Tensor  # uint8 (long from 256 subbands), the position of each subband in the order
    weight: torch.Tensor | None  # int16 or int32, (S + 1) * 2^rank: the keep table's index of an offered mask
    order: torch.Tensor | None  # long, the subband at each position (as argsort), where there is no table

    @classmethod
    def of(cls, order: torch.Tensor) -> "PfOrder":
        """From ``order`` ``[E, R, S]`` (``argsort`` of the metric, descending)."""
        S = order.shape[-1]
        pos = torch.arange(S, device=order.device).expand(order.shape)
        rank = torch.empty_like(order).scatter_(-1, order, pos)
        rank = to_envs_last(rank.to(torch.uint8) if S < 256 else rank)  # (a narrow type transposes faster)
        if S > _TABLE_MAX_SUBBANDS:
            return cls(rank, None, to_envs_last(order))
        # int16 where it fits: its product with uint8 costs less.
        weight = rank.to(torch.int16 if (S + 1) << (S - 1) < 2 ** 15 else torch.int32)
        return cls(rank, (S + 1) << weight, None)


def pf_allocate_envs_last(metric: torch.Tensor, need: torch.Tensor, is_free: torch.Tensor, num_rounds: int,
                          order: PfOrder, *, stop_early: bool = False) -> torch.Tensor:
    """:func:`pf_allocate` with the envs last: ``metric`` ``[R, S, E]``, ``need`` ``[R, E]``,
    ``is_free`` ``[S, E]``; ``order`` from :meth:`PfOrder.of`. The same allocation, ``[R, S, E]`` bool.

    ``stop_early`` also allows the other host-side branch, a test for ties.
    """
    R, S, E = metric.shape
    table = _keep_table(S, metric.device) if order.weight is not None else None
    out = _out_table(S, metric.dtype, metric.device)
    count = torch.uint8 if max(R, S) < 256 else torch.int32  # for counts of robots or subbands
    # A robot keeps at most S subbands: a larger need acts as S.
    need_left = need.clamp(0, S).to(torch.int32, memory_format=torch.contiguous_format)  # [R, E]
    is_open = is_free  # [S, E] subbands still to settle
    alloc = torch.zeros(R, S, E, dtype=torch.bool, device=metric.device)
    for i in range(num_rounds):
        m = metric + out.index_select(0, need_left.view(-1)).view(R, 1, E)  # -inf: needs nothing (more)
        best = m.amax(0)  # over robots: [S, E]
        has = is_open & (best > -math.inf)
        # The robots at the best metric of each subband someone gets; on a tie the first, as max(1) picks.
        offered = m.eq_(best).bool() & has
        n_off = as_uint8(offered)
        if not stop_early or int(n_off.sum(0, dtype=count).amax()) > 1:
            offered &= ~n_off.cumsum(0, dtype=count).sub_(n_off).bool()
        # Each robot keeps the offered subbands that come first in its order, up to its need.
        if table is not None:
            idx = (n_off * order.weight).sum(1, dtype=torch.int32).add_(need_left)
            kept = offered & (order.rank < table.index_select(0, idx.view(-1)).view(R, 1, E))
        else:
            rank = as_uint8(torch.gather(offered, 1, order.order)).cumsum(1, dtype=torch.int32)
            kept = offered & (order.rank < (rank <= need_left.unsqueeze(1)).sum(1, keepdim=True))
        alloc |= kept
        if i + 1 < num_rounds:
            n_kept = as_uint8(kept)
            # A subband nobody wanted stays unwanted (needs only shrink); a declined one reopens.
            is_open = has ^ as_bool(n_kept.amax(0))
            # Without an open subband nothing changes any more (a sufficient test: cheaper than the exact).
            if stop_early and not bool(is_open.any()):
                break
            need_left.sub_(n_kept.sum(1, dtype=count))
    return alloc


def rayleigh_power(shape, generator: torch.Generator, dtype: torch.dtype, device) -> torch.Tensor:
    """Rayleigh-fading power gains ``|h|^2 ~ Exp(1)`` (mean 1), from the given generator.

    :output: ``[*shape]``.
    """
    u = torch.rand(shape, generator=generator, dtype=dtype, device=device)
    return -torch.log1p(-u)
