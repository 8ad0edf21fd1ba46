# The stages' rules, one per entry of workflow/stages.yaml, generated from it (common.smk reads it):
# a stage script run on its config section (less the keys it leaves to another stage) with the
# library and the helpers as inputs, writing its artifact, tidy tables and figure. A changed input,
# param or script reruns the stage; restore.py checks the same from the artifact's hashes.
for _name, _stage in STAGES.items():

    rule:
        name:
            _stage["rule"]
        input:
            **stage_inputs(_stage),
        output:
            **stage_output(_name),
        params:
            **stage_params(_stage["config"], drop=_stage["drop"]),
            **({} if _stage["part"] is None else {"part": _stage["part"]}),
        log:
            log_path(_stage["rule"]),
        benchmark:
            bench_path(_stage["rule"])
        threads: stage_threads(_stage)
        priority: PRIORITY[_stage["priority"]]
        conda:
            "../../environment.yml"
        script:
            f"../../benchmarks/diff/{_stage['script']}"
