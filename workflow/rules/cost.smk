# The cost stage's measurements (benchmarks/diff/cost.py, _jobs says which part measures a row) in
# two jobs: `threads`, the table's rows at its E (1 and 2 threads side by side) and the compiled first
# calls (each compiles in a second process beside its own) and L2-legacy's two slot loops (whose ratio
# a busy neighbour core moves), on every core the stage sweeps (max(cost.threads)), so that nothing
# runs beside them; `serial`, the comparisons that hold within themselves (the speed-up at more batch
# sizes) and the large rollout, on one core beside the other one-core jobs. The merge (rule cost)
# writes the artifact. One rule per part (a rule's priority is a number, not a function of its
# wildcards): the serial part starts beside the calibration, so that it is not left running alone at
# the end while the threads part waits for every core; the threads part last. Defined in a function
# for the reason stages.smk gives, in a file of its own (Snakemake's lint wants rules and functions
# apart).
def cost_part_rule(part, threads, priority):
    """The rule of the cost stage's part `part`."""

    rule:
        name:
            f"cost_{part}"
        input:
            library=LIBRARY,
            helpers=HELPERS,
            yardstick="benchmarks/diff/_yardstick.py",
        output:
            json=f"{RESULTS}/cost/{part}.json",
        params:
            **stage_params("cost"),
            part=part,
        log:
            f"{RESULTS}/logs/cost_{part}.log",
        benchmark:
            f"{RESULTS}/bench/cost_{part}.tsv"
        threads: threads
        priority: priority
        conda:
            "../../environment.yml"
        script:
            "../../benchmarks/diff/cost.py"


cost_part_rule("serial", 1, PRIORITY["cost_serial"])
cost_part_rule("threads", max(config["cost"]["threads"]), PRIORITY["cost"])
