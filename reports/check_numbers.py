"""Check that every number on a rendered page equals a value in the artifacts it came from.

The renderer marks each section with ``<!-- artifacts: path [path ...] -->``; a number in
that section must equal, to the precision it is printed with, a number of one of those
artifacts (a JSON number, or a number inside one of its strings or keys). Code spans, fenced
code, HTML comments, headings and link targets are skipped (commands, paths, versions, commit
hashes). Text before the first marker may hold no number at all.

Usage::

    python reports/check_numbers.py benchmarks/diff/results/ci/checks_and_measurements.md

Exit status 1 and one line per number that matches nothing.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!--\s*artifacts:(?P<paths>[^>]*?)-->")
NUMBER = re.compile(r"(?<![\w.@/\\-])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.]*\w)")
SKIP = [
    re.compile(r"```.*?```", re.S),  # fenced code
    re.compile(r"`[^`\n]*`"),  # code spans
    re.compile(r"<!--.*?-->", re.S),  # comments (the markers are read before this)
    re.compile(r"\]\([^)]*\)"),  # link and image targets
    re.compile(r"^#.*$", re.M),  # headings name sections ("Equivalence at tau = 0"); they hold no measurement
]


def artifact_numbers(data) -> list[float]:
    """Every number in a JSON value, including numbers written inside its strings and keys."""
    out: list[float] = []

    def walk(x):
        if isinstance(x, bool) or x is None:
            return
        if isinstance(x, (int, float)):
            out.append(float(x))
        elif isinstance(x, str):
            out.extend(float(m.group()) for m in NUMBER.finditer(x))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(k)  # keys are printed too: generic tables take their headers from them
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(data)
    return out


def quantum(token: str) -> float:
    """Half a unit in the last printed place of ``token``."""
    mant, _, exp = token.lower().partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return 0.5 * 10.0 ** (-decimals + (int(exp) if exp else 0))


def matches(token: str, values: list[float]) -> bool:
    x, q = float(token), quantum(token)
    return any(abs(v - x) <= q * (1 + 1e-9) + 1e-12 * abs(x) for v in values if math.isfinite(v))


def strip(text: str) -> str:
    for rx in SKIP:
        text = rx.sub(lambda m: " " * len(m.group()), text)
    return text


def check_page(text: str, base: Path = REPO) -> list[str]:
    """Problems found on the page (empty when every number matches its artifacts)."""
    problems: list[str] = []
    marks = list(MARKER.finditer(text))
    sections = [(0, marks[0].start() if marks else len(text), [])]
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        sections.append((m.end(), end, m.group("paths").split()))
    cache: dict[str, list[float]] = {}
    for start, end, paths in sections:
        values: list[float] = []
        for p in paths:
            if p not in cache:
                path = Path(p) if Path(p).is_absolute() else base / p
                try:
                    cache[p] = artifact_numbers(json.loads(path.read_text()))
                except (OSError, json.JSONDecodeError) as err:
                    problems.append(f"artifact {p}: cannot read: {err}")
                    cache[p] = []
            values += cache[p]
        body = strip(text[start:end])
        for m in NUMBER.finditer(body):
            if not matches(m.group(), values):
                line = text.count("\n", 0, start + m.start()) + 1
                where = ", ".join(paths) if paths else "no artifact (text before the first section marker)"
                context = text.splitlines()[line - 1].strip()
                problems.append(f"line {line}: {m.group()} not in {where}: {context[:160]}")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    problems = check_page(Path(argv[0]).read_text())
    for p in problems:
        print(p)
    print(f"{argv[0]}: {'OK' if not problems else f'{len(problems)} number(s) without an artifact value'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
