"""Which fitted fleet sizes a calibration needs: the order of the fits (each size after the size it
continues from) and the fits that serve a size asked for. Plain Python, no torch: the pipeline's
rules read it to wire one fit job per size (workflow/rules/fan_out.smk)."""

from __future__ import annotations


def _sorted_sizes(sizes) -> list:
    sizes = sorted(int(r) for r in sizes)
    if not sizes or sizes[0] < 1 or len(set(sizes)) != len(sizes):
        raise ValueError(f"sizes: expected distinct fleet sizes >= 1, got {sizes}")
    return sizes


def continuation_order(sizes, ref_R: int) -> list:
    """``(R, neighbour)`` in the order the fleet fit runs them: the reference size first (no
    neighbour), then outwards, each size after the fitted size next to it (its ``neighbour``, whose
    choice narrows its search)."""
    sizes = _sorted_sizes(sizes)
    if ref_R not in sizes:
        raise ValueError(f"ref_R: expected one of the fleet sizes {sizes}, got {ref_R!r}")
    i = sizes.index(ref_R)
    up = [(sizes[k], sizes[k - 1]) for k in range(i + 1, len(sizes))]
    down = [(sizes[k], sizes[k + 1]) for k in range(i - 1, -1, -1)]
    return [(ref_R, None)] + up + down


def serving_sizes(sizes, R: int) -> list:
    """The fitted sizes whose constants give those for ``R`` robots per cell: ``R`` itself when it
    was fitted, the two fitted sizes around it (interpolated between), or outside the fitted range
    the nearest one."""
    sizes = _sorted_sizes(sizes)
    if R in sizes:
        return [R]
    if R < sizes[0] or R > sizes[-1]:
        return [sizes[0] if R < sizes[0] else sizes[-1]]
    hi = next(i for i, r in enumerate(sizes) if r > R)
    return [sizes[hi - 1], sizes[hi]]
