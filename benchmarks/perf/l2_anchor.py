"""L2-legacy's default step at an earlier commit against this checkout's, with the box's yardstick:
the anchor of the fast L2-legacy issue's bar (config ``cost.l2_backends.anchor``).

The bar compares ``make_engine("L2-legacy", E, 8, "cpu")`` by default with the same call at the
commit before the fast step (its default then: the eager slot loop), scaled by a CPU yardstick
timed in the same process. This script measures the earlier commit once, on this box: it checks
the commit out into a temporary git worktree, then times both checkouts' default engines in child
processes, alternating (one thread, the cost stage's inputs: R = 8, T = 60 steps, p = 0.4, message
sizes 4 and 30 kB, 23 dBm; best of ``--repeats`` passes each), each child with the yardstick of
``benchmarks/diff/cost.py`` (a fixed chain of small torch ops, independent of the library). It
prints the config block: the earlier commit's seconds per rollout per E and the best yardstick of
the same children; the cost stage scales each by its own yardstick over that one.

    python benchmarks/perf/l2_anchor.py --commit 3dbf7ff            # prints the anchor block
    python benchmarks/perf/l2_anchor.py --commit 3dbf7ff --E 16 64  # fewer batch sizes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
T, R, P, SIZES_BYTES, TX_DBM, SEED = 60, 8, 0.4, (4000, 30000), 23.0, 0


def measure(inputs_path: str, E: int, repeats: int) -> dict:
    """In a child (the checkout to time first on ``sys.path``): the best of ``repeats`` rollouts of
    the default L2-legacy engine at ``E`` on the inputs saved at ``inputs_path`` and the best of
    ``repeats`` yardstick passes, s."""
    import torch

    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    from _yardstick import yardstick_s  # torch alone: the same in either checkout

    from isaac_net.core import make_engine

    torch.set_num_threads(1)
    x = torch.load(inputs_path)  # the parent's (this checkout's draw_inputs): the same for both commits
    send = [(x["u"][t] < x["p"]).float() for t in range(T)]
    make_engine("L2-legacy", E, R, "cpu", seed=SEED).step(send[0], x["B"], pos=x["pos"], tx_dbm=x["tx"])
    best = math.inf
    for _ in range(repeats):
        eng = make_engine("L2-legacy", E, R, "cpu", seed=SEED)
        t0 = time.perf_counter()
        with torch.no_grad():
            for t in range(T):
                eng.step(send[t], x["B"], pos=x["pos"], tx_dbm=x["tx"])
        best = min(best, time.perf_counter() - t0)
    import isaac_net

    return {"rollout_s": best, "yardstick_s": yardstick_s(repeats), "library": str(Path(isaac_net.__file__))}


def _inputs(E: int, path: Path) -> str:
    """The cost stage's inputs at ``E`` (this checkout's ``draw_inputs``), saved for the children."""
    import torch

    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    from _common import draw_inputs

    torch.save(draw_inputs(E, R, T, SIZES_BYTES, SEED, p=P, tx_dbm=TX_DBM, dtype=torch.float32), path)
    return str(path)


def _child(tree: Path, inputs_path: str, E: int, repeats: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", inputs_path, str(E), str(repeats)]
    out = subprocess.run(cmd, env=env, cwd=str(tree), capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", help="the earlier commit (a git revision of this repository)")
    ap.add_argument("--E", type=int, nargs="+", default=[16, 64, 256, 1024], help="batch sizes (cells)")
    ap.add_argument("--repeats", type=int, default=3, help="passes per child; the best counts")
    ap.add_argument("--rounds", type=int, default=2, help="children per checkout and E, alternating")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), int(args.child[2]))))
        return
    if not args.commit:
        ap.error("--commit is required")
    if args.repeats < 1 or args.rounds < 1 or any(E < 1 for E in args.E):
        ap.error("--repeats, --rounds and --E must be positive")
    sha = subprocess.run(["git", "rev-parse", "--short", args.commit], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="isaac_anchor_") as tmp:
        old = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), sha], cwd=REPO, check=True,
                       capture_output=True)
        try:
            best = {"old": {}, "new": {}}
            for E in args.E:
                inputs = _inputs(E, Path(tmp) / f"inputs_E{E}.pt")
                for _ in range(args.rounds):
                    for which, tree in (("old", old), ("new", REPO)):
                        r = _child(tree, inputs, E, args.repeats)
                        assert Path(r["library"]).is_relative_to(tree), r["library"]  # the checkout asked for
                        b = best[which].setdefault(E, {"rollout_s": math.inf, "yardstick_s": math.inf})
                        b["rollout_s"] = min(b["rollout_s"], r["rollout_s"])
                        b["yardstick_s"] = min(b["yardstick_s"], r["yardstick_s"])
                o, n = best["old"][E], best["new"][E]
                print(f"E = {E}: {sha} {o['rollout_s']:.4g} s, this checkout {n['rollout_s']:.4g} s "
                      f"({o['rollout_s'] / n['rollout_s']:.2f}x); yardstick {o['yardstick_s']:.4g} / "
                      f"{n['yardstick_s']:.4g} s", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO, check=False,
                           capture_output=True)
    def per_E(key):
        return "{" + ", ".join(f'"{E}": {best["old"][E][key]:.4g}' for E in args.E) + "}"

    print(f"    anchor:             # L2-legacy's default step at {sha} (benchmarks/perf/l2_anchor.py, "
          f"{time.strftime('%Y-%m-%d')})\n"
          f"      commit: {sha}\n      rollout_s: {per_E('rollout_s')}\n"
          f"      yardstick_s: {per_E('yardstick_s')}")


if __name__ == "__main__":
    main()
