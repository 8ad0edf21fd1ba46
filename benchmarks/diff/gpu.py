"""The CUDA rows of the last device check, for the page.

The pipeline runs where its users run it, mostly without a GPU. The CUDA rows come from one prepared
run on a GPU machine (``benchmarks/perf/gpu_check.sh``): its measurements
(``benchmarks/perf/gpu_rows.py``, committed as ``benchmarks/perf/results/gpu_check.json``) and the
CUDA tests' log beside them. This stage reads both, checks the rows against what the config expects
(every model and variant up to the largest batch size, the books of each discrete rollout balanced,
the gradients finite), and derives the side-by-side ratios the page states: ``cuda_graph`` over
``eager`` per discrete level and E, ``compiled`` over ``eager`` per relaxed model and E. A new device
run (its files committed) reruns the stage.
"""

import json
import re
from pathlib import Path

from _common import run

TESTS_LINE = re.compile(r"^=*\s*(?P<line>(?:\d+ \w+(?:, )?)+ in [\d.]+s(?: \([\d:]+\))?)\s*=*$")


def tests_summary(log: str) -> dict:
    """The pytest summary of the CUDA tests' log: ``{"line", "passed", "failed", "errors", "skipped"}``."""
    lines = [m.group("line") for m in map(TESTS_LINE.match, log.splitlines()) if m]
    if not lines:
        return {"line": None, "passed": None, "failed": None, "errors": None, "skipped": None}
    counts = dict((w, int(n)) for n, w in re.findall(r"(\d+) (\w+)", lines[-1]))
    return {"line": lines[-1], "passed": counts.get("passed", 0), "failed": counts.get("failed", 0),
            "errors": counts.get("errors", counts.get("error", 0)), "skipped": counts.get("skipped", 0)}


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each ``cuda_graph`` or ``compiled`` row with ``speedup_vs_eager``: its cell-steps per second
    over the ``eager`` row's of the same model and E (None where either did not run)."""
    eager = {(r["model"], r["E"]): r.get("cell_steps_per_s") for r in rows if r["variant"] == "eager"}
    out = []
    for r in rows:
        base, rate = eager.get((r["model"], r["E"])), r.get("cell_steps_per_s")
        ratio = rate / base if r["variant"] != "eager" and rate and base else None
        out.append({**r, "speedup_vs_eager": ratio})
    return out


def missing(rows: list[dict], expect: dict) -> list[str]:
    """The expected (model, variant) pairs that have no measured row at ``E_max``."""
    have = {(r["model"], r["variant"]) for r in rows
            if r["E"] == expect["E_max"] and r.get("cell_steps_per_s")}
    wanted = [(m, v) for m in expect["discrete"] for v in expect["discrete_variants"]]
    wanted += [(m, v) for m in expect["relaxed"] for v in expect["relaxed_variants"]]
    return [f"{m} {v}" for m, v in wanted if (m, v) not in have]


def artifact(measured: dict, tests_log: str, expect: dict) -> dict:
    """``{"summary", "table"}`` of a device check (``gpu_rows.py``'s document) and its tests' log."""
    tests = tests_summary(tests_log)
    rows = with_ratios(measured["rows"])
    discrete = [r for r in rows if r["kind"] == "discrete" and r.get("cell_steps_per_s")]
    relaxed = [r for r in rows if r["kind"] == "diff" and r.get("cell_steps_per_s")]
    lacking = missing(rows, expect)
    l2 = [r for r in discrete if r["model"] == "L2-legacy" and r["variant"] == "cuda_graph"]
    summary = {
        "commit": measured["commit"], "date_utc": measured["date_utc"], "device": measured["device"],
        "torch": measured["torch"], "cuda": measured["cuda"], "R": measured["R"],
        "rows": len(rows), "rows_failed": sum(r.get("error") is not None for r in rows),
        "rows_skipped": len(measured["skipped"]), "missing": ", ".join(lacking) or None,
        "complete": not lacking, "E_max": expect["E_max"],
        "books_balanced": all(r["books_balanced"] for r in discrete),
        "grads_finite": all(r["grad_finite"] for r in relaxed),
        "tests_line": tests["line"], "tests_passed": tests["passed"], "tests_failed": tests["failed"],
        "tests_errors": tests["errors"],
        "tests_ok": bool(tests["line"]) and not (tests["failed"] or tests["errors"]),
        "l2_graphs": max((r["graphs"] for r in l2), default=None),
        "l2_capture_s_max": max((r["first_steps_s"] for r in l2), default=None),
        "wall_s_device": measured["wall_s"],
    }
    return {"summary": summary, "table": rows}


def main(stage, params: dict, out: dict) -> None:
    """The committed device check's CUDA rows, checked and with their ratios."""
    from _plots import gpu_rows

    measured = json.loads(Path(out["measured"]).read_text())
    data = artifact(measured, Path(out["tests"]).read_text(), params["expect"])
    gpu_rows(data["table"], out["figure"], measured["device"])
    stage.write_json(out["json"], {**data, "figure": Path(out["figure"]).name})


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
