# The jobs that some stages fan out into, each merged by its stage's rule (workflow/rules/stages.smk,
# whose inputs in workflow/stages.yaml name these outputs; their wildcards' values: FAN_OUT in
# common.smk). Side by side under --cores N or SLURM.
#
# Calibration of L1D and QAD (mean-field, relaxed) to L2-legacy (benchmarks/diff/calibrate.py):
# L2-legacy targets per point set and fleet size, and one fit per model; the merge (rule
# calibrate) writes the calibration file the studies read.
CALIBRATION_DIR = f"{RESULTS}/calibrate"


rule calibrate_targets:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        json=f"{CALIBRATION_DIR}/targets_{{set}}_R{{R}}.json",
    params:
        **stage_params(
            "calibrate",
            drop=[
                "search",
                "modes",
                "sends",
                "tau",
                "lam",
                "model_robots",
                "slope_weight",
                "load_spread",
                "mf_backlog_closure",
                "qa_reshare",
                "qa_min_grant_subbands",
                "compile",
            ],
        ),
        part=lambda wc: f"targets-{wc.set}-{wc.R}",
    wildcard_constraints:
        set="|".join(CALIBRATION_SETS),
        R="|".join(str(r) for r in CALIBRATION_R),
    log:
        f"{RESULTS}/logs/calibrate_targets_{{set}}_R{{R}}.log",
    benchmark:
        f"{RESULTS}/bench/calibrate_targets_{{set}}_R{{R}}.tsv"
    threads: config["threads"]
    priority: PRIORITY["calibrate"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/calibrate.py"


# One fit per model and fleet size: the reference size's first, each other size's after the fit of
# the size next to it (its search narrowed around that one's choice), so a study at one size waits
# only for the fits on the way to it.
rule calibrate_fit_size:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        train=f"{CALIBRATION_DIR}/targets_train_R{{R}}.json",
        heldout=f"{CALIBRATION_DIR}/targets_heldout_R{{R}}.json",
        neighbour=calibration_neighbour,
    output:
        json=f"{CALIBRATION_DIR}/fit_{{model}}_R{{R}}.json",
    params:
        **stage_params("calibrate", drop=["modes", "sends", "sweep"]),
        part=lambda wc: f"size-{wc.model}-{wc.R}",
    wildcard_constraints:
        model="|".join(CALIBRATION_MODELS),
        R="|".join(str(r) for r in CALIBRATION_R),
    log:
        f"{RESULTS}/logs/calibrate_fit_{{model}}_R{{R}}.log",
    benchmark:
        f"{RESULTS}/bench/calibrate_fit_{{model}}_R{{R}}.tsv"
    threads: config["threads"]
    priority: PRIORITY["calibrate"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/calibrate.py"


# The model's fits at every size as one file, the forms' losses and its sweep curves.
rule calibrate_fit:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        train=calibration_targets("train"),
        sizes=expand(f"{CALIBRATION_DIR}/fit_{{{{model}}}}_R{{R}}.json", R=CALIBRATION_R),
    output:
        json=f"{CALIBRATION_DIR}/fit_{{model}}.json",
    params:
        **stage_params("calibrate", drop=["modes", "sends", "search", "heldout"]),
        part=lambda wc: f"fit-{wc.model}",
    wildcard_constraints:
        model="|".join(CALIBRATION_MODELS),
    log:
        f"{RESULTS}/logs/calibrate_fit_{{model}}.log",
    benchmark:
        f"{RESULTS}/bench/calibrate_fit_{{model}}.tsv"
    threads: config["threads"]
    priority: PRIORITY["calibrate"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/calibrate.py"


# L2-legacy sensitivity (benchmarks/diff/sensitivity.py): one job per operating point; the merge
# (rule sensitivity) writes the stage's artifact.
rule sensitivity_op:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        calibration=ARTIFACTS["calibration"],
    output:
        json=f"{RESULTS}/sensitivity/op_{{op}}.json",
    params:
        **stage_params("sensitivity"),
        part=lambda wc: f"op-{wc.op}",
    wildcard_constraints:
        op="|".join(SENSITIVITY_OPS),
    log:
        f"{RESULTS}/logs/sensitivity_op_{{op}}.log",
    benchmark:
        f"{RESULTS}/bench/sensitivity_op_{{op}}.tsv"
    threads: config["threads"]
    priority: PRIORITY["sensitivity"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/sensitivity.py"


# Gradients against black-box optimisers on L2-legacy (benchmarks/diff/fleet_opt.py), per fleet
# size: first the calibrated gradients (and the uniform policy), whose wall time sets the budgets,
# then each black-box method in its own job; the merge (rule fleet_opt) writes the stage's artifact.
FLEET_OPT_DIR = f"{RESULTS}/fleet_opt"
# The settings only the merge reads, and only the black-box jobs: a change reruns those jobs alone.
FLEET_OPT_MERGE_KEYS = ["budgets", "n_boot", "targets"]
FLEET_OPT_BLACKBOX_KEYS = [
    "budget_factor",
    "cover_calibration_R",
    "cover_calibration_methods",
    "hybrid_sigma0",
    "random_per_round",
    "tpe_trials_per_round",
    "score_every",
]


# The gradient job reads the candidates' fits, not the merged calibration: it starts as soon as
# they are done (the longest fit is not on the black-box jobs' path); with the proxy a candidate
# (fleet_opt.proxy.candidate), also its job's run at the size.
rule fleet_opt_gradient:
    input:
        **({"proxy": f"{FLEET_OPT_DIR}/model_proxy_R{{R}}.json"} if FLEET_OPT_PROXY_CANDIDATE else {}),
        library=LIBRARY,
        helpers=HELPERS,
        targets=calibration_targets("train") + calibration_targets("heldout"),
        fits=expand(f"{CALIBRATION_DIR}/fit_{{model}}.json", model=FLEET_OPT_CANDIDATES),
    output:
        json=f"{FLEET_OPT_DIR}/gradient_R{{R}}.json",
    params:
        **stage_params("fleet_opt", drop=FLEET_OPT_MERGE_KEYS + FLEET_OPT_BLACKBOX_KEYS),
        part=lambda wc: f"gradient-{wc.R}",
    wildcard_constraints:
        R="|".join(str(r) for r in FLEET_OPT_R),
    log:
        f"{RESULTS}/logs/fleet_opt_gradient_R{{R}}.log",
    benchmark:
        f"{RESULTS}/bench/fleet_opt_gradient_R{{R}}.tsv"
    threads: 1
    priority: PRIORITY["fleet_opt"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/fleet_opt.py"


rule fleet_opt_model:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        targets=calibration_targets("train") + calibration_targets("heldout"),
        fits=f"{CALIBRATION_DIR}/fit_{{model}}.json",
    output:
        json=f"{FLEET_OPT_DIR}/model_{{model}}_R{{R}}.json",
    params:
        **stage_params("fleet_opt", drop=FLEET_OPT_MERGE_KEYS + FLEET_OPT_BLACKBOX_KEYS + ["uniform"]),
        part=lambda wc: f"model-{wc.R}-{wc.model}",
    wildcard_constraints:
        R="|".join(str(r) for r in FLEET_OPT_R),
        model="|".join(FLEET_OPT_OWN_MODELS) or "(?!)",
    log:
        f"{RESULTS}/logs/fleet_opt_model_{{model}}_R{{R}}.log",
    benchmark:
        f"{RESULTS}/bench/fleet_opt_model_{{model}}_R{{R}}.tsv"
    threads: 1
    priority: PRIORITY["fleet_opt"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/fleet_opt.py"


rule fleet_opt_proxy:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        json=f"{FLEET_OPT_DIR}/model_proxy_R{{R}}.json",
    params:
        **stage_params("fleet_opt", drop=FLEET_OPT_MERGE_KEYS + FLEET_OPT_BLACKBOX_KEYS + ["uniform"]),
        part=lambda wc: f"model-{wc.R}-proxy",
    wildcard_constraints:
        R="|".join(str(r) for r in FLEET_OPT_R),
    log:
        f"{RESULTS}/logs/fleet_opt_proxy_R{{R}}.log",
    benchmark:
        f"{RESULTS}/bench/fleet_opt_proxy_R{{R}}.tsv"
    threads: 1
    priority: PRIORITY["fleet_opt"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/fleet_opt.py"


rule fleet_opt_blackbox:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        budget=FLEET_BUDGET,
        gradient=fleet_opt_gradient_of,
    output:
        json=f"{FLEET_OPT_DIR}/{{method}}_R{{R}}.json",
    params:
        **stage_params("fleet_opt", drop=FLEET_OPT_MERGE_KEYS + ["uniform"]),
        part=lambda wc: f"blackbox-{wc.R}-{wc.method}",
    wildcard_constraints:
        R="|".join(str(r) for r in FLEET_OPT_R),
        method="|".join(FLEET_OPT_METHODS),
    log:
        f"{RESULTS}/logs/fleet_opt_{{method}}_R{{R}}.log",
    benchmark:
        f"{RESULTS}/bench/fleet_opt_{{method}}_R{{R}}.tsv"
    threads: 1
    priority: PRIORITY["fleet_opt"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/fleet_opt.py"
