# Shared definitions of the pipeline: the config's coercion and validation, paths, inputs every
# stage has, the report's inputs.
import glob
import importlib.util
import math
import re
import string

import jsonschema
import yaml

_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_LEADING_ZERO = re.compile(r"[-+]?0\d")
_SLASH = chr(47)  # config key paths are written a/b/c (a literal slash reads as a path to the linter)


def _coerce(value, where, errors):
    """A command-line override's strings as the numbers, booleans and nulls they spell:
    ``--config 'convergence={default_tau: 0.1}'`` reaches the config with ``'0.1'`` (Snakemake
    passes nested values as strings). A number is taken as typed: digits alone are an integer
    (``12``), a point or an exponent makes a float (``0.1``, ``1e-4``, ``1.5e3``; the schema
    refuses a float where it wants an integer). Refused, naming the key: a leading zero (``012``,
    which YAML 1.1 reads as octal 10) and a number a float cannot hold (``1e400``)."""
    here = _SLASH.join(where)
    if isinstance(value, dict):
        return {k: _coerce(v, (*where, str(k)), errors) for k, v in value.items()}
    if isinstance(value, list):
        return [_coerce(v, (*where, str(i)), errors) for i, v in enumerate(value)]
    if isinstance(value, str):
        text = value.strip()
        if _NUMBER.fullmatch(text):
            if _LEADING_ZERO.match(text):
                errors.append(
                    f"{here} = {text!r}: a number with a leading zero (YAML reads 012 as the "
                    "octal 10); write it without the zero"
                )
                return value
            if not re.search("[.eE]", text):
                return int(text)
            number = float(text)
            if not math.isfinite(number):
                errors.append(f"{here} = {text!r} is not a finite number (too large for a float)")
                return value
            return number
        if text.startswith(("{", "[")):  # a flow mapping or list left as text: its items coerced alike
            return _coerce(yaml.load(text, Loader=yaml.BaseLoader), where, errors)
        if text in ("true", "false", "null"):
            return yaml.safe_load(text)
    return value


def _is_number(checker, x):
    """The schema's ``number``: a finite one (JSON has no infinity or NaN; an override or a
    YAML ``.inf`` would bring one)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_integer(checker, x):
    """The schema's ``integer``: an integer as typed (jsonschema also takes 4.0, which would reach
    a stage as a float)."""
    return isinstance(x, int) and not isinstance(x, bool)


# The config schema as the pipeline reads it: JSON Schema 2020-12 with a finite `number` and an
# integer-as-typed `integer`.
_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"number": _is_number, "integer": _is_integer}
    ),
)


def _wants_integer(error):
    """Whether ``error`` (or one of its alternatives under oneOf/anyOf) is an ``integer`` type error."""
    wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
    if error.validator == "type" and "integer" in wanted:
        return True
    return any(_wants_integer(e) for e in error.context or ())


def _schema_errors(cfg, schema):
    """Every place ``cfg`` breaks ``schema``, naming the key: a non-finite number and a float
    where an integer belongs get messages of their own."""
    errors = []
    for e in sorted(_Validator(schema).iter_errors(cfg), key=lambda e: [str(p) for p in e.absolute_path]):
        here = _SLASH.join(map(str, e.absolute_path)) or "(top level)"
        v = e.instance
        if isinstance(v, float) and not math.isfinite(v):
            errors.append(f"{here} = {v} is not a finite number")
        elif isinstance(v, float) and v.is_integer() and _wants_integer(e):
            errors.append(
                f"{here} = {v} is a float (a point or an exponent makes one), and this key takes "
                f"an integer: write {int(v)}"
            )
        else:
            errors.append(f"{here}: {e.message}")
    return errors


_errors = []
for _key in list(config):
    if _key != "profile":
        config[_key] = _coerce(config[_key], (_key,), _errors)
_schema = yaml.safe_load(open(workflow.source_path("../schemas/config.schema.yaml")))
_errors = _errors or _schema_errors(config, _schema)  # a refused override is reported once
if _errors:
    raise ValueError("config: " + "; ".join(_errors))

# CellConfig's default of num_slots (isaac_net/core/config.py), for cells that do not set it.
_DEFAULT_NUM_SLOTS = 40


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
# The page's template includes one file per section (their macros in sections/_macros.md.j2).
PAGE_SECTIONS = sorted(glob.glob("reports/sections/*.md.j2"))
PROFILE_OPTION = "" if PROFILE == "full" else f" --configfile config/{PROFILE}.yaml"

# A changed model reruns every stage: the library's sources are an input of each.
LIBRARY = sorted(glob.glob("isaac_net/**/*.py", recursive=True))
HELPERS = [f"benchmarks/diff/{m}.py" for m in ("_common", "_plots", "_hashes", "_tables")]

# The one stage registry (workflow/stages.yaml, with its defaults: workflow/scripts/stage_registry.py,
# which reports/render.py and the tests read too): stage name -> entry, in page order. Each stage's
# rule is generated from its entry (workflow/rules/stages.smk).
_spec = importlib.util.spec_from_file_location(
    "stage_registry", workflow.source_path("../scripts/stage_registry.py")
)
stage_registry = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stage_registry)
STAGES = stage_registry.load(workflow.source_path("../stages.yaml"))
# Each stage's files by output name: its tidy tables as CSV beside its artifact
# (benchmarks/diff/_tables.py; ``csv``, ``csv_<table>``), the artifact (``json``), its figure and
# other files.
STAGE_FILES = {name: stage_registry.outputs(name, stage, RESULTS) for name, stage in STAGES.items()}
# Artifacts the report renders, by name. Every artifact is an input of the page and of the
# `report` target, so a missing one is rebuilt (see the Snakefile).
ARTIFACTS = {name: files["json"] for name, files in STAGE_FILES.items()}
TRACE = f"{PAGE_DIR}/checks_and_measurements.trace.json"
TABLES = {
    name: {k: v for k, v in files.items() if k == "csv" or k.startswith("csv_")}
    for name, files in STAGE_FILES.items()
}
ALL_TABLES = [path for table in TABLES.values() for path in table.values()]
PENDING_COMMANDS = {name: f"snakemake --cores 32 {path}{PROFILE_OPTION}" for name, path in ARTIFACTS.items()}
# Every file that the stages' rules write, for the `report` target (Snakemake reruns a job for a
# missing output only when something asks for that output, so a deleted figure that no target
# named would stay deleted).
STAGE_OUTPUTS = sorted(path for files in STAGE_FILES.values() for path in files.values())
# Each stage's figure, which the page copies next to itself, and the page's copies (same names, in
# the page's figures folder).
STAGE_FIGURES = sorted(files["figure"] for files in STAGE_FILES.values() if "figure" in files)
PAGE_FIGURES = [f"{FIGURES_DIR}/{f.rsplit(_SLASH, 1)[-1]}" for f in STAGE_FIGURES]


# Which ready job a machine of few cores starts first (Snakemake's `priority:`, higher first).
# The longest one-core chain first: the calibration and the neural proxy, which opt_rates (the
# longest single job) reads; the cost stage's serial part (one core, minutes, reading nothing)
# next, so that it runs beside the calibration's chain of fits (often one ready job at a time)
# rather than last, where a core would wait for it; then the other studies; the cost stage's
# threads part last: it reserves every core it sweeps and then runs alone (its timings
# undisturbed) instead of holding back the studies while the one-core jobs wait for a second
# free core.
PRIORITY = {
    "calibrate": 100,
    "nn_proxy": 100,
    "cost_serial": 95,
    "opt_rates": 90,
    "placement": 80,
    "fleet_opt": 75,
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


# The calibration's fleet sizes (robots per cell), ascending; its load sweep at the reference size.
_CALIBRATION_R = config["calibrate"]["R"]
CALIBRATION_R = sorted(
    int(r) for r in (_CALIBRATION_R if isinstance(_CALIBRATION_R, list) else [_CALIBRATION_R])
)
CALIBRATION_REF_R = int(config["calibrate"]["ref_R"])


# The library's rule for which fitted sizes a calibration needs (plain Python, no torch).
_spec = importlib.util.spec_from_file_location(
    "calibration_sizes", workflow.source_path("../../isaac_net/core/diff/calibrate/sizes.py")
)
calibration_sizes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calibration_sizes)
CALIBRATION_NEIGHBOUR = dict(calibration_sizes.continuation_order(CALIBRATION_R, CALIBRATION_REF_R))


def calibration_neighbour(wildcards):
    """A size's fit job reads the fit of the size it continues from (none at the reference size)."""
    neighbour = CALIBRATION_NEIGHBOUR[int(wildcards.R)]
    if neighbour is None:
        return []
    return f"{RESULTS}/calibrate/fit_{wildcards.model}_R{neighbour}.json"


def calibration_targets(point_set):
    """The calibration's L2-legacy target files of one point set, one per fleet size in ascending
    order (the sweep: the reference size only)."""
    sizes = [CALIBRATION_REF_R] if point_set == "sweep" else CALIBRATION_R
    return [f"{RESULTS}/calibrate/targets_{point_set}_R{r}.json" for r in sizes]


# What the fan-out rules' wildcards take (workflow/rules/fan_out.smk): a stage's inputs
# (stages.yaml) name their outputs with these, e.g. ``{results}/calibrate/fit_{model}.json``.
# The calibration's models (each fitted by its own job) and the sensitivity's operating points.
CALIBRATION_SETS = ("train", "heldout", "sweep")
CALIBRATION_MODELS = [f"{m}_{s}" for m in config["calibrate"]["modes"] for s in config["calibrate"]["sends"]]
SENSITIVITY_OPS = [op["name"] for op in config["sensitivity"]["ops"]]
# The fleet optimisation's fleet sizes (a gradient job each) and black-box methods (a job each per size).
FLEET_OPT_R = [int(r) for r in config["fleet_opt"]["R"]]
FLEET_OPT_METHODS = ["cmaes", "tpe", "random", "hybrid"]
# Its calibrated models: the gradient job runs the candidates of the chosen gradient
# (`choose_from`), a job per size each runs one of the others, at its own wall time.
_fleet_models = config["fleet_opt"]["models"]
FLEET_OPT_CANDIDATES = [
    f"{m['mode']}_{m['sends']}" for m in config["fleet_opt"].get("choose_from", _fleet_models)
]
FLEET_OPT_OWN_MODELS = [
    k for k in (f"{m['mode']}_{m['sends']}" for m in _fleet_models) if k not in FLEET_OPT_CANDIDATES
]
# ... and the neural proxy, fitted in its own job per size (when configured).
FLEET_OPT_PROXY = ["proxy"] if config["fleet_opt"].get("proxy") else []
# Which fleet_opt jobs read which (plain Python): the black-box jobs that run a fixed wall time from
# the start, without the gradient job, and whether the gradient job reads the proxy's run.
_spec = importlib.util.spec_from_file_location(
    "fleet_budget", workflow.source_path("../../benchmarks/diff/_fleet_budget.py")
)
fleet_budget = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fleet_budget)
FLEET_BUDGET = "benchmarks/diff/_fleet_budget.py"
FLEET_OPT_PROXY_CANDIDATE = fleet_budget.proxy_is_candidate(config["fleet_opt"])


def fleet_opt_gradient_of(wildcards):
    """A black-box job reads the gradient job of its size (its budget, the hybrid's start), except
    where it covers the calibration and runs a fixed wall time from the start."""
    if fleet_budget.covers_calibration(config["fleet_opt"], int(wildcards.R), wildcards.method):
        return []
    return f"{RESULTS}/fleet_opt/gradient_R{wildcards.R}.json"


# The cost stage's measuring parts (benchmarks/diff/cost.py PARTS; rules cost_<part>).
COST_PARTS = ["serial", "threads"]
FAN_OUT = {
    "cost_part": COST_PARTS,
    "model": CALIBRATION_MODELS,
    "op": SENSITIVITY_OPS,
    "sweep_R": [CALIBRATION_REF_R],
    "fleet_R": FLEET_OPT_R,
    "fleet_method": FLEET_OPT_METHODS,
    "fleet_model": FLEET_OPT_OWN_MODELS + FLEET_OPT_PROXY,
}


def fan_out_values(stage, wildcard):
    """What a wildcard of a stage's input pattern expands over: FAN_OUT's values; ``serving_R``, the
    calibration's fitted sizes that serve the stage's fleet size ``R``."""
    if wildcard == "serving_R":
        return calibration_sizes.serving_sizes(CALIBRATION_R, int(config[stage["config"]]["R"]))
    return FAN_OUT[wildcard]


def stage_inputs(stage):
    """A stage rule's inputs by name: the library and the helpers, then its entry's paths with
    ``{results}`` filled in and the fan-out wildcards expanded (a list stays a list)."""
    inputs = {"library": LIBRARY, "helpers": HELPERS}
    for key, value in stage["inputs"].items():
        patterns = value if isinstance(value, list) else [value]
        files, fanned = [], isinstance(value, list)
        for pattern in patterns:
            wildcards = {f for _, f, _, _ in string.Formatter().parse(pattern) if f} - {"results"}
            fanned = fanned or bool(wildcards)
            files += expand(pattern, results=RESULTS, **{w: fan_out_values(stage, w) for w in wildcards})
        inputs[key] = files if fanned else files[0]
    return inputs


def stage_output(name):
    """A stage rule's outputs by name; its artifact and figure in Snakemake's HTML report, captioned
    by workflow/report/<name>.rst."""
    caption = f"../report/{name}.rst"
    return {
        key: report(path, caption=caption, category=name) if key in ("json", "figure") else path
        for key, path in STAGE_FILES[name].items()
    }


def stage_threads(stage):
    """A stage rule's threads: its entry's number, by default the config's `threads`."""
    return config["threads"] if stage["threads"] is None else stage["threads"]
