"""Render the "Checks and measurements" page from the stage artifacts, and trace every number.

The page is ``reports/checks_and_measurements.md.j2`` (one file per section in
``reports/sections/``, the common shape a macro there) filled from the JSON artifacts of
one profile (``benchmarks/diff/results/<profile>/*.json``) and nothing else: a missing
value fails the render (``StrictUndefined``), an artifact that does not match
``workflow/schemas/artifacts.schema.yaml`` fails with the artifact, the key and the
reason, an artifact of another profile than the page's fails, and a stage without an
artifact renders as "pending" with the command that produces it.

Tracing. The template sees the artifacts through ``Artifacts``: objects and lists whose
items carry their file and key path (``sensitivity.summary.L1D_rb_sign_agree_frac``).
A number of an artifact is a ``TNum``; it reaches the page only through a number filter
(``num``, ``fix``, ``pct``, ``cell``), which records (key, value, text) and marks where the
text lands. Printing a number without a filter, printing a template literal, or passing a
null, a NaN or a string to a number filter fails the render with the file and the key.
The trace is written next to the page (``<page>.trace.json``) and ``check_numbers.py``
fails on any number on the page that no traced span covers. Figures named by the
artifacts are copied next to the page.

Usage (the pipeline's ``page`` rule calls it as a script)::

    python reports/render.py --results benchmarks/diff/results/ci --page /tmp/page.md
"""

import argparse
import contextlib
import contextvars
import functools
import hashlib
import json
import math
import operator
import os
import re
import shutil
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2
import jsonschema
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TEMPLATE = HERE / "checks_and_measurements.md.j2"
SCHEMA = REPO / "workflow" / "schemas" / "artifacts.schema.yaml"
# The stages the page has a section for, in page order: the pipeline's one stage registry.
STAGES = tuple(yaml.safe_load((REPO / "workflow" / "stages.yaml").read_text())["stages"])

sys.path.insert(0, str(HERE))
from check_numbers import check_page  # noqa: E402


class ArtifactError(ValueError):
    """An artifact is not readable or does not match its schema."""


# ---------------------------------------------------------------------------- tracing
class TraceError(ValueError):
    """A number filter got no number (null, NaN, a string), or a number reached the page
    without a filter."""


class _Node:
    """An artifact value on its way to the page: its file and its key path
    (``sensitivity.summary.L1D_rb_sign_agree_frac``, ``cost.table[3].forward_s``)."""

    __slots__ = ("_src", "_key")

    def __init__(self, src: str, key: str):
        self._src, self._key = src, key

    def _where(self) -> str:
        return f"{self._src}: {self._key}"


class TNum(_Node):
    """A number of an artifact. Arithmetic and comparisons work on its value; arithmetic keeps
    the keys (``(gradcheck.summary.num_checks - gradcheck.summary.num_pass)``). It cannot be
    printed except through a number filter."""

    __slots__ = ("value",)

    def __init__(self, value, src: str, key: str):
        super().__init__(src, key)
        self.value = value

    def __str__(self):
        raise TraceError(f"{self._where()} = {self.value!r} printed without a number filter "
                         "(num, fix, pct, cell)")

    __format__ = lambda self, spec: self.__str__()  # noqa: E731
    def __repr__(self):
        return f"<{self._key} = {self.value!r}>"

    def __bool__(self):
        return bool(self.value)

    def __float__(self):
        return float(self.value)

    def __int__(self):
        return int(self.value)

    def __hash__(self):
        return hash(self.value)

    def _bin(self, other, op, sym, swap=False):
        ov, okey = (other.value, other._key) if isinstance(other, TNum) else (other, repr(other))
        a, b = (ov, self.value) if swap else (self.value, ov)
        ka, kb = (okey, self._key) if swap else (self._key, okey)
        return TNum(op(a, b), self._src, f"({ka} {sym} {kb})")

    def __add__(self, o): return self._bin(o, operator.add, "+")  # noqa: E704
    def __radd__(self, o): return self._bin(o, operator.add, "+", swap=True)  # noqa: E704
    def __sub__(self, o): return self._bin(o, operator.sub, "-")  # noqa: E704
    def __rsub__(self, o): return self._bin(o, operator.sub, "-", swap=True)  # noqa: E704
    def __mul__(self, o): return self._bin(o, operator.mul, "*")  # noqa: E704
    def __rmul__(self, o): return self._bin(o, operator.mul, "*", swap=True)  # noqa: E704
    def __truediv__(self, o): return self._bin(o, operator.truediv, "/")  # noqa: E704
    def __rtruediv__(self, o): return self._bin(o, operator.truediv, "/", swap=True)  # noqa: E704

    def __neg__(self):
        return TNum(-self.value, self._src, f"-{self._key}")

    def __abs__(self):
        return TNum(abs(self.value), self._src, f"abs({self._key})")

    def __round__(self, n=None):
        return TNum(round(self.value, n), self._src, f"round({self._key})")

    def _cmp(self, other, op):
        return op(self.value, other.value if isinstance(other, TNum) else other)

    def __eq__(self, o): return self._cmp(o, operator.eq)  # noqa: E704
    def __ne__(self, o): return self._cmp(o, operator.ne)  # noqa: E704
    def __lt__(self, o): return self._cmp(o, operator.lt)  # noqa: E704
    def __le__(self, o): return self._cmp(o, operator.le)  # noqa: E704
    def __gt__(self, o): return self._cmp(o, operator.gt)  # noqa: E704
    def __ge__(self, o): return self._cmp(o, operator.ge)  # noqa: E704


class TNull(_Node):
    """A JSON null of an artifact (or a key that ``get`` did not find): ``is none`` is true,
    a number filter fails naming the key."""

    __slots__ = ()

    def __bool__(self):
        return False

    def __eq__(self, other):
        return other is None or isinstance(other, TNull)

    def __hash__(self):
        return hash(None)

    def __str__(self):
        raise TraceError(f"{self._where()} is null, printed without a test: say in words that it has "
                         "no value (`{% if x is none %}`)")

    def __repr__(self):
        return f"<{self._key} = null>"


class TKey(str):
    """A key of an artifact's object (a string; ``num`` prints it when it spells a number)."""

    def __new__(cls, text: str, src: str, key: str):
        obj = super().__new__(cls, text)
        obj._src, obj._key = src, key
        return obj


class TStr(str):
    """A string of an artifact: a string everywhere, but a number filter given it fails naming its
    file and key (a string where a number belongs)."""

    def __new__(cls, text: str, src: str, key: str):
        obj = super().__new__(cls, text)
        obj._src, obj._key = src, key
        return obj

    def _where(self) -> str:
        return f"{self._src}: {self._key}"


class TBool(_Node):
    """A boolean of an artifact: its truth value in tests (``if``, ``is true`` / ``is false``,
    ``selectattr``), printed as before; a number filter given it fails naming its file and key."""

    __slots__ = ("value",)

    def __init__(self, value: bool, src: str, key: str):
        super().__init__(src, key)
        self.value = value

    def __bool__(self):
        return self.value

    def __eq__(self, other):
        return self.value == (other.value if isinstance(other, TBool) else other)

    def __hash__(self):
        return hash(self.value)

    def __str__(self):
        return str(self.value)

    def __repr__(self):
        return f"<{self._key} = {self.value!r}>"


def wrap(value, src: str, key: str):
    """The traced view of a JSON value: objects and lists whose items carry their key path."""
    if isinstance(value, bool):
        return TBool(value, src, key)
    if isinstance(value, str):
        return TStr(value, src, key)
    if value is None:
        return TNull(src, key)
    if isinstance(value, (int, float)):
        return TNum(value, src, key)
    if isinstance(value, dict):
        return TDict(value, src, key)
    if isinstance(value, list):
        return TList(value, src, key)
    raise TraceError(f"{src}: {key}: not a JSON value ({type(value).__name__})")


_PLAIN_KEY = re.compile(r"[\w-]+")  # other keys are written ["a key.with dots"] in a key path


class TDict(_Node, Mapping):
    """A JSON object; ``d.k`` and ``d["k"]`` give traced items."""

    __slots__ = ("_data",)

    def __init__(self, data: dict, src: str, key: str):
        super().__init__(src, key)
        self._data = data

    def _child(self, k) -> str:
        if not self._key:
            return str(k)
        return f"{self._key}.{k}" if _PLAIN_KEY.fullmatch(str(k)) else f"{self._key}[{json.dumps(k)}]"

    def __getitem__(self, k):
        return wrap(self._data[k], self._src, self._child(k))

    def __getattr__(self, k):
        if k.startswith("_"):
            raise AttributeError(k)
        try:
            return self[k]
        except KeyError:
            raise AttributeError(f"{self._where()} has no key {k!r}") from None

    def __iter__(self):
        return (TKey(k, self._src, f"{self._child(k)} (the key)") for k in self._data)

    def __len__(self):
        return len(self._data)

    def __contains__(self, k):
        return k in self._data

    def get(self, k, default=None):
        if k in self._data:
            return self[k]
        return TNull(self._src, self._child(k)) if default is None else default

    def __str__(self):
        raise TraceError(f"{self._where()}: a whole object printed")

    def __repr__(self):
        return f"<{self._key}: object>"


class TList(_Node, Sequence):
    """A JSON list; items carry ``key[i]``."""

    __slots__ = ("_data",)

    def __init__(self, data: list, src: str, key: str):
        super().__init__(src, key)
        self._data = data

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._data)))]
        i = int(i)
        return wrap(self._data[i], self._src, f"{self._key}[{i % len(self._data) if self._data else i}]")

    def __len__(self):
        return len(self._data)

    def __contains__(self, x):
        x = x.value if isinstance(x, TNum) else x
        return x in self._data

    def __str__(self):
        raise TraceError(f"{self._where()}: a whole list printed")

    def __repr__(self):
        return f"<{self._key}: list>"


class Artifacts(TDict):
    """The loaded artifacts by stage name; ``a.sensitivity.summary.x`` is traced from
    ``sensitivity.json``."""

    __slots__ = ("_sources",)

    def __init__(self, artifacts: dict[str, dict], sources: dict[str, str]):
        super().__init__(artifacts, "", "")
        self._sources = sources

    def __getitem__(self, k):
        return wrap(self._data[k], self._sources.get(k, f"{k}.json"), k)


# Markers around each traced number in the rendered text (private-use code points): start,
# entry id, separator, text, end. build() strips them and records where each number landed.
_START, _SEP, _END = "\ue000", "\ue001", "\ue002"
_MARKED = re.compile(f"{_START}(\\d+){_SEP}(.*?){_END}", re.S)
_TRACE: contextvars.ContextVar[list | None] = contextvars.ContextVar("trace", default=None)


def _traced(x, text: str) -> str:
    """``text`` (the rendering of ``x``), recorded in the current trace."""
    trace = _TRACE.get()
    if trace is None:  # formatting outside a render (tests, scripts)
        return text
    trace.append({"key": x._key, "file": x._src, "value": x.value if isinstance(x, TNum) else str(x),
                  "text": text})
    return f"{_START}{len(trace) - 1}{_SEP}{text}{_END}"


def _number(x, filt: str):
    """The value of a traced number; anything else fails naming the key where it has one."""
    if isinstance(x, jinja2.Undefined):
        x._fail_with_undefined_error()
    if isinstance(x, TNum):
        v = x.value
        if isinstance(v, float) and not math.isfinite(v):
            raise TraceError(f"{x._where()} is {v!r}, not a finite number ({filt})")
        return v
    if isinstance(x, TKey):
        try:
            return float(x) if any(c in x for c in ".eE") else int(x)
        except ValueError:
            raise TraceError(f"{x._src}: {x._key} {str(x)!r} is not a number ({filt})") from None
    if isinstance(x, TBool):
        raise TraceError(f"{x._where()} is the boolean {x.value!r}, not a number ({filt})")
    if isinstance(x, TStr):
        raise TraceError(f"{x._where()} is the string {str(x)!r}, not a number ({filt})")
    if isinstance(x, TNull):
        raise TraceError(f"{x._where()} is null ({filt}): test it in the template (`is none`) and say "
                         "in words that it has no value")
    if isinstance(x, _Node):
        raise TraceError(f"{x._where()} is not a number ({filt})")
    if isinstance(x, str):
        raise TraceError(f"{filt}: the string {x!r} is not a number")
    raise TraceError(f"{filt}: {x!r} does not come from an artifact (no key); print artifact values only")


def _guard(value):
    """jinja's finalize: nothing untraced or unformatted reaches the page."""
    if isinstance(value, (TNum, TNull, TDict, TList)):
        str(value)  # raises, naming the key
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise TraceError(f"the number {value!r} reached the page without an artifact key; print artifact "
                         "values through num, fix, pct or cell")
    return value


# ---------------------------------------------------------------------------- formatting
def _num(x, sig: int = 3) -> str:
    if isinstance(x, bool):
        raise TypeError(f"num: expected a number, got the boolean {x!r}")
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) < 1e-3 or abs(x) >= 1e6:
        mant, exp = f"{x:.{sig - 1}e}".split("e")
        mant = mant.rstrip("0").rstrip(".") if "." in mant else mant
        return f"{mant}e{int(exp)}"
    s = f"{x:.{sig}g}"
    if "e" in s:  # .g chose e-notation for a value in [1e3, 1e6): print it in full
        s = f"{x:.0f}"
    return s


def num(x, sig: int = 3) -> str:
    """A number with ``sig`` significant digits; integers as integers; tiny/huge in e-notation."""
    return _traced(x, _num(_number(x, "num"), sig))


def fix(x, decimals: int = 3) -> str:
    """A number with a fixed number of decimals (tables)."""
    return _traced(x, f"{float(_number(x, 'fix')):.{decimals}f}")


def pct(x, sig: int = 2) -> str:
    """A value already in percent, with its unit."""
    return _traced(x, _num(_number(x, "pct"), sig)) + " %"


def cell(v) -> str:
    """A table cell: a number, yes/no, a list of numbers, or text (pipes escaped). Null fails:
    test for it and write what it means."""
    if isinstance(v, (bool, TBool)):
        return "yes" if v else "no"
    if isinstance(v, (TNum, TNull)) or v is None or isinstance(v, (int, float)):
        return num(v)
    if isinstance(v, TList):
        return ", ".join(cell(x) for x in v)
    if isinstance(v, TDict):
        raise TraceError(f"{v._where()}: an object in one table cell")
    return str(v).replace("|", "\\|")


def size(x) -> TNum:
    """The number of items of a traced list (or of a selection of its items), traced."""
    if isinstance(x, TList):
        return TNum(len(x), x._src, f"len({x._key})")
    items = list(x)
    keys = [i._key for i in items if isinstance(i, _Node)]
    src = next((i._src for i in items if isinstance(i, _Node)), "")
    return TNum(len(items), src, f"len([{', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}])")


def columns(rows) -> list[str]:
    """Union of the row keys in first-appearance order."""
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    return cols


def dmodel(mode: str) -> str:
    """The relaxed model of a level: ``L1`` -> ``L1D``."""
    return f"{mode}D"


def words(items) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ---------------------------------------------------------------------------- critical path
def _job(path: Path) -> dict | None:
    """The provenance of a job's artifact: a JSON file whose ``provenance`` has a finite ``wall_s``
    (s). None for any other file (a source, a table, a figure, a JSON without a wall time)."""
    if path.suffix != ".json" or not path.is_file():
        return None
    try:
        prov = json.loads(path.read_text()).get("provenance")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    wall_s = prov.get("wall_s") if isinstance(prov, dict) else None
    if isinstance(wall_s, bool) or not isinstance(wall_s, (int, float)) or not math.isfinite(wall_s):
        return None
    return prov


def _files(prov: dict, field: str) -> list[str]:
    """The paths of ``provenance.inputs.<field>`` (``files`` or ``outputs``: path -> sha256, or a list)."""
    inputs = prov.get("inputs")
    value = inputs.get(field) if isinstance(inputs, dict) else None
    return [str(p) for p in value] if isinstance(value, (dict, list)) else []


def _at(path: str | Path, base: Path) -> Path:
    """A recorded path (relative to ``base`` unless absolute), resolved."""
    path = Path(path)
    return (path if path.is_absolute() else base / path).resolve()


def _job_graph(roots: list[Path], base: Path) -> tuple[dict[Path, dict], dict[Path, list[Path]]]:
    """The jobs the ``roots`` come from (artifact -> provenance, the roots included) and each job's
    upstream jobs (artifact -> artifacts, sorted). An input is a job's artifact when it is one (a JSON
    with a wall time) or when an artifact in the roots' folders (searched recursively) lists it among
    its outputs (a table, a figure, a model file written beside it)."""
    producer: dict[Path, Path] = {}  # output file -> artifact of the job that wrote it
    for folder in sorted({r.parent for r in roots}):
        for path in sorted(folder.rglob("*.json")):
            prov = _job(path)
            for out in _files(prov, "outputs") if prov is not None else []:
                producer.setdefault(_at(out, base), path.resolve())
    jobs: dict[Path, dict] = {}
    upstream: dict[Path, list[Path]] = {}
    todo = list(roots)
    while todo:
        node = todo.pop()
        if node in jobs:
            continue
        jobs[node] = prov = _job(node)
        ups = set()
        for name in _files(prov, "files"):
            path = _at(name, base)
            up = producer.get(path, path if _job(path) is not None else None)
            if up is not None:
                ups.add(up)
        upstream[node] = sorted(ups)
        todo.extend(upstream[node])
    return jobs, upstream


def _longest_chain(jobs: dict[Path, dict], upstream: dict[Path, list[Path]]) -> list[Path]:
    """The chain of jobs (first job first) with the largest summed ``wall_s``; ties go to the first
    artifact in path order. Memoised depth-first search; a cycle raises ValueError."""
    best: dict[Path, tuple[float, Path | None]] = {}  # job -> (longest chain ending there, s; previous job)
    stack: list[Path] = []

    def finish_s(node: Path) -> float:
        if node in best:
            return best[node][0]
        if node in stack:
            loop = [*stack[stack.index(node):], node]
            raise ValueError("roots: the jobs' inputs form a cycle (each reads the next): "
                             + " -> ".join(str(p) for p in loop))
        stack.append(node)
        prev, start_s = None, 0.0
        for up in upstream[node]:
            up_s = finish_s(up)
            if up_s > start_s:
                prev, start_s = up, up_s
        stack.pop()
        best[node] = (start_s + jobs[node]["wall_s"], prev)
        return best[node][0]

    node: Path | None = max(sorted(jobs), key=finish_s)
    chain = []
    while node is not None:
        chain.append(node)
        node = best[node][1]
    return chain[::-1]


def _of_stages(stage: str, stages: Sequence[str]) -> bool:
    """Whether a job of ``stage`` belongs to one of ``stages`` (its name, or its name and a part:
    ``fleet_opt`` holds ``fleet_opt_gradient``)."""
    return any(stage == s or stage.startswith(s + "_") for s in stages)


def replay_span_s(work: list[dict], upstream: dict[str, list[str]], cores: int,
                  without: Sequence[str] = (), start_s: float = 0.0) -> float | None:
    """The span of the run's jobs replayed on ``cores`` cores: each job takes its measured ``wall_s``
    plus ``start_s`` (what a job's own clock does not see: the interpreter, the imports) and
    ``min(threads, cores)`` cores, and starts once its upstream jobs have ended and enough cores are
    free; among the jobs ready at a time, the one this run started first goes first (the order stands
    for the priorities Snakemake applied). The jobs of the stages ``without`` are left out, and so
    are the edges to them. A model of the scheduler, not a measurement: the page compares it with the
    span this run measured.

    :param work: ``critical_path``'s ``work`` (``path``, ``stage``, ``wall_s``, ``threads``,
        ``started_unix``); :param upstream: each job's ``path`` -> the paths of its upstream jobs.
    :returns: seconds; None where a job's start is not recorded (no order to replay).
    """
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores: expected a positive int, got {cores!r}")
    jobs = {w["path"]: w for w in work if not _of_stages(w["stage"], without)}
    if not jobs or any(not isinstance(w["started_unix"], (int, float)) for w in jobs.values()):
        return None
    pending = sorted(jobs, key=lambda p: (jobs[p]["started_unix"], p))
    ended: set[str] = set()
    running: list[tuple[float, str]] = []  # (end, path)
    now, free = 0.0, cores
    while pending or running:
        for path in list(pending):
            need = min(jobs[path]["threads"], cores)
            if need <= free and all(u in ended or u not in jobs for u in upstream.get(path, ())):
                pending.remove(path)
                running.append((now + jobs[path]["wall_s"] + start_s, path))
                free -= need
        now = min(end for end, _ in running)
        for end, path in [r for r in running if r[0] == now]:
            running.remove((end, path))
            ended.add(path)
            free += min(jobs[path]["threads"], cores)
    return now


def replay_start_s(work: list[dict], upstream: dict[str, list[str]], cores: int, span_s: float,
                   step_s: float = 0.05, max_s: float = 60.0) -> float | None:
    """The start-up per job (a multiple of ``step_s``, at most ``max_s``) with which ``replay_span_s``
    of every job first reaches the measured ``span_s``: the one constant that fits the replay to the run.
    None where no start-up up to ``max_s`` does (or the replay has no order)."""
    for i in range(int(round(max_s / step_s)) + 1):
        replayed = replay_span_s(work, upstream, cores, start_s=i * step_s)
        if replayed is None:
            return None
        if replayed >= span_s:
            return i * step_s
    return None


def critical_path(roots: Sequence[str | Path], base: str | Path = REPO, cores: int | None = None,
                  without: Sequence[str] = ()) -> dict:
    """The critical path of the job graph the artifacts ``roots`` come from: the chain of jobs, each
    reading an output of the one before, with the largest summed wall time. It is what the pipeline
    takes with every job started as soon as its inputs exist (a lower bound on any schedule).

    :param roots: the page's stage artifacts (JSON files, each with ``provenance.wall_s``).
    :param base: the folder the paths in ``provenance.inputs`` are relative to (the repository).
    :returns: ``{"seconds", "minutes"}`` (floats: the chain's wall time), ``"jobs"`` (the chain, first
        job first: ``{"stage", "artifact", "path", "wall_s"}``; ``artifact`` relative to the roots'
        common folder, ``path`` relative to ``base`` where inside it, ``wall_s`` in s) and
        ``"n_jobs_total"`` (the jobs in the graph, the roots included); ``"work"`` (every job:
        ``{"stage", "path", "wall_s", "threads", "started_unix"}``, the torch threads and the start its
        provenance records), ``"work_s"``, their wall times times their threads summed (core-seconds),
        and ``"span_s"``, the first job's start to the last one's end (None where a job's start is not
        recorded); with ``cores``, ``"replay_s"``, ``replay_span_s`` of every job on that many cores;
        where the span is known, ``"replay_start_s"`` (``replay_start_s``: the start-up per job that
        makes the replay the span) and ``"replay_without_s"``, the replay with that start-up of the
        jobs not of the stages ``without`` (``"without"``; None without stages).
    :raises ValueError: no roots, a root that is not a job's artifact, or a cycle.
    """
    if not roots:
        raise ValueError("roots: expected at least one artifact, got none")
    base = Path(base).resolve()
    nodes = [Path(r).resolve() for r in roots]
    for node in nodes:
        if _job(node) is None:
            raise ValueError(f"roots: {node} is not a job's artifact (a JSON file whose provenance has a "
                             "finite wall_s)")
    jobs, upstream = _job_graph(nodes, base)
    common = Path(os.path.commonpath([n.parent for n in nodes]))

    def rel(path: Path, folder: Path) -> str:
        return str(path.relative_to(folder)) if path.is_relative_to(folder) else str(path)

    chain = [{"stage": str(jobs[n].get("stage", n.stem)), "artifact": rel(n, common), "path": rel(n, base),
              "wall_s": jobs[n]["wall_s"]} for n in _longest_chain(jobs, upstream)]
    seconds = sum(job["wall_s"] for job in chain)
    # every job's work: its wall time times the torch threads it reserved
    work = [{"stage": str(prov.get("stage", n.stem)), "path": rel(n, base), "wall_s": prov["wall_s"],
             "threads": int(prov.get("torch_threads") or 1), "started_unix": prov.get("started_unix")}
            for n, prov in sorted(jobs.items())]
    timed = all(isinstance(w["started_unix"], (int, float)) for w in work)
    span_s = (max(w["started_unix"] + w["wall_s"] for w in work) - min(w["started_unix"] for w in work)
              if timed else None)
    out = {"seconds": seconds, "minutes": seconds / 60, "jobs": chain, "n_jobs_total": len(jobs),
           "work": work, "work_s": sum(w["wall_s"] * w["threads"] for w in work), "span_s": span_s}
    if cores is not None:
        ups = {rel(n, base): [rel(u, base) for u in us] for n, us in upstream.items()}
        start_s = replay_start_s(work, ups, cores, span_s) if span_s is not None else None
        out |= {"cores": cores, "without": list(without), "replay_s": replay_span_s(work, ups, cores),
                "replay_start_s": start_s,
                "replay_without_s": (replay_span_s(work, ups, cores, without, start_s)
                                     if without and start_s is not None else None)}
    return out


def traced_critical_path(path: dict, base: str | Path = REPO) -> dict:
    """``critical_path``'s result for the template: each job's ``wall_s`` a ``TNum`` traced to
    ``provenance.wall_s`` of its artifact; ``seconds`` their sum and ``minutes`` that over 60, keeping
    the keys; ``n_jobs_total`` a traced count; ``work_s`` every job's wall time times its threads,
    summed (``critical_path``'s). ``base``: as given to ``critical_path``."""
    if not path["jobs"]:
        raise ValueError("path: a critical path without jobs")
    jobs = []
    for job in path["jobs"]:
        stage = job["stage"] if _PLAIN_KEY.fullmatch(job["stage"]) else "job"
        wall_s = TNum(job["wall_s"], _shown(Path(base) / job["path"]), f"{stage}.provenance.wall_s")
        jobs.append({**job, "wall_s": wall_s})
    seconds = functools.reduce(operator.add, [j["wall_s"] for j in jobs])
    total = TNum(path["n_jobs_total"], jobs[-1]["wall_s"]._src, "len(jobs the page's artifacts come from)")
    out = {"jobs": jobs, "seconds": seconds, "minutes": seconds / 60, "n_jobs_total": total}
    if path.get("work"):
        # one key for the sum, over every job of the graph (a key per term would name some 70)
        out["work_s"] = TNum(path["work_s"], _shown(Path(base) / path["work"][0]["path"]),
                             "(sum over the jobs of provenance.wall_s * provenance.torch_threads)")
    replayed = "(a replay of the jobs' provenance.wall_s on provenance.cpu_count cores, replay_span_s)"
    for key in ("replay_s", "replay_start_s", "replay_without_s"):
        if path.get(key) is not None:
            out[key] = TNum(path[key], _shown(Path(base) / path["work"][0]["path"]), replayed)
    if path.get("without"):
        out["without"] = list(path["without"])
    if path.get("span_s") is not None:
        out["span_s"] = TNum(path["span_s"], _shown(Path(base) / path["work"][0]["path"]),
                             "(max over the jobs of provenance.started_unix + provenance.wall_s, "
                             "less min of provenance.started_unix)")
    return out


# ---------------------------------------------------------------------------- artifacts
def _schema() -> dict:
    return yaml.safe_load(SCHEMA.read_text())


def load_artifact(name: str, path: str | Path, schema: dict | None = None) -> dict:
    """Read one artifact and validate it against ``$defs/<name>`` (or ``$defs/generic``)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{path}: cannot read artifact {name!r}: {err}") from err
    schema = schema if schema is not None else _schema()
    key = name if name in schema["$defs"] else "generic"
    validator = jsonschema.Draft202012Validator({"$ref": f"#/$defs/{key}", "$defs": schema["$defs"]})
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  at {'/'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}"
                 for e in errors[:10]]
        raise ArtifactError(
            f"{path}: artifact {name!r} does not match the schema $defs/{key} in "
            f"{SCHEMA.relative_to(REPO)} ({len(errors)} error(s)):\n" + "\n".join(lines))
    return data


def environment(folder: Path = TEMPLATE.parent) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_guard,
    )
    env.filters.update(num=num, fix=fix, pct=pct, cell=cell, size=size, columns=columns, words=words,
                       dmodel=dmodel)
    env.tests["none"] = lambda v: v is None or isinstance(v, TNull)
    # An artifact's booleans are TBool (they carry their key): jinja's own tests ask ``is True``.
    env.tests["true"] = lambda v: v is True or (isinstance(v, TBool) and v.value is True)
    env.tests["false"] = lambda v: v is False or (isinstance(v, TBool) and v.value is False)
    env.tests["boolean"] = lambda v: isinstance(v, (bool, TBool))
    env.tests["number"] = lambda v: isinstance(v, TNum) or (isinstance(v, (int, float))
                                                            and not isinstance(v, bool))
    return env


def render_traced(artifacts: dict[str, dict], paths: dict[str, str], pending: dict[str, str], profile: str,
                  figure_links: dict[str, str] | None = None, template: str | Path = TEMPLATE,
                  sources: dict[str, str] | None = None,
                  critical: dict | None = None) -> tuple[str, list[dict]]:
    """The page and its trace: one entry per number the filters printed (key, file, value,
    text, and the character spans where it landed on the page).

    :param artifacts: stage name -> artifact data (only the stages that have one).
    :param paths: stage name -> artifact path as shown on the page (every stage).
    :param pending: stage name -> command that produces the artifact (every stage).
    :param figure_links: stage name -> link of its figure relative to the page.
    :param sources: stage name -> artifact file named in the trace and in errors (default: ``paths``).
    :param critical: the critical path of the job graph (``traced_critical_path``), the template's
        ``critical_path``; None where not known (the template leaves it out).
    """
    unknown = sorted(set(artifacts) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; expected some of: {', '.join(STAGES)}")
    template = Path(template)
    tpl = environment(template.parent).get_template(template.name)
    trace: list[dict] = []
    token = _TRACE.set(trace)
    try:
        marked = tpl.render(a=Artifacts(artifacts, sources or paths), paths=paths, pending=pending,
                            profile=profile, figures=figure_links or {}, stages=STAGES,
                            critical_path=critical)
    finally:
        _TRACE.reset(token)
    for entry in trace:
        entry["spans"] = []
    out, pos = [], 0
    for m in _MARKED.finditer(marked):
        out.append(marked[pos:m.start()])
        at = sum(map(len, out))
        trace[int(m.group(1))]["spans"].append([at, at + len(m.group(2))])
        out.append(m.group(2))
        pos = m.end()
    out.append(marked[pos:])
    text = "".join(out)
    if any(c in text for c in (_START, _SEP, _END)):
        raise TraceError("a number filter's output was cut or nested in the template (stray trace marker)")
    return text, trace


def trace_document(text: str, trace: list[dict], profile: str) -> dict:
    """What ``check_numbers.py`` reads next to the page: the page's hash and every traced number."""
    return {"profile": profile, "page_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "numbers": [e for e in trace if e["spans"]]}


def _shown(path: str) -> str:
    """An artifact's file as the trace names it: relative to the repository when inside it."""
    full = Path(path).resolve()
    return str(full.relative_to(REPO)) if full.is_relative_to(REPO) else str(full)


def trace_path(page: str | Path) -> Path:
    """``page.md`` -> ``page.trace.json``."""
    page = Path(page)
    return page.with_name(page.stem + ".trace.json")


def load_all(artifact_paths: dict[str, str], profile: str) -> tuple[dict, dict]:
    """The artifacts that exist, validated, each of ``profile``; and their files."""
    schema = _schema()
    artifacts, sources = {}, {}
    for name, path in artifact_paths.items():
        if Path(path).exists():
            data = load_artifact(name, path, schema)
            theirs = data["provenance"]["profile"]
            if theirs != profile:
                raise ArtifactError(f"{path}: artifact {name!r} is of profile {theirs!r}, the page is of "
                                    f"profile {profile!r} (rerun its stage for this profile)")
            artifacts[name], sources[name] = data, Path(path)
    return artifacts, sources


def build(artifact_paths: dict[str, str], pending: dict[str, str], profile: str, page: str | Path,
          figures_dir: str | Path, trace: str | Path | None = None) -> str:
    """Load and validate the artifacts that exist, find the critical path of the jobs they come
    from (``critical_path``, paths relative to the repository), render, copy figures, check the
    numbers against the trace, write the page and its trace (default: ``trace_path(page)``)."""
    page, figures_dir = Path(page), Path(figures_dir)
    artifacts, sources = load_all(artifact_paths, profile)
    figure_links = {}
    figures_dir.mkdir(parents=True, exist_ok=True)
    for name, data in artifacts.items():
        if "figure" in data:
            src = sources[name].parent / data["figure"]
            if not src.exists():
                raise ArtifactError(f"{sources[name]}: figure {data['figure']!r} not found at {src}")
            shutil.copyfile(src, figures_dir / src.name)
            figure_links[name] = str((figures_dir / src.name).relative_to(page.parent))
    paths = {k: str(v) for k, v in artifact_paths.items()}
    cost = artifacts.get("cost", {}).get("provenance", {})
    cores = cost.get("cpu_count") if isinstance(cost.get("cpu_count"), int) else None
    without = (cost.get("config", {}).get("run_target_without") or {}).get("stages", [])
    critical = (traced_critical_path(critical_path(list(sources.values()), cores=cores, without=without))
                if sources else None)
    text, entries = render_traced(artifacts, paths, pending, profile, figure_links,
                                  sources={k: _shown(v) for k, v in paths.items()}, critical=critical)
    doc = trace_document(text, entries, profile)
    problems = check_page(text, doc)
    if problems:
        raise ValueError(f"{page}: numbers that no artifact key produced:\n" + "\n".join(problems))
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    trace_file = Path(trace) if trace is not None else trace_path(page)
    trace_file.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    return text


def _as_list(x) -> list:
    """A Snakemake named input or output (one path, several, or None) as a list."""
    return [] if x is None else [x] if isinstance(x, str) else list(x)


def _record_inputs(smk) -> None:
    """The hashes of what the page was rendered from, in its trace (``inputs``), as every artifact
    records them in its provenance: ``workflow/scripts/restore.py`` marks the page up to date
    on a fresh clone where they match (benchmarks/diff/_hashes.py)."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    from _hashes import record, seal

    trace = Path(smk.output.trace)
    doc = json.loads(trace.read_text())
    rec = doc["inputs"] = record(list(smk.input), dict(smk.params.items()), Path(__file__),
                                 outputs=[smk.output.page, *_as_list(smk.output.get("figures"))])
    seal(doc, rec)
    trace.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")


def _main_snakemake(smk) -> None:
    """The page rule: output and errors go to the rule's log, which Snakemake names when the job
    fails; an error (the file and the reason) is written there before the log is closed, and raised
    again to the terminal."""
    log_file = Path(smk.log[0])
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w", buffering=1) as log:
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                paths = {name: str(path) for name, path in smk.input.items() if name in STAGES}
                missing = sorted(set(STAGES) - set(paths))
                if missing:
                    raise ValueError(f"the report rule lacks the artifact input(s) {missing}")
                # The figures' copies are outputs of their own (a deleted one is rebuilt): their folder.
                figures = _as_list(smk.output.get("figures"))
                figures_dir = Path(figures[0]).parent if figures else Path(smk.output.page).parent / "figures"
                build(paths, dict(smk.params.pending), smk.params.profile, smk.output.page, figures_dir,
                      smk.output.trace)
                _record_inputs(smk)
                print(f"wrote {smk.output.page} and {smk.output.trace}")
        except Exception as err:
            traceback.print_exc(file=log)
            if isinstance(err, ArtifactError):  # Snakemake sees the file, not that it is damaged
                hint = ("page: delete the artifact and run the `report` target again, which reruns its "
                        "stage (or force the stage's rule with --forcerun)")
                print(hint, file=log)
                print(hint, file=sys.stderr)
            raise


def _main_cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True, help="benchmarks/diff/results/<profile>")
    ap.add_argument("--page", required=True, help="where to write the page")
    ap.add_argument("--profile", default=None, help="profile name (default: the results folder's name)")
    a = ap.parse_args()
    profile = a.profile or Path(a.results).name
    option = "" if profile == "full" else f" --configfile config/{profile}.yaml"
    paths = {name: f"{a.results}/{name}.json" for name in STAGES}
    pending = {name: f"snakemake --cores 32 {p}{option}" for name, p in paths.items()}
    build(paths, pending, profile, a.page, Path(a.page).parent / "figures")
    print(f"wrote {a.page} and {trace_path(a.page)}")


if __name__ == "__main__":
    if "snakemake" in globals():
        _main_snakemake(globals()["snakemake"])
    else:
        _main_cli()
