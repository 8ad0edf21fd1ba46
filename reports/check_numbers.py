"""Check that every number on a rendered page was printed from an artifact key.

``render.py`` writes a trace next to the page (``<page>.trace.json``): the page's hash and,
for each number a filter printed, its artifact file, key path, value, text and the
character spans where the text landed. A number on the page passes when a traced span
covers it. The check also re-reads each artifact and finds the traced key in it with the
traced value, and checks that the printed text equals the value to the precision it is
printed with.

The only numbers that need no trace are those the page's words hold by construction:
fenced code and code spans (commands, paths, versions, commit hashes, error messages),
HTML comments, link and image targets, and headings (section names such as "Equivalence
at tau = 0" hold no measurement). Everything else, prose and table cells alike, is
measured and must be traced.

Usage::

    python reports/check_numbers.py benchmarks/diff/results/ci/checks_and_measurements.md [TRACE]

Exit status 1 and one line per untraced or inconsistent number.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"(?<![\w.@/\\-])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.]*\w)")
SKIP = [
    re.compile(r"```.*?```", re.S),  # fenced code
    re.compile(r"`[^`\n]*`"),  # code spans
    re.compile(r"<!--.*?-->", re.S),  # comments
    re.compile(r"\]\([^)]*\)"),  # link and image targets
    re.compile(r"^#.*$", re.M),  # headings name sections; they hold no measurement
]
# A plain key path: stage, then .name or [index] steps. Keys made by arithmetic in the
# template ("(a - b)", "len(x)", "abs(x)") are not looked up.
_STEP = re.compile(r'\.([\w-]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')
_KEY_SUFFIX = " (the key)"


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


def lookup(data, key: str):
    """The value at ``key`` (``stage.summary.x``, ``stage.table[2].y``) of an artifact, or KeyError."""
    stage, _, rest = key.partition(".")
    path, pos = rest and "." + rest, 0
    value = data
    for m in _STEP.finditer(path):
        if m.start() != pos:
            raise KeyError(key)
        if m.group(1) is not None:
            value = value[m.group(1)]
        elif m.group(2) is not None:
            value = value[int(m.group(2))]
        else:
            value = value[json.loads(m.group(3))]
        pos = m.end()
    if pos != len(path):
        raise KeyError(key)
    return value


def _artifact(file: str, cache: dict, base: Path):
    if file not in cache:
        path = Path(file) if Path(file).is_absolute() else base / file
        try:
            cache[file] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            cache[file] = err
    return cache[file]


def check_entry(entry: dict, cache: dict, base: Path) -> list[str]:
    """An entry's text against its value, and its value against its artifact file."""
    problems, key, value = [], entry["key"], entry["value"]
    where = f"{entry['file']}: {key}"
    numeric = value if not isinstance(value, str) else float(value)
    for tok in NUMBER.findall(entry["text"]):
        if not matches(tok, [numeric]):
            problems.append(f"{where}: printed {tok!r} for the value {value!r}")
    is_key = key.endswith(_KEY_SUFFIX)
    plain = key[: -len(_KEY_SUFFIX)] if is_key else key
    if plain.startswith(("(", "-", "abs(", "round(", "len(")):
        return problems
    data = _artifact(entry["file"], cache, base)
    if isinstance(data, Exception):
        return problems + [f"{where}: cannot read the artifact: {data}"]
    try:
        if is_key:
            *_, last = _STEP.finditer(plain)
            name = last.group(1) if last.group(1) is not None else json.loads(last.group(3))
            if name not in lookup(data, plain[:last.start()]):
                raise KeyError(plain)
        elif lookup(data, plain) != value:
            problems.append(f"{where}: the artifact holds {lookup(data, plain)!r}, the trace {value!r}")
    except (KeyError, IndexError, TypeError):
        problems.append(f"{where}: no such key in the artifact")
    return problems


def check_page(text: str, trace: dict, base: Path = REPO) -> list[str]:
    """Problems found on the page (empty when every number is covered by a traced span)."""
    problems: list[str] = []
    if trace.get("page_sha256") != hashlib.sha256(text.encode()).hexdigest():
        problems.append("the page differs from the page the trace was written for (edited after rendering?)")
    covered = bytearray(len(text))
    cache: dict = {}
    for entry in trace["numbers"]:
        for start, end in entry["spans"]:
            if text[start:end] != entry["text"]:
                problems.append(f"{entry['file']}: {entry['key']}: the page does not hold {entry['text']!r} "
                                f"at {start}")
                continue
            covered[start:end] = b"\x01" * (end - start)
        problems += check_entry(entry, cache, base)
    body = strip(text)
    lines = text.splitlines()
    for m in NUMBER.finditer(body):
        if not all(covered[m.start():m.end()]):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"line {line}: {m.group()} was not printed from an artifact key: "
                            f"{lines[line - 1].strip()[:160]}")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__, file=sys.stderr)
        return 2
    page = Path(argv[0])
    trace_file = Path(argv[1]) if len(argv) == 2 else page.with_name(page.stem + ".trace.json")
    if not trace_file.exists():
        print(f"{page}: no trace {trace_file} (render the page with reports/render.py)")
        return 1
    problems = check_page(page.read_text(), json.loads(trace_file.read_text()))
    for p in problems:
        print(p)
    print(f"{page}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
