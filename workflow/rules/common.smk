# Shared definitions of the pipeline: the config's coercion and validation, paths, inputs every
# stage has, the report's inputs.
import glob
import re

import yaml
from snakemake.utils import validate

_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _coerce(value):
    """A command-line override's strings as YAML values: ``--config 'convergence={default_tau: 0.1}'``
    reaches the config with ``'0.1'`` (Snakemake passes nested values as strings)."""
    if isinstance(value, dict):
        return {k: _coerce(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_coerce(v) for v in value]
    if isinstance(value, str):
        if _NUMBER.fullmatch(value.strip()):
            return yaml.safe_load(value) if "." in value or not re.search("[eE]", value) else float(value)
        if value.strip().startswith(("{", "[")) or value.strip() in ("true", "false", "null"):
            return yaml.safe_load(value)
    return value


for _key in list(config):
    if _key != "profile":
        config[_key] = _coerce(config[_key])

validate(config, "../schemas/config.schema.yaml")

# CellConfig's default of num_slots (isaac_net/core/config.py), for cells that do not set it.
_DEFAULT_NUM_SLOTS = 40
_SLASH = chr(47)  # config key paths are written a/b/c (a literal slash reads as a path to the linter)


def _cross_field_errors(node, where=()):
    """Errors that the schema cannot see: they combine two keys. Every section is walked."""
    errors = []
    if isinstance(node, dict):
        here = _SLASH.join(where) or "(top level)"
        for w, t in (("warmup", "T"), ("warmup_eval", "T_eval")):
            if isinstance(node.get(w), int) and isinstance(node.get(t), int) and node[w] >= node[t]:
                errors.append(
                    f"{here}/{w} = {node[w]} must be less than {here}/{t} = {node[t]} "
                    "(no step would be counted)"
                )
        if where and where[-1] == "cell":
            k = node.get("num_slots", _DEFAULT_NUM_SLOTS)
            for name in ("qa_sr_slots", "l1_sr_slots"):
                v = node.get(name)
                if isinstance(v, int) and isinstance(k, int) and v > k:
                    errors.append(f"{here}/{name} = {v} exceeds {here}/num_slots = {k}")
        for key, value in node.items():
            errors += _cross_field_errors(value, (*where, str(key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            errors += _cross_field_errors(value, (*where, str(i)))
    return errors


_errors = _cross_field_errors(config)
_conv = config["convergence"]
if _conv["default_tau"] not in _conv["table"]["taus"]:
    _errors.append(
        f"convergence/default_tau = {_conv['default_tau']} is not one of convergence/table/taus = "
        f"{_conv['table']['taus']}"
    )
if _errors:
    raise ValueError("config: " + "; ".join(_errors))

PROFILE = config["profile"]
RESULTS = f"benchmarks/diff/results/{PROFILE}"
# The full profile's page is the project's page; another profile's page stays with its results.
PAGE_DIR = "reports" if PROFILE == "full" else RESULTS
PAGE = f"{PAGE_DIR}/checks_and_measurements.md"
FIGURES_DIR = f"{PAGE_DIR}/figures"
PROFILE_OPTION = "" if PROFILE == "full" else f" --configfile config/{PROFILE}.yaml"

# A changed model reruns every stage: the library's sources are an input of each.
LIBRARY = sorted(glob.glob("isaac_net/**/*.py", recursive=True))
HELPERS = [f"benchmarks/diff/{m}.py" for m in ("_common", "_plots", "_hashes", "_tables")]

# Artifacts the report renders, by name, from the one stage registry (workflow/stages.yaml, which
# reports/render.py reads too). Every artifact is an input of the page and of the `report`
# target, so a missing one is rebuilt (see the Snakefile).
STAGES = yaml.safe_load(open(workflow.source_path("../stages.yaml")))["stages"]
ARTIFACTS = {name: f"{RESULTS}/{name}.json" for name in STAGES}
TRACE = f"{PAGE_DIR}/checks_and_measurements.trace.json"
# Each artifact's tidy tables as CSV beside it (benchmarks/diff/_tables.py): outputs of its rule
# (``csv``, ``csv_<table>``) and inputs of the report target, so a missing one is rebuilt.
TABLE_EXTRA = {"sensitivity": ["agreement"]}
TABLES = {
    name: {
        "csv": f"{RESULTS}/{name}.csv",
        **{f"csv_{t}": f"{RESULTS}/{name}_{t}.csv" for t in TABLE_EXTRA.get(name, [])},
    }
    for name in STAGES
}
ALL_TABLES = [path for table in TABLES.values() for path in table.values()]
PENDING_COMMANDS = {name: f"snakemake --cores 32 {path}{PROFILE_OPTION}" for name, path in ARTIFACTS.items()}


# Which ready job a machine of few cores starts first (Snakemake's `priority:`, higher first).
# The longest one-core chain first: the calibration and the neural proxy, which opt_rates (the
# longest single job) reads, then the other studies; the cost stage, which reserves every core it
# sweeps, last: on 2 cores it then runs alone (its timings undisturbed) instead of holding back
# the studies while the one-core jobs wait for a second free core.
PRIORITY = {
    "calibrate": 100,
    "nn_proxy": 100,
    "opt_rates": 90,
    "placement": 80,
    "sensitivity": 70,
    "checks": 10,
    "cost": 0,
}


def stage_params(name, drop=()):
    """The params of a stage's rule, passed to its script. The stage's config less the parts named in
    ``drop`` (another rule's), so that a changed value reruns this stage and only this one."""
    stage = {k: v for k, v in config[name].items() if k not in drop}
    return {"stage": stage, "profile": PROFILE, "device": config["device"]}


def log_path(rule_name):
    return f"{RESULTS}/logs/{rule_name}.log"


def bench_path(rule_name):
    return f"{RESULTS}/bench/{rule_name}.tsv"


# The calibration's fleet sizes (robots per cell), in the config's order; its load sweep at the first.
_CALIBRATION_R = config["calibrate"]["R"]
CALIBRATION_R = [int(r) for r in (_CALIBRATION_R if isinstance(_CALIBRATION_R, list) else [_CALIBRATION_R])]


def calibration_targets(point_set):
    """The calibration's L2-legacy target files of one point set, one per fleet size in order (the
    sweep: the first size only)."""
    sizes = CALIBRATION_R[:1] if point_set == "sweep" else CALIBRATION_R
    return [f"{RESULTS}/calibrate/targets_{point_set}_R{r}.json" for r in sizes]
