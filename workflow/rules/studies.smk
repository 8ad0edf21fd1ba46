# The pending studies of the seed, at full scale: L2-legacy sensitivity, the optimisation
# demo, the placement toy and the neural proxy. Each writes the generic artifact
# (provenance, config, summary, table, figure) that the report renders.
# A study that imports another study's script lists that script as an input.


rule sensitivity:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        json=OPTIONAL_ARTIFACTS["sensitivity"],
        figure=f"{RESULTS}/sensitivity.png",
    params:
        **stage_params("sensitivity"),
    log:
        log_path("sensitivity"),
    benchmark:
        bench_path("sensitivity")
    threads: config["threads"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/sensitivity.py"


rule opt_rates:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        json=OPTIONAL_ARTIFACTS["opt_rates"],
        figure=f"{RESULTS}/opt_rates.png",
    params:
        **stage_params("opt_rates"),
    log:
        log_path("opt_rates"),
    benchmark:
        bench_path("opt_rates")
    threads: config["threads"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/opt_rates.py"


rule placement:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        scripts=["benchmarks/diff/opt_rates.py"],
    output:
        json=OPTIONAL_ARTIFACTS["placement"],
        figure=f"{RESULTS}/placement.png",
    params:
        **stage_params("placement"),
    log:
        log_path("placement"),
    benchmark:
        bench_path("placement")
    threads: config["threads"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/placement.py"


rule nn_proxy:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        scripts=["benchmarks/diff/sensitivity.py"],
    output:
        json=OPTIONAL_ARTIFACTS["nn_proxy"],
        figure=f"{RESULTS}/nn_proxy.png",
        model=f"{RESULTS}/nn_proxy.pt",
    params:
        **stage_params("nn_proxy"),
    log:
        log_path("nn_proxy"),
    benchmark:
        bench_path("nn_proxy")
    threads: config["threads"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/nn_proxy.py"
