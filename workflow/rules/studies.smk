# The pending studies of the seed, at full scale: L2-legacy sensitivity, the optimisation
# demo, the placement toy and the neural proxy. Each writes the generic artifact
# (provenance, config, summary, table, figure) that the report renders.
# A study that imports another study's script lists that script as an input.
import jsonschema
import yaml

# The studies' sections of the config, validated here (config.schema.yaml only asks for
# objects). The shared $defs (posint, seed, prob, tau, mode, sizes_bytes, cell) are the
# pipeline schema's; unknown keys are errors there and here.
_STUDIES_SCHEMA = yaml.safe_load(
    r"""
$defs:
  area_m:
    description: "[low, high] m; positions uniform in the square [low, high]^2 (gNB at the origin)"
    type: array
    items: {type: number}
    minItems: 2
    maxItems: 2
  optimisation:
    description: opt_rates (p_init, tx_init_dbm, bounds) and placement (p, tx_dbm, move_weight, radius_m)
    type: object
    additionalProperties: false
    required: [seed, level, models, proxy, lam, dtype, E, R, T, warmup, T_eval, warmup_eval, iters, lr,
               tau_start, tau_end, score_every, candidates, n_boot, rs_chunk_envs, sizes_bytes, cost, cell]
    properties:
      seed: {$ref: "#/$defs/seed"}
      level: {enum: [L1, QA, L2-legacy]}
      models:
        description: the models a gradient run goes through, each uncalibrated or calibrated (calibrate stage)
        type: array
        minItems: 1
        items:
          type: object
          additionalProperties: false
          required: [mode, sends, calibrated]
          properties:
            mode: {$ref: "#/$defs/mode"}
            sends: {enum: [mean_field, relaxed]}
            calibrated: {type: boolean}
      proxy: {type: boolean}
      uniform:
        type: object
        additionalProperties: false
        required: [p, tx_dbm]
        properties:
          p: {type: array, items: {$ref: "#/$defs/prob"}, minItems: 1}
          tx_dbm: {type: array, items: {type: number}, minItems: 1}
      n_boot: {type: integer, minimum: 10}
      targets:
        type: object
        additionalProperties: false
        required: [solution]
        properties:
          solution: {type: string}
          start_envs_min: {type: number, minimum: 0, maximum: 1}
          random_envs_min: {type: number, minimum: 0, maximum: 1}
          beat_random_search: {type: boolean}
          uniform_no_worse: {type: boolean}
      lam: {type: number, minimum: 0}
      dtype: {enum: [float32, float64]}
      E: {$ref: "#/$defs/posint"}
      R: {$ref: "#/$defs/posint"}
      T: {$ref: "#/$defs/posint"}
      warmup: {type: integer, minimum: 0}
      T_eval: {$ref: "#/$defs/posint"}
      warmup_eval: {type: integer, minimum: 0}
      iters: {$ref: "#/$defs/posint"}
      lr: {type: number, exclusiveMinimum: 0}
      tau_start: {type: number, exclusiveMinimum: 0}
      tau_end: {type: number, exclusiveMinimum: 0}
      score_every: {type: integer, minimum: 0}
      candidates: {$ref: "#/$defs/posint"}
      rs_chunk_envs: {$ref: "#/$defs/posint"}
      sizes_bytes: {$ref: "#/$defs/sizes_bytes"}
      area_m: {$ref: "#/$defs/area_m"}
      p_init: {$ref: "#/$defs/prob"}
      tx_init_dbm: {type: number}
      bounds:
        type: object
        additionalProperties: false
        required: [p, tx_dbm]
        properties:
          p: {type: array, items: {type: number, minimum: 0, maximum: 1}, minItems: 2, maxItems: 2}
          tx_dbm: {type: array, items: {type: number}, minItems: 2, maxItems: 2}
      p: {$ref: "#/$defs/prob"}
      tx_dbm: {type: number}
      move_weight: {type: number, minimum: 0}
      radius_m: {type: number, exclusiveMinimum: 0}
      cost:
        type: object
        additionalProperties: false
        required: [weights, delivery_min, penalty]
        properties:
          weights:
            type: object
            additionalProperties: false
            required: [mean_delay, mean_aoi, mean_energy_j]
            properties:
              mean_delay: {type: number, minimum: 0}
              mean_aoi: {type: number, minimum: 0}
              mean_energy_j: {type: number, minimum: 0}
          delivery_min: {type: number, minimum: 0, maximum: 1}
          penalty: {type: number, minimum: 0}
      cell: {$ref: "#/$defs/cell"}
properties:
  sensitivity:
    type: object
    additionalProperties: false
    required: [seed, level, dtype, n_seeds, envs_per_seed, R, T, warmup, tau, lam, modes, sends, n_boot,
               fd_steps, ops, cell]
    properties:
      seed: {$ref: "#/$defs/seed"}
      level: {enum: [L1, QA, L2-legacy]}
      dtype: {enum: [float32, float64]}
      n_seeds: {type: integer, minimum: 2}
      envs_per_seed: {$ref: "#/$defs/posint"}
      R: {$ref: "#/$defs/posint"}
      T: {$ref: "#/$defs/posint"}
      warmup: {type: integer, minimum: 0}
      tau: {$ref: "#/$defs/tau"}
      lam: {type: number, minimum: 0}
      modes: {type: array, items: {$ref: "#/$defs/mode"}, minItems: 1}
      sends: {type: array, items: {enum: [mf, rb]}, minItems: 1}
      n_boot: {type: integer, minimum: 10}
      fd_steps:
        type: object
        additionalProperties: false
        required: [p, kbytes, tx_db, dist_m]
        properties:
          p: {type: number, exclusiveMinimum: 0, maximum: 0.5}
          kbytes: {type: number, exclusiveMinimum: 0}
          tx_db: {type: number, exclusiveMinimum: 0}
          dist_m: {type: number, exclusiveMinimum: 0}
      ops:
        description: operating points, each named (a list, so that a profile's list replaces the default's)
        type: array
        minItems: 1
        items:
          type: object
          additionalProperties: false
          required: [name, p, sizes_bytes]
          properties:
            name: {type: string, pattern: "^[A-Za-z0-9_]+$"}
            p: {$ref: "#/$defs/prob"}
            sizes_bytes: {$ref: "#/$defs/sizes_bytes"}
            tx_dbm: {type: number}
            area_m: {$ref: "#/$defs/area_m"}
            R: {$ref: "#/$defs/posint"}
            held_out: {type: boolean}
      targets:
        type: object
        additionalProperties: false
        required: [models, sign_agree_min, median_ratio, within_x2_min, l1d_mf_sign_agree_min]
        properties:
          models: {type: array, items: {type: string}}
          sign_agree_min: {type: number, minimum: 0, maximum: 1}
          median_ratio: {type: array, items: {type: number, exclusiveMinimum: 0}, minItems: 2, maxItems: 2}
          within_x2_min: {type: number, minimum: 0, maximum: 1}
          l1d_mf_sign_agree_min: {type: number, minimum: 0, maximum: 1}
      cell: {$ref: "#/$defs/cell"}
  opt_rates: {$ref: "#/$defs/optimisation"}
  placement: {$ref: "#/$defs/optimisation"}
  nn_proxy:
    type: object
    additionalProperties: false
    required: [seed, level, dtype, R, T, warmup, train_cells, test_cells, batch_cells, hidden, epochs, lr,
               batch_size, grad_cells, fd_steps, n_boot, cell]
    properties:
      seed: {$ref: "#/$defs/seed"}
      level: {enum: [L1, QA, L2-legacy]}
      dtype: {enum: [float32, float64]}
      R: {type: integer, minimum: 2}
      T: {$ref: "#/$defs/posint"}
      warmup: {type: integer, minimum: 0}
      train_cells: {$ref: "#/$defs/posint"}
      test_cells: {$ref: "#/$defs/posint"}
      batch_cells: {$ref: "#/$defs/posint"}
      hidden: {type: array, items: {$ref: "#/$defs/posint"}, minItems: 1}
      epochs: {$ref: "#/$defs/posint"}
      lr: {type: number, exclusiveMinimum: 0}
      batch_size: {$ref: "#/$defs/posint"}
      grad_cells: {type: integer, minimum: 3}
      fd_steps:
        type: object
        additionalProperties: false
        required: [p, msg_rel, snr_db]
        properties:
          p: {type: number, exclusiveMinimum: 0, maximum: 0.05}
          msg_rel: {type: number, exclusiveMinimum: 0, exclusiveMaximum: 1}
          snr_db: {type: number, exclusiveMinimum: 0}
      n_boot: {type: integer, minimum: 10}
      ranges:
        type: object
        additionalProperties: false
        required: [p, msg_bytes, snr_db]
        properties:
          p: {type: array, items: {type: number, minimum: 0, maximum: 1}, minItems: 2, maxItems: 2}
          msg_bytes: {type: array, items: {type: number, exclusiveMinimum: 0}, minItems: 2, maxItems: 2}
          snr_db: {type: array, items: {type: number}, minItems: 2, maxItems: 2}
      cell: {$ref: "#/$defs/cell"}
"""
)


_STUDIES_SCHEMA["$defs"] = {
    **yaml.safe_load(open(workflow.source_path("../schemas/config.schema.yaml")))["$defs"],
    **_STUDIES_SCHEMA["$defs"],
}
_STUDIES_SCHEMA.update(type="object", required=list(_STUDIES_SCHEMA["properties"]))
try:
    jsonschema.validate(config, _STUDIES_SCHEMA)
except jsonschema.ValidationError as _err:
    _where = "/".join(str(p) for p in _err.absolute_path)
    raise ValueError(f"config: {_where}: {_err.message}") from None


SENSITIVITY_OPS = [op["name"] for op in config["sensitivity"]["ops"]]


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
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/sensitivity.py"


rule sensitivity:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        calibration=ARTIFACTS["calibration"],
        parts=expand(f"{RESULTS}/sensitivity/op_{{op}}.json", op=SENSITIVITY_OPS),
    output:
        json=report(OPTIONAL_ARTIFACTS["sensitivity"], caption="../report/sensitivity.rst", category="sensitivity"),
        figure=report(f"{RESULTS}/sensitivity.png", caption="../report/sensitivity.rst", category="sensitivity"),
    params:
        **stage_params("sensitivity"),
        part="merge",
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
        calibration=ARTIFACTS["calibration"],
        proxy=f"{RESULTS}/nn_proxy.pt",
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
        calibration=ARTIFACTS["calibration"],
        proxy=f"{RESULTS}/nn_proxy.pt",
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
        json=report(OPTIONAL_ARTIFACTS["nn_proxy"], caption="../report/nn_proxy.rst", category="nn_proxy"),
        figure=report(f"{RESULTS}/nn_proxy.png", caption="../report/nn_proxy.rst", category="nn_proxy"),
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
