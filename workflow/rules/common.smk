# Shared definitions of the pipeline: paths, inputs every stage has, the report's inputs.
import glob

PROFILE = config["profile"]
RESULTS = f"benchmarks/diff/results/{PROFILE}"
# The full profile's page is the project's page; another profile's page stays with its results.
PAGE_DIR = "reports" if PROFILE == "full" else RESULTS
PAGE = f"{PAGE_DIR}/checks_and_measurements.md"
FIGURES_DIR = f"{PAGE_DIR}/figures"
PROFILE_OPTION = "" if PROFILE == "full" else f" --configfile config/{PROFILE}.yaml"

# A changed model reruns every stage: the library's sources are an input of each.
LIBRARY = sorted(glob.glob("isaac_net/**/*.py", recursive=True))
HELPERS = ["benchmarks/diff/_common.py", "benchmarks/diff/_plots.py"]

# Artifacts the report renders, by name.
ARTIFACTS = {
    "equivalence": f"{RESULTS}/equivalence.json",
    "convergence": f"{RESULTS}/convergence.json",
    "convergence_curves": f"{RESULTS}/convergence_curves.json",
    "gradcheck": f"{RESULTS}/gradcheck.json",
    "fd_check": f"{RESULTS}/fd_check.json",
    "cost": f"{RESULTS}/cost.json",
}
# The studies' artifacts (workflow/rules/studies.smk): the generic structure (provenance,
# summary, table, optional figure) that the page renders without knowing the study.
OPTIONAL_ARTIFACTS = {
    name: f"{RESULTS}/{name}.json" for name in ("sensitivity", "opt_rates", "placement", "nn_proxy")
}
ALL_ARTIFACTS = {**ARTIFACTS, **OPTIONAL_ARTIFACTS}
PENDING_COMMANDS = {
    name: f"snakemake --cores 32 {path}{PROFILE_OPTION}" for name, path in ALL_ARTIFACTS.items()
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

