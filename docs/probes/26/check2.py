"""Product QAD (qa_reshare) against the probe's reshare patch, and tau = 0 against discrete QA."""
import sys, dataclasses
sys.path.insert(0, "/work/reshare/tests")
import torch
torch.set_num_threads(1)
from isaac_net.core.diff import model, calibrate
from isaac_net.core.config import CellConfig
prob = calibrate.problem([(0.3, 8e3, 23.0), (0.6, 2e4, 23.0), (0.9, 3e4, 10.0)], R=8, envs=2, T=20, warmup=4, seed=0, dtype=torch.float64)
static = model.MODES["QA"]
sys.path.insert(0, "/tmp/p26")
import reshare
patched = dataclasses.replace(static, service=reshare.service, fused_step=None)
model.MODES["QA"] = static
for a in (0.25, 0.5, 1.0):
    cfg = CellConfig(qa_sr_slots=8, qa_reshare=a)
    mine = calibrate.model_kpis("QA", "relaxed", prob, cfg, tau=0.1, lam=0.1)
    reshare.ALPHA = a
    model.MODES["QA"] = patched
    ref = calibrate.model_kpis("QA", "relaxed", prob, dataclasses.replace(cfg, qa_reshare=0.0), tau=0.1, lam=0.1)
    model.MODES["QA"] = static
    for k in mine:
        print(a, k, (mine[k] - ref[k]).abs().max().item() / ref[k].abs().max().item())
