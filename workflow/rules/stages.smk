# The stages' rules, one per entry of workflow/stages.yaml, generated from it (common.smk reads it):
# a stage script run on its config section (less the keys it leaves to another stage) with the
# library and the helpers as inputs, writing its artifact, tidy tables and figure. A changed input,
# param or script reruns the stage; restore.py checks the same from the artifact's hashes.
#
# Defined in a function, called once per stage, not in the loop's body: Snakemake evaluates the
# `script:` expression again when the job runs, and a loop variable would by then name the last
# stage (every rule would run the cost script); a function's arguments stay each call's own.


def stage_rule(name, stage):
    """The rule of stage `name`, from its registry entry."""

    rule:
        name:
            stage["rule"]
        input:
            **stage_inputs(stage),
        output:
            **stage_output(name),
        params:
            **stage_params(stage["config"], drop=stage["drop"]),
            **({} if stage["part"] is None else {"part": stage["part"]}),
        log:
            log_path(stage["rule"]),
        benchmark:
            bench_path(stage["rule"])
        threads: stage_threads(stage)
        priority: PRIORITY[stage["priority"]]
        conda:
            "../../environment.yml"
        script:
            f"../../benchmarks/diff/{stage['script']}"


for _name, _stage in STAGES.items():
    stage_rule(_name, _stage)
