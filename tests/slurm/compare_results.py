"""Compare the artifacts of two runs of the pipeline (local vs SLURM) in two directories.

    python tests/slurm/compare_results.py LOCAL_DIR SLURM_DIR [--newer-than MARKER]

What is compared (the robust comparison agreed for tests/slurm/run_local_cluster.sh):

1. JSON artifacts. Every ``*.json`` file the runs wrote (under the two trees, outside
   ``.snakemake``/``.git``, pages' ``*.trace.json`` left out; with ``--newer-than``, only
   files modified after MARKER) must
   exist in both trees, have the same structure, the same strings/booleans and the same
   numbers, except under keys that hold provenance, wall-clock times or memory (see
   ``volatile_key``: ``provenance``, ``*_s``, ``wall_*``, ``peak_rss_mib``…).
   Numbers are equal when ``|a-b| <= atol + rtol*|b|`` (defaults rtol=1e-9, atol=1e-12:
   same seeds on the same CPU give identical values; the tolerance only absorbs a
   different thread count's summation order). The report says how many were bit-identical.
2. Rendered pages. Every ``*.md``/``*.html`` the runs wrote: the sequence of numeric
   tokens of all lines must be identical in both, except provenance/timing lines
   (``VOLATILE_LINE``) and sections that as a whole measure time or memory
   (``VOLATILE_SECTION``, e.g. "## Cost", "## On a GPU", rates beside the cost stage's, or
   "## This run": the span, the critical path, the replay and the box's yardstick).

Exit code 0 when both agree, 1 otherwise; prints a summary.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

# Keys whose values legitimately differ between two runs of the same computation: the
# provenance block, wall-clock times (the project's unit suffix _s, or _ms) and memory.
# Matched on whole words of the key (split at _ - and spaces), so that e.g. "load",
# "candidates" or "envs_per_seed" stay compared.
VOLATILE_WORDS = {
    "provenance",
    "wall",
    "elapsed",
    "duration",
    "runtime",
    "seconds",
    "time",
    "timestamp",
    "date",
    "started",
    "finished",
    "host",
    "hostname",
    "git",
    "commit",
    "version",
    "python",
    "torch",
    "platform",
    "pid",
    "jobid",
    "rss",
    "mib",
    "throughput",
    "speedup",
}


def volatile_key(key: str) -> bool:
    words = re.split(r"[_\-\s]+", str(key).lower())
    return bool(VOLATILE_WORDS.intersection(words)) or words[-1] in ("s", "ms")


# lines of a rendered page that carry provenance or timing
VOLATILE_LINE = re.compile(
    r"(?i)(^_?provenance|generated|commit|\bgit\b|\bversions?\b|python `|torch `|platform|hostname|"
    r"timestamp|\d{4}-\d{2}-\d{2}|wall|elapsed|duration|runtime|\btook\b|\bseconds?\b|"
    r"\d\s*s\b|, s\b|\bms\b|\btimes?\b|load average|\brss\b|mib|job ?id|slurm|/tmp/)"
)
# sections of a rendered page that are measurements of time/memory as a whole
VOLATILE_SECTION = re.compile(
    r"(?i)^#+\s*(cost|timing|performance|gradients against black-box|on a gpu|this run)\b")
# Artifacts whose numbers follow from budgets of wall time (the black-box optimisers of fleet_opt
# run for a multiple of the gradient's seconds): compared by presence and keys, not by value.
WALL_BUDGETED = re.compile(r"(^|/)fleet_opt(\.json$|/)")
NUM_RE = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|nan|inf", re.I)
SKIP_DIRS = {".snakemake", ".git", "__pycache__", ".pytest_cache", ".venv"}


# A page's trace (reports/render.py): where on the page each number landed. Its character spans
# move with the page's provenance and timing lines; the numbers themselves are the page's,
# compared as tokens, and the artifacts', compared as JSON.
DERIVED_SUFFIXES = (".trace.json",)


def produced(root: Path, suffixes: tuple[str, ...], newer_than: float | None) -> dict[str, Path]:
    out = {}
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if any(part in SKIP_DIRS for part in rel.parts) or not p.is_file():
            continue
        if p.suffix.lower() not in suffixes:
            continue
        if p.name.endswith(DERIVED_SUFFIXES):  # derived from a page whose numbers are compared below
            continue
        if newer_than is not None and p.stat().st_mtime <= newer_than:
            continue
        out[str(rel)] = p
    return out


class Diff:
    def __init__(self, rtol: float, atol: float):
        self.rtol, self.atol = rtol, atol
        self.n_num = self.n_identical = self.n_other = self.n_skipped = 0
        self.max_rel = 0.0
        self.problems: list[str] = []

    def walk(self, a, b, where: str):
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                if volatile_key(k):
                    self.n_skipped += 1
                    continue
                if k not in a or k not in b:
                    self.problems.append(f"{where}/{k}: only in {'slurm' if k in b else 'local'} run")
                    continue
                self.walk(a[k], b[k], f"{where}/{k}")
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                self.problems.append(f"{where}: list length {len(a)} vs {len(b)}")
                return
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                self.walk(x, y, f"{where}[{i}]")
        elif _is_num(a) and _is_num(b):
            self.n_num += 1
            fa, fb = float(a), float(b)
            if fa == fb or (math.isnan(fa) and math.isnan(fb)):
                self.n_identical += 1
                return
            rel = abs(fa - fb) / max(abs(fb), 1e-300)
            self.max_rel = max(self.max_rel, rel)
            if not abs(fa - fb) <= self.atol + self.rtol * abs(fb):
                self.problems.append(f"{where}: local {a!r} vs slurm {b!r} (rel diff {rel:.3g})")
        else:
            self.n_other += 1
            if a != b:
                self.problems.append(f"{where}: local {a!r} vs slurm {b!r}")


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def page_tokens(path: Path) -> tuple[list[str], int]:
    toks, dropped = [], 0
    text = path.read_text(errors="replace")
    text = re.sub(r"data:[\w/+.-]+;base64,[A-Za-z0-9+/=\s]+", "", text)  # embedded images
    skip_level = 0  # inside a volatile section: its heading level
    for line in text.splitlines():
        heading = re.match(r"^(#+)\s", line)
        if heading:
            level = len(heading.group(1))
            if skip_level and level <= skip_level:
                skip_level = 0
            if not skip_level and VOLATILE_SECTION.match(line):
                skip_level = level
        if skip_level or VOLATILE_LINE.search(line):
            dropped += 1
            continue
        toks.extend(NUM_RE.findall(line))
    return toks, dropped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("local_dir", type=Path)
    ap.add_argument("slurm_dir", type=Path)
    ap.add_argument("--newer-than", type=Path, help="only files modified after this marker file")
    ap.add_argument("--rtol", type=float, default=1e-9)
    ap.add_argument("--atol", type=float, default=1e-12)
    args = ap.parse_args(argv)
    newer = args.newer_than.stat().st_mtime if args.newer_than else None

    problems: list[str] = []
    jl = produced(args.local_dir, (".json",), newer)
    js = produced(args.slurm_dir, (".json",), newer)
    for rel in sorted(set(jl) ^ set(js)):
        problems.append(f"{rel}: written only by the {'local' if rel in jl else 'slurm'} run")
    d = Diff(args.rtol, args.atol)
    for rel in sorted(set(jl) & set(js)):
        try:
            a, b = json.loads(jl[rel].read_text()), json.loads(js[rel].read_text())
        except ValueError as e:
            problems.append(f"{rel}: not JSON ({e})")
            continue
        if WALL_BUDGETED.search(rel):
            d.n_skipped += 1
            continue
        d.walk(a, b, rel)
    problems += d.problems
    print(
        f"JSON artifacts compared: {len(set(jl) & set(js))} files, {d.n_num} numbers "
        f"({d.n_identical} bit-identical, max rel diff {d.max_rel:.3g}), {d.n_other} other values; "
        f"{d.n_skipped} provenance/timing keys skipped"
    )
    if not (set(jl) & set(js)):
        problems.append("no JSON artifact to compare")

    pl = produced(args.local_dir, (".md", ".html"), newer)
    ps = produced(args.slurm_dir, (".md", ".html"), newer)
    for rel in sorted(set(pl) ^ set(ps)):
        problems.append(f"{rel}: page written only by the {'local' if rel in pl else 'slurm'} run")
    for rel in sorted(set(pl) & set(ps)):
        (ta, da), (tb, _) = page_tokens(pl[rel]), page_tokens(ps[rel])
        if ta != tb:
            first = next(
                (i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb))
            )
            problems.append(
                f"{rel}: numeric tokens differ ({len(ta)} vs {len(tb)} tokens; first "
                f"difference at token {first}: {ta[first : first + 3]} vs {tb[first : first + 3]})"
            )
        print(
            f"page {rel}: {len(ta)} numeric tokens {'identical' if ta == tb else 'DIFFER'} "
            f"({da} provenance/timing lines left out)"
        )
    for p in problems[:40]:
        print(f"MISMATCH: {p}")
    if len(problems) > 40:
        print(f"... and {len(problems) - 40} more")
    print("results agree" if not problems else f"results differ ({len(problems)} problems)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
