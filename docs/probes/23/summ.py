import json, sys, numpy as np
FIT = ("mean_delay", "delivery_ratio", "mean_aoi", "mean_energy_j")
parts = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
parts = [p for p in parts if p["tag"] == sys.argv[2]]
print("rows wrong (new):")
groups = {"stage": [p for p in parts if not p["held_out"]], "held_out": [p for p in parts if p["held_out"]]}
for R in sorted({p["R"] for p in parts}):
    groups[f"R{R}"] = [p for p in parts if p["R"] == R]
for g, ps in groups.items():
    for which in ("old", "new"):
        rows = [r for p in ps for r in p["rows"] if r["kpi"] in FIT and r["sig"]]
        sign = np.mean([np.sign(r[which]) == np.sign(r["fd"]) for r in rows])
        rat = np.array([r[which] / r["fd"] for r in rows])
        print(f"{g:9s} {which}: n {len(rows):3d} sign {sign:.3f} median {np.median(rat):.3f} "
              f"within2 {np.mean((rat >= .5) & (rat <= 2)):.3f}", end="   ")
    print()
    for p in ps:
        for r in p["rows"]:
            if r["kpi"] in FIT and r["sig"] and np.sign(r["new"]) != np.sign(r["fd"]):
                print(f"   wrong new: {p['op']} {r['kpi']} {r['input']} fd {r['fd']:.3g} new {r['new']:.3g}")
