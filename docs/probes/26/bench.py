import sys, time
sys.path.insert(0, "/work/reshare")
import torch
torch.set_num_threads(1)
from isaac_net.core.config import CellConfig
from isaac_net.core.diff import calibrate
grid = calibrate.product_grid([0.1, 0.3, 0.4, 0.6, 0.8], [6000.0, 16000.0, 30000.0], [23.0, 13.0])
R = int(sys.argv[1])
prob = calibrate.problem(grid, R=R, envs=max(1, 32 // R), T=60, warmup=10, seed=0)
for a in (0.0, 0.5):
    cfg = CellConfig(qa_sr_slots=8, qa_reshare=a, rate_factor=0.5, snr_offset_db=-6.0, qa_snr_req_db=-20.0)
    for comp in (True,):
        ts = []
        for i in range(3):
            t0 = time.perf_counter()
            calibrate.model_kpis("QA", "relaxed", prob, cfg, tau=0.1, lam=0.1, compile=comp)
            ts.append(time.perf_counter() - t0)
        print(f"R {R} reshare {a} compile {comp}: " + " ".join(f"{t:.2f}" for t in ts), flush=True)
