"""The pipeline's stage registry, ``workflow/stages.yaml``, with its defaults filled in.

The one place that says what each stage of the page runs and writes: workflow/rules/common.smk
generates the stages' rules and the report's inputs from it, reports/render.py takes the page's
sections (their order) from it, and the tests their stage names and files. Standard library and
PyYAML only.
"""

from __future__ import annotations

from pathlib import Path

import yaml

REGISTRY = Path(__file__).resolve().parents[1] / "stages.yaml"
# The fields of a stage's entry and their defaults (the stage's name where None; see stages.yaml).
FIELDS = {"rule": None, "script": None, "config": None, "drop": [], "part": None, "figure": False,
          "tables": [], "outputs": {}, "inputs": {}, "threads": None, "priority": "checks"}


def load(path: str | Path = REGISTRY) -> dict[str, dict]:
    """Stage name -> its entry with every field, in page order; an unknown field is refused."""
    entries = yaml.safe_load(Path(path).read_text())["stages"]
    stages = {}
    for name, entry in entries.items():
        entry = entry or {}
        unknown = sorted(set(entry) - set(FIELDS))
        if unknown:
            raise ValueError(f"{path}: stage {name!r} has unknown field(s) {unknown}; "
                             f"known: {', '.join(FIELDS)}")
        stage = {k: entry.get(k, v) for k, v in FIELDS.items()}
        stage["rule"] = stage["rule"] or name
        stage["script"] = stage["script"] or f"{name}.py"
        stage["config"] = stage["config"] or name
        stages[name] = stage
    return stages


def names(path: str | Path = REGISTRY) -> tuple[str, ...]:
    """The stages, in page order."""
    return tuple(load(path))


def outputs(name: str, stage: dict, results: str) -> dict[str, str]:
    """The files a stage's rule writes, by output name, in ``results`` (a profile's results folder):
    its tidy tables (``csv``, ``csv_<table>``), its artifact (``json``), its figure (``figure``)
    and its other files."""
    files = {"csv": f"{results}/{name}.csv"}
    files |= {f"csv_{t}": f"{results}/{name}_{t}.csv" for t in stage["tables"]}
    files["json"] = f"{results}/{name}.json"
    if stage["figure"]:
        files["figure"] = f"{results}/{name}.png"
    files |= {k: v.format(results=results) for k, v in stage["outputs"].items()}
    return files
