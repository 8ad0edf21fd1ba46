"""Which black-box jobs of the fleet optimisation (fleet_opt.py) run a fixed wall time from the
pipeline's start instead of a budget set by the gradient job. Plain Python: the rules read it too
(workflow/rules/common.smk), to leave the gradient job out of those jobs' inputs."""


def covers_calibration(params: dict, R: int, method: str) -> bool:
    """Whether black-box ``method`` at fleet size ``R`` is a baseline of the comparisons charged in
    full (``cover_calibration_methods`` at the sizes of ``cover_calibration_R``). Such a job must
    outlast the hybrid's budget plus the calibration's time, which are known only once the
    calibration and the gradient job have run; waiting for them would put the calibration on the
    critical path twice (its fits, then as long again in this job). It runs ``cover_wall_s`` from
    the start instead, and a comparison it does not reach is "not measured"."""
    sizes = {int(r) for r in params["cover_calibration_R"]}
    return method in params["cover_calibration_methods"] and int(R) in sizes
