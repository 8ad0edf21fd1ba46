# The "Checks and measurements" pipeline (DESIGN.md §4). Wiring only: the logic is in
# workflow/rules/common.smk, each stage's rule in its own file.
#
#   snakemake --cores 32 report                              # full profile (config/config.yaml)
#   snakemake --cores 2 report --configfile config/ci.yaml   # another profile (target first:
#                                                            # --configfile takes several files)
from snakemake.utils import min_version, validate

min_version("8.0")


configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/equivalence.smk"
include: "workflow/rules/convergence.smk"
include: "workflow/rules/gradcheck.smk"
include: "workflow/rules/cost.smk"
include: "workflow/rules/studies.smk"


# Rendering runs where Snakemake runs, also under an executor (SLURM).
localrules:
    all,
    report,


rule all:
    input:
        page=PAGE,


rule report:
    input:
        **ALL_ARTIFACTS,
        template="reports/checks_and_measurements.md.j2",
        renderer="reports/render.py",
        checker="reports/check_numbers.py",
        schema="workflow/schemas/artifacts.schema.yaml",
    output:
        page=PAGE,
        figures=directory(FIGURES_DIR),
    params:
        profile=PROFILE,
        paths=ALL_ARTIFACTS,
        pending=PENDING_COMMANDS,
    log:
        f"{RESULTS}/logs/report.log",
    benchmark:
        f"{RESULTS}/bench/report.tsv"
    threads: 1
    conda:
        "environment.yml"
    script:
        "reports/render.py"
