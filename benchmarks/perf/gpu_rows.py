"""The CUDA rows of the page, measured side by side in one process on one GPU.

The discrete levels (L1, QA, L2-legacy) as ``backend="eager"`` and ``backend="cuda_graph"``, and the
relaxed models (L1D, QAD) forward + backward, eager and ``compile=True``, at batch sizes up to
E = 16384 (R = 8, float32, binary sends with p = 0.4, message sizes 8 / 30 kB, positions in
[40, 140]^2 m). Each timed call ends with ``torch.cuda.synchronize()``. A row's first calls (a
graph's capture, a compile) are timed apart from its steady ones. Rows are written to ``--out`` as
they come, so a run cut short keeps what it measured; a row that fails records its error.

Run by ``benchmarks/perf/gpu_check.sh`` on a GPU machine; ``--device cpu`` is a dry run of the
eager rows. The pipeline's stage ``gpu`` puts the committed result on the page.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
import traceback
from pathlib import Path

import torch

from isaac_net.core import make_engine
from isaac_net.core.diff import DiffFluid, rollout

R = 8
P_SEND = 0.4
SIZES_BYTES = (8000.0, 30_000.0)
DISCRETE_E = (16, 256, 1024, 4096, 16384)
DIFF_E = (16, 1024, 16384)
DIFF_T = 60
# Steps timed per row: a whole number of L2-legacy's phases (21 at the defaults) for its graphs.
TIMED_STEPS = {"L1": 42, "QA": 42, "L2-legacy": 21}
# L2-legacy eager launches thousands of kernels a step: fewer steps, the same time per step.
EAGER_L2_STEPS = 6


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inputs(E: int, steps: int, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    send = (torch.rand(steps, E, R, generator=g) < P_SEND).float()
    msg_bytes = torch.where(torch.rand(E, R, generator=g) < 0.5, *SIZES_BYTES)
    pos = 40.0 + 100.0 * torch.rand(E, R, 2, generator=g)
    return send.to(device), msg_bytes.to(device), pos.to(device)


def discrete_row(level: str, backend: str, E: int, device: torch.device) -> dict:
    """Steps of one engine: the first ``warm`` (captures, for cuda_graph L2-legacy one per phase) and
    the timed ones; the books (offered = delivered + timeouts + overflow + queued) checked."""
    timed = EAGER_L2_STEPS if (level, backend) == ("L2-legacy", "eager") else TIMED_STEPS[level]
    warm = TIMED_STEPS[level] if backend == "cuda_graph" else 2
    send, msg_bytes, pos = _inputs(E, warm + timed, device)
    _sync(device)
    t0 = time.perf_counter()
    eng = make_engine(level, E, R, device, dtype=torch.float32, seed=0, backend=backend)
    total = {}

    def step(t):
        out = eng.step(send[t], msg_bytes, pos=pos)
        for k, v in out.items():
            total[k] = total.get(k, 0.0) + v
        return out

    for t in range(warm):
        step(t)
    _sync(device)
    t1 = time.perf_counter()
    for t in range(warm, warm + timed):
        out = step(t)
    _sync(device)
    t2 = time.perf_counter()
    rest = total["delivered"] + total["timeouts"] + total["overflow"] + out["queued_msgs"]
    return dict(kind="discrete", model=level, variant=backend, E=E, R=R, steps=timed,
                s_per_step=(t2 - t1) / timed, cell_steps_per_s=E * timed / (t2 - t1),
                first_steps=warm, first_steps_s=t1 - t0, graphs=getattr(eng, "num_graphs", None),
                books_balanced=bool(torch.equal(total["offered"], rest)),
                delivered_share=float(total["delivered"].sum() / total["offered"].sum()))


def _fwd_bwd(net: DiffFluid, p, B, tx, pos, device) -> None:
    net.reset()
    net.detach()
    k = rollout(net, DIFF_T, p, B, pos=pos, tx_dbm=tx)
    (k["mean_delay"] + 0.5 * k["mean_aoi"] + 50.0 * k["mean_energy_j"]).backward()
    _sync(device)


def diff_row(model: str, variant: str, E: int, device: torch.device, repeats: int = 3) -> dict:
    """Forward + backward of a ``DIFF_T``-step rollout of the quick-start loss (as the cost stage);
    ``model`` L1D or QAD, ``variant`` eager or compiled."""
    mode, compiled = model.removesuffix("D"), variant == "compiled"
    _, B, pos = _inputs(E, 1, device)
    p = torch.full((E, R), P_SEND, device=device, requires_grad=True)
    tx = torch.full((E, R), 23.0, device=device, requires_grad=True)
    B.requires_grad_()
    pos.requires_grad_()
    net = DiffFluid(E, R, device, mode=mode, tau=0.05, compile=compiled)
    t0 = time.perf_counter()
    _fwd_bwd(net, p, B, tx, pos, device)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _fwd_bwd(net, p, B, tx, pos, device)
        times.append(time.perf_counter() - t0)
    best = min(times)
    return dict(kind="diff", model=model, variant=variant, E=E, R=R,
                steps=DIFF_T, s_per_step=best / DIFF_T, cell_steps_per_s=E * DIFF_T / best,
                first_steps=DIFF_T, first_steps_s=first, fwd_bwd_s=best, slots=net.slot_grad,
                grad_finite=bool(torch.isfinite(p.grad).all() and torch.isfinite(tx.grad).all()))


def plan(discrete_E=DISCRETE_E, diff_E=DIFF_E) -> list[tuple]:
    """The rows ``(kind, model, variant, E)`` in the order they run (what matters most first, so a cut
    run keeps it)."""
    rows = [("discrete", "L2-legacy", b, E) for E in discrete_E for b in ("eager", "cuda_graph")]
    rows += [("discrete", lv, b, E) for lv in ("L1", "QA") for E in discrete_E
             for b in ("eager", "cuda_graph")]
    rows += [("diff", m, v, E) for v in ("eager", "compiled") for m in ("L1D", "QAD") for E in diff_E]
    return rows


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file the rows are written to")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="start no row after this many seconds (rows not run are listed as skipped)")
    ap.add_argument("--commit", default=None, help="the commit measured (default: git rev-parse HEAD)")
    ap.add_argument("--small", action="store_true", help="E = 16 and 64 only (a dry run)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    gpu = device.type == "cuda"
    doc = dict(
        commit=args.commit or _git_commit(), date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        device=torch.cuda.get_device_name(device) if gpu else platform.processor() or "cpu",
        torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version(),
        cpu_threads=torch.get_num_threads(), R=R, p_send=P_SEND, sizes_bytes=list(SIZES_BYTES),
        budget_s=args.budget_s, rows=[], skipped=[])
    small = ((16, 64), (16, 64)) if args.small else (DISCRETE_E, DIFF_E)
    out = Path(args.out)
    start = time.perf_counter()
    for kind, model, variant, E in plan(*small):
        name = f"{model} {variant} E={E}"
        if time.perf_counter() - start > args.budget_s:
            doc["skipped"].append(name)
            continue
        if not gpu and variant == "cuda_graph":
            continue
        if gpu:
            torch.cuda.reset_peak_memory_stats(device)
        try:
            row = (discrete_row(model, variant, E, device) if kind == "discrete"
                   else diff_row(model, variant, E, device))
            row["error"] = None
        except Exception as e:  # noqa: BLE001  (a failed row is a result: it goes on the page)
            row = dict(kind=kind, model=model, variant=variant, E=E, R=R,
                       error=f"{type(e).__name__}: {e}"[:500])
            traceback.print_exc()
        row["peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20 if gpu else None
        doc["rows"].append(row)
        doc["wall_s"] = time.perf_counter() - start
        out.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
        rate = row.get("cell_steps_per_s")
        print(f"{time.perf_counter() - start:7.1f} s  {name}: "
              + (f"{rate:,.0f} cell-steps/s, first {row['first_steps_s']:.2f} s" if rate else row["error"]),
              flush=True)
    doc["wall_s"] = time.perf_counter() - start
    out.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    return 0 if all(r["error"] is None for r in doc["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
