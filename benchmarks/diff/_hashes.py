"""Content hashes of what an artifact was computed from, recorded in its provenance (``inputs``).

A job's record: the SHA-256 of its params (canonical JSON of the rule's ``params:``) and of each
file it read: the stage script, the repository modules it imported (the library, the helpers),
and its declared inputs (sources and upstream artifacts). ``workflow/scripts/restore.py``
compares a committed artifact's record with the checkout and, where they agree, marks the
artifact up to date for Snakemake (file times), so a fresh clone reruns only what changed.

Standard library only: the restore step and the pipeline tests' stub stages import it
without torch.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Directories whose files are not sources: Snakemake's own (its copy of the running script),
# the environment, caches.
_NOT_SOURCES = (".snakemake", ".venv", "__pycache__", ".git")


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def params_sha256(params: dict) -> str:
    """SHA-256 of a rule's params as canonical JSON (sorted keys, tuples as lists)."""
    text = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def relative(path: str | Path, root: Path = REPO) -> str | None:
    """``path`` relative to ``root`` (POSIX form), or None outside it."""
    full = Path(path).resolve()
    if not full.is_relative_to(root):
        return None
    rel = full.relative_to(root)
    if any(part in _NOT_SOURCES for part in rel.parts):
        return None
    return rel.as_posix()


def imported_sources(root: Path = REPO) -> set[str]:
    """The repository's Python files this process imported (stage helpers, the library)."""
    out = set()
    for module in list(sys.modules.values()):
        f = getattr(module, "__file__", None)  # absolute for a file (torch names some modules '_x.py')
        if f and f.endswith(".py") and Path(f).is_absolute() and Path(f).is_file() \
                and (rel := relative(f, root)) is not None:
            out.add(rel)
    return out


def _files(paths, root: Path) -> set[str]:
    """The files among ``paths`` (a directory: the files in it, less Snakemake's timestamp file)."""
    out = set()
    for f in paths:
        p = root / f if not Path(f).is_absolute() else Path(f)
        found = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p] if p.is_file() else []
        out |= {rel for q in found
                if q.name != ".snakemake_timestamp" and (rel := relative(q, root)) is not None}
    return out


def record(inputs, params: dict, script: str | Path | None, outputs=(), root: Path = REPO) -> dict:
    """What an artifact was computed from: ``{"params_sha256", "files": {path: sha256},
    "outputs": {path: sha256}}``.

    :param inputs: the job's input files (Snakemake's ``input``), relative to the working directory.
    :param params: the rule's params by name (``dict(snakemake.params.items())``).
    :param script: the stage script (``__file__`` of Snakemake's copy names the original), or None.
    :param outputs: the job's other outputs written so far (figures, tables): a hand-edited or
        damaged one makes the artifact stale too. The JSON file itself is sealed by ``seal``.
    """
    files = _files(inputs, root)
    if script is not None and (rel := relative(script, root)) is not None:
        files.add(rel)
    files |= imported_sources(root)
    return {"params_sha256": params_sha256(params),
            "files": {rel: file_sha256(root / rel) for rel in sorted(files)},
            "outputs": {rel: file_sha256(root / rel) for rel in sorted(_files(outputs, root))}}


def json_sha256(doc) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
                          .encode()).hexdigest()


def seal(doc: dict, rec: dict) -> None:
    """Record in ``rec`` (the hash record inside ``doc``) the SHA-256 of ``doc`` itself, as
    canonical JSON without that key: an artifact edited after its run no longer matches."""
    rec.pop("self_sha256", None)
    rec["self_sha256"] = json_sha256(doc)


def sealed(doc: dict, rec: dict) -> bool:
    """Whether ``doc`` is as ``seal`` left it."""
    digest = rec.pop("self_sha256", None)
    try:
        return digest is not None and digest == json_sha256(doc)
    finally:
        rec["self_sha256"] = digest


def mismatches(recorded: dict | None, inputs, params: dict, script: str | Path | None,
               root: Path = REPO) -> list[str]:
    """Why an artifact's record does not match the checkout (empty: it does).

    Every file the record names must hash the same, and every input and the script of the job
    as the checkout defines it must be among them (a new library module is a change too).
    """
    if not recorded or "files" not in recorded or "params_sha256" not in recorded:
        return ["no input hashes recorded"]
    why = []
    if recorded["params_sha256"] != params_sha256(params):
        why.append("params changed")
    files = recorded["files"]
    for rel, digest in files.items():
        path = root / rel
        if not path.is_file():
            why.append(f"{rel} is gone")
        elif file_sha256(path) != digest:
            why.append(f"{rel} changed")
    for rel, digest in recorded.get("outputs", {}).items():
        path = root / rel
        if not path.is_file() or file_sha256(path) != digest:
            why.append(f"output {rel} differs from the one its run wrote")
    needed = [f for f in inputs if (root / f).is_file() or not (root / f).exists()]
    if script is not None:
        needed.append(script)
    for f in needed:
        rel = relative(root / f, root)
        if rel is not None and rel not in files:
            why.append(f"{rel} is new")
    return why
