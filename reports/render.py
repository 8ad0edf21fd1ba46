"""Render the "Checks and measurements" page from the stage artifacts.

The page is ``reports/checks_and_measurements.md.j2`` filled from the JSON artifacts of
one profile (``benchmarks/diff/results/<profile>/*.json``) and nothing else: a missing
value fails the render (``StrictUndefined``), an artifact that does not match
``workflow/schemas/artifacts.schema.yaml`` fails with the artifact, the key and the
reason, and a stage without an artifact renders as "pending" with the command that
produces it. After rendering, every number on the page is checked against the artifacts
(``check_numbers.py``). Figures named by the artifacts are copied next to the page.

Usage (the pipeline's ``report`` rule calls it as a script)::

    python reports/render.py --results benchmarks/diff/results/ci --page /tmp/page.md
"""

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import jinja2
import jsonschema
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TEMPLATE = HERE / "checks_and_measurements.md.j2"
SCHEMA = REPO / "workflow" / "schemas" / "artifacts.schema.yaml"
# The stages the page has a section for, in page order.
STAGES = ("equivalence", "convergence", "convergence_curves", "gradcheck", "fd_check", "sensitivity",
          "opt_rates", "placement", "nn_proxy", "cost")

sys.path.insert(0, str(HERE))
from check_numbers import check_page  # noqa: E402


class ArtifactError(ValueError):
    """An artifact is not readable or does not match its schema."""


# ---------------------------------------------------------------------------- formatting
def num(x, sig: int = 3) -> str:
    """A number with ``sig`` significant digits; integers as integers; tiny/huge in e-notation."""
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        raise TypeError(f"num: expected a number, got the boolean {x!r}")
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if not math.isfinite(x):
        return "n/a"
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


def fix(x, decimals: int = 3) -> str:
    """A number with a fixed number of decimals (tables)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{float(x):.{decimals}f}"


def pct(x, sig: int = 2) -> str:
    """A value already in percent, with its unit."""
    return f"{num(x, sig)} %"


def cell(v) -> str:
    """A table cell of any JSON value."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None:
        return "n/a"
    if isinstance(v, (int, float)):
        return num(v)
    if isinstance(v, list):
        return ", ".join(cell(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}: {cell(x)}" for k, x in v.items())
    return str(v).replace("|", "\\|")


def columns(rows: list[dict]) -> list[str]:
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
    )
    env.filters.update(num=num, fix=fix, pct=pct, cell=cell, columns=columns, words=words, dmodel=dmodel)
    return env


def render(artifacts: dict[str, dict], paths: dict[str, str], pending: dict[str, str], profile: str,
           figure_links: dict[str, str] | None = None, template: str | Path = TEMPLATE) -> str:
    """The page as a string.

    :param artifacts: stage name -> artifact data (only the stages that have one).
    :param paths: stage name -> artifact path as shown on the page (every stage).
    :param pending: stage name -> command that produces the artifact (every stage).
    :param figure_links: stage name -> link of its figure relative to the page.
    """
    unknown = sorted(set(artifacts) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; expected some of: {', '.join(STAGES)}")
    template = Path(template)
    tpl = environment(template.parent).get_template(template.name)
    return tpl.render(a=artifacts, paths=paths, pending=pending, profile=profile,
                      figures=figure_links or {}, stages=STAGES)


def build(artifact_paths: dict[str, str], pending: dict[str, str], profile: str, page: str | Path,
          figures_dir: str | Path) -> str:
    """Load and validate the artifacts that exist, render, copy figures, check numbers, write."""
    page, figures_dir = Path(page), Path(figures_dir)
    schema = _schema()
    artifacts, sources = {}, {}
    for name, path in artifact_paths.items():
        if Path(path).exists():
            artifacts[name] = load_artifact(name, path, schema)
            sources[name] = Path(path)
    figure_links = {}
    figures_dir.mkdir(parents=True, exist_ok=True)
    for name, data in artifacts.items():
        if "figure" in data:
            src = sources[name].parent / data["figure"]
            if not src.exists():
                raise ArtifactError(f"{sources[name]}: figure {data['figure']!r} not found at {src}")
            shutil.copyfile(src, figures_dir / src.name)
            figure_links[name] = str((figures_dir / src.name).relative_to(page.parent))
    text = render(artifacts, {k: str(v) for k, v in artifact_paths.items()}, pending, profile, figure_links)
    problems = check_page(text, base=REPO)
    if problems:
        raise ValueError(f"{page}: numbers not found in the artifacts:\n" + "\n".join(problems))
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    return text


def _main_snakemake(smk) -> None:
    with open(smk.log[0], "w") as log:
        sys.stderr = sys.stdout = log
        paths = {name: str(path) for name, path in smk.input.items() if name in STAGES}
        all_paths = dict(smk.params.paths) | paths
        build(all_paths, dict(smk.params.pending), smk.params.profile, smk.output.page, smk.output.figures)
        print(f"wrote {smk.output.page}")


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
    print(f"wrote {a.page}")


if __name__ == "__main__":
    if "snakemake" in globals():
        _main_snakemake(globals()["snakemake"])
    else:
        _main_cli()
