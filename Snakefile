# The "Checks and measurements" pipeline (docs/design.md, "The pipeline"). Wiring only: the logic is in
# workflow/rules/common.smk, the stages in workflow/stages.yaml (their rules are generated from it).
#
#   snakemake --cores 32 report                              # full profile (config/config.yaml)
#   snakemake --cores 2 report --configfile config/ci.yaml   # another profile (target first:
#                                                            # --configfile takes several files)
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


# Snakemake's HTML report (snakemake --report report.html): the page, figures and artifacts, captioned.
report: "workflow/report/workflow.rst"


# common.smk coerces command-line overrides, validates the config and checks its cross-field rules.
include: "workflow/rules/common.smk"
# The stages' rules, generated from the stage registry workflow/stages.yaml, and the jobs that some
# of them fan out into (the cost stage's two parts: cost.smk).
include: "workflow/rules/fan_out.smk"
include: "workflow/rules/stages.smk"
include: "workflow/rules/cost.smk"


# Rendering runs where Snakemake runs, also under an executor (SLURM).
localrules:
    all,
    report,
    page,


rule all:
    input:
        PAGE,
        TRACE,
        *ARTIFACTS.values(),
        *STAGE_OUTPUTS,
        *PAGE_FIGURES,
        *ALL_TABLES,


# The target: the page, every artifact it renders, every other file a stage declares and the
# page's figures. A rule without output or action, so Snakemake checks that each input exists and
# plans the rule of a missing one (a rule with an output, like page, is only rerun when its output
# is older or missing, and Snakemake only looks for the outputs something asks for: a deleted
# figure that no target names would stay deleted).
rule report:
    input:
        **ARTIFACTS,
        page=PAGE,
        trace=TRACE,
        outputs=STAGE_OUTPUTS,
        figures=PAGE_FIGURES,
        tables=ALL_TABLES,


rule page:
    input:
        **ARTIFACTS,
        template="reports/checks_and_measurements.md.j2",
        sections=PAGE_SECTIONS,
        renderer="reports/render.py",
        checker="reports/check_numbers.py",
        schema="workflow/schemas/artifacts.schema.yaml",
        figures=STAGE_FIGURES,
    output:
        page=report(PAGE, caption="workflow/report/page.rst", category="page"),
        trace=report(TRACE, caption="workflow/report/trace.rst", category="page"),
        # Files, not directory(): a deleted copy is a missing output, and the page is rendered again.
        figures=PAGE_FIGURES,
    params:
        profile=PROFILE,
        paths=ARTIFACTS,
        pending=PENDING_COMMANDS,
    log:
        f"{RESULTS}/logs/page.log",
    benchmark:
        f"{RESULTS}/bench/page.tsv"
    threads: 1
    conda:
        "environment.yml"
    script:
        "reports/render.py"
