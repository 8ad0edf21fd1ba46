"""The setup replicates.py and aoi_curve.py share: argv point name, batches, calibration file
(optional; the page's), mode (QA), sends code (rb); the sensitivity stage's settings at that point and
the calibrated model's cell (SE_MAX from the environment: its spectral-efficiency cap)."""
import dataclasses, os, sys
from types import SimpleNamespace
sys.path.insert(0, "/work/main/benchmarks/diff")
import torch, yaml
torch.set_num_threads(1)
import sensitivity as S
from _common import cell_config
from isaac_net.core.diff.calibrate import Calibration


def setup(argv):
    name, batches = argv[1], int(argv[2])
    path = argv[3] if len(argv) > 3 else "/work/main/benchmarks/diff/results/full/calibration.json"
    mode, sends = (argv[4], argv[5]) if len(argv) > 5 else ("QA", "rb")
    params = yaml.safe_load(open("/work/main/config/config.yaml"))["sensitivity"]
    op = S.ops_by_name(params)[name]
    R = int(op.get("R", params["R"]))
    cfg = cell_config(params.get("cell", {}))
    cal = Calibration.load(path, mode=mode, sends=S.SEND_MODEL_OF_CODE[sends]).at(R)
    mcfg = cal.apply(cfg, R=R, area_m=op.get("area_m", [40.0, 140.0]))
    if os.environ.get("SE_MAX"):
        mcfg = dataclasses.replace(mcfg, se_max=float(os.environ["SE_MAX"]))
    n_seeds, T, warmup = (int(params[k]) for k in ("n_seeds", "T", "warmup"))
    return SimpleNamespace(name=name, batches=batches, mode=mode, sends=sends, params=params, op=op, R=R,
                           per=int(op.get("envs_per_seed", params["envs_per_seed"])), cfg=cfg, cal=cal, mcfg=mcfg,
                           dtype=getattr(torch, params.get("dtype", "float32")), n_seeds=n_seeds, T=T,
                           warmup=warmup)
