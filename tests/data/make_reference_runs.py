"""Generate tests/data/reference_runs.npz: final metrics, per-sample arrays and dynamics of a fixed
set of small runs (every model x every engine that runs it, 3 run keys, float32 and float64).

Generated once, from the code *before* the model-protocol refactor: at git commit 5939f9b,
``python tests/data/make_reference_runs.py`` (it uses that version's API).
``tests/test_reference_runs.py`` checks that the current code reproduces every stored number.
The run key of case ``c`` with index ``i`` is ``fold_in(PRNGKey(0), i)``.
"""

import json
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

PA = dict(model="prompt_attention", d=64, n=20, T=8, steps=40, lr=0.05, signal_norm=8.0,
          n_test=200, record_every=10)
SH = dict(model="single_head", T=2, n=16, d=80, label_mode="iid", label_noise="bernoulli",
          noise_ratio=0.15, signal_norm=6.0, lr=0.2, steps=30, n_test=200, record_every=10)
CASES = {
    "pa_direct": dict(PA, engine="direct"),
    "pa_gram": dict(PA, engine="gram"),
    "pa_reduced": dict(PA, engine="reduced"),
    "pa_W_direct": dict(PA, engine="direct", train=("p", "W")),
    "pa_randW_direct": dict(PA, engine="direct", W_init="random", init="gaussian",
                            init_scale=0.1, test_mode="sampled"),
    "pa_randW_gram": dict(PA, engine="gram", W_init="random", init="gaussian", init_scale=0.1,
                          test_mode="sampled"),
    "sh_direct": dict(SH, engine="direct"),
    "sh_gram": dict(SH, engine="gram"),
    "sh_reduced": dict(SH, engine="reduced"),
    "sh_wd_direct": dict(SH, engine="direct", weight_decay=0.05, init="gaussian",
                         init_scale=0.05),
    "sh_wd_gram": dict(SH, engine="gram", weight_decay=0.05, init="gaussian", init_scale=0.05),
    "sh_wd_reduced": dict(SH, engine="reduced", weight_decay=0.05, init="gaussian",
                          init_scale=0.05),
    "sh_project_direct": dict(SH, engine="direct", project=True, radius_v=1.5, radius_p=0.8),
    "sa_direct": dict(SH, model="self_attention", d=40, engine="direct"),
    "ml_direct": dict(SH, model="multi_layer", d=24, n_layers=3, test_mode="sampled",
                      n_test=60, engine="direct"),
    "enc_direct": dict(model="encoder", d=16, n=12, T=4, signal_norm=6.0, lr=0.05, steps=6,
                       n_test=30, mlp_width=8, test_mode="sampled", record_every=3,
                       engine="direct"),
    "cq_direct": dict(model="constructed_query", d=200, n=20, T=8, signal_norm=10.0,
                      n_test=40, test_mode="sampled", query_lambda=0.3, engine="direct"),
}
SEEDS = (0, 1, 2)
DTYPES = ("float32", "float64")


OUT = Path(__file__).with_name("reference_runs.npz")


def main(out=OUT):
    import phasebo

    arrays, meta = {}, {}
    for name, settings in CASES.items():
        for dtype in DTYPES:
            for i in SEEDS:
                o = phasebo.run_one(dict(settings, dtype=dtype), run_id=i)
                tag = f"{name}/{dtype}/{i}"
                for part in ("final", "dynamics", "samples"):
                    for k, v in getattr(o, part).items():
                        arrays[f"{tag}/{part}/{k}"] = np.asarray(v)
        meta[name] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.items()}
    np.savez_compressed(out, **arrays)
    out.with_suffix(".json").write_text(json.dumps(
        {"cases": meta, "seeds": SEEDS, "dtypes": DTYPES,
         "key": "fold_in(PRNGKey(0), seed index)", "generated_at_commit": "5939f9b"}, indent=1))
    print(f"wrote {len(arrays)} arrays to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
