"""Summary of the dims table of results/outlier_dims (issue 20): ablation p-values against chance,
persistence of the top-k sets (consecutive layers, last layer, seeds, evals) against chance k^2/d."""
import itertools, sys
import numpy as np, polars as pl
root = sys.argv[1]  # RESULTS/SWEEP, e.g. results/outlier_dims
d = pl.read_parquet(f'{root}/dims/*.parquet')
r = pl.read_parquet(f'{root}/runs/*.parquet').select('trial_id', 'optimizer', 'seed', 'steps', 'd_model')
d = d.join(r, on='trial_id')
fin = d.filter(pl.col('step') == pl.col('steps'))
abl = fin.filter(pl.col('layer') == -1, pl.col('role') == 'top')
print('ablation at every layer (final step), top candidates: share with p <= 1/17 (chance 0.059), median and max delta')
print(abl.group_by('optimizer').agg(pl.len().alias('n'), (pl.col('zero_p') <= 1/17 + 1e-9).mean().round(3).alias('zero_p<=1/17'),
      (pl.col('mean_p') <= 1/17 + 1e-9).mean().round(3).alias('mean_p<=1/17'), pl.col('zero_delta').median().round(4).alias('zero_med'),
      pl.col('zero_delta').max().round(3).alias('zero_max'), pl.col('mean_delta').median().round(4).alias('mean_med')).sort('optimizer'))
nul = fin.filter(pl.col('layer') == -1, pl.col('role') == 'null')
print('null draws: median / max zero delta'); print(nul.group_by('optimizer').agg(pl.len().alias('n'), pl.col('zero_delta').median().round(4).alias('med'), pl.col('zero_delta').max().round(3).alias('max')).sort('optimizer'))
top = fin.filter(pl.col('site') == 'resid', pl.col('basis') == 'stored', pl.col('role') == 'top', pl.col('rank_max').is_not_null(), pl.col('layer') >= 1)
def sets(frame):
    return {k: set(g['dim'].to_list()) for k, g in frame.group_by('optimizer', 'seed', 'layer')}
S = sets(top)
rows = []
for opt in sorted({k[0] for k in S}):
    seeds = sorted({k[1] for k in S if k[0] == opt}); layers = sorted({k[2] for k in S if k[0] == opt})
    cons = [len(S[opt, s, l] & S[opt, s, l + 1]) / len(S[opt, s, l]) for s in seeds for l in layers[:-1]]
    last = [len(S[opt, s, l] & S[opt, s, layers[-1]]) / len(S[opt, s, l]) for s in seeds for l in layers[:-1]]
    cross = [len(S[opt, a, l] & S[opt, b, l]) / len(S[opt, a, l]) for a, b in itertools.combinations(seeds, 2) for l in layers]
    k = np.mean([len(S[opt, s, l]) for s in seeds for l in layers])
    rows.append(dict(optimizer=opt, k=round(k, 1), chance=round(k / 128, 3), consecutive=round(np.mean(cons), 3), with_last=round(np.mean(last), 3), across_seeds=round(np.mean(cross), 3)))
print('top-k (by max |x|) overlap, resid stored, final step: share of a set found in the other'); print(pl.DataFrame(rows))
ev = d.filter(pl.col('site') == 'resid', pl.col('basis') == 'stored', pl.col('role') == 'top', pl.col('rank_max').is_not_null(), pl.col('layer') >= 1)
E = {k: set(g['dim'].to_list()) for k, g in ev.group_by('optimizer', 'seed', 'layer', 'step')}
rows = []
for opt in sorted({k[0] for k in E}):
    vals = []
    for (o, s, l, st) in E:
        if o == opt and st > 0 and (o, s, l, st + 300) in E:
            vals.append(len(E[o, s, l, st] & E[o, s, l, st + 300]) / len(E[o, s, l, st]))
    rows.append(dict(optimizer=opt, across_evals_300_steps=round(np.mean(vals), 3), n=len(vals)))
print(pl.DataFrame(rows))
lastl = top.filter(pl.col('layer') == pl.col('layer').max())
print('top-1 by max at the last layer: Sun ratio, pos0 share, delimiter share, r(freq) (mean over seeds)')
print(lastl.filter(pl.col('rank_max') == 1).group_by('optimizer').agg(pl.col('sun_ratio').mean().round(2), pl.col('max_median').mean().round(1), pl.col('pos0_share').mean().round(2), pl.col('delimiter_share').mean().round(2), pl.col('freq_corr').mean().round(2), pl.col('gain_ratio').mean().round(2)).sort('optimizer'))
