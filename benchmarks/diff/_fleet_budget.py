"""Which jobs of the fleet optimisation (fleet_opt.py) read which: the black-box jobs that run a
fixed wall time from the pipeline's start instead of a budget set by the gradient job, and whether
the gradient job reads the neural proxy's. Plain Python: the rules read it too
(workflow/rules/common.smk), to give each job the inputs it reads and no others."""


def covers_calibration(params: dict, R: int, method: str) -> bool:
    """Whether black-box ``method`` at fleet size ``R`` is a baseline of the comparisons charged in
    full (``cover_calibration_methods`` at the sizes of ``cover_calibration_R``). Such a job must
    outlast the hybrid's budget plus the calibration's time, which are known only once the
    calibration and the gradient job have run; waiting for them would put the calibration on the
    critical path twice (its fits, then as long again in this job). It runs ``cover_wall_s`` from
    the start instead, and a comparison it does not reach is "not measured"."""
    sizes = {int(r) for r in params["cover_calibration_R"]}
    return method in params["cover_calibration_methods"] and int(R) in sizes


def proxy_is_candidate(params: dict) -> bool:
    """Whether the neural proxy (its own job per size) is among the candidates of the comparisons'
    gradient (``proxy.candidate``): the gradient job then reads the proxy job's run."""
    return bool((params.get("proxy") or {}).get("candidate", False))
