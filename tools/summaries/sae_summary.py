"""Summary of a sweep's sae table (issue 21): per (model optimiser, layer, SAE optimiser, basis) means over
seeds, and stored minus random basis paired by trial with 95% t-intervals.
Usage: python tools/summaries/sae_summary.py RESULTS/SWEEP"""
import polars as pl, sys
from scipy import stats
pl.Config.set_tbl_cols(30); pl.Config.set_tbl_width_chars(250); pl.Config.set_tbl_rows(60)
path = sys.argv[1].rstrip('/')
s=pl.read_parquet(f'{path}/sae/*.parquet')
r=pl.read_parquet(f'{path}/runs/*.parquet').select('trial_id','optimizer','seed')
s=s.join(r,on='trial_id').with_columns(dk_excess=pl.col('decoder_kurtosis')-pl.col('decoder_kurtosis_null'))
print(s.group_by('optimizer','layer','sae_optimizer','basis').agg(pl.len().alias('n'), pl.col('fve').mean().round(3), pl.col('dead_fraction').mean().round(3).alias('dead'), pl.col('loss_recovered').mean().round(3).alias('loss_rec'), pl.col('dk_excess').mean().round(3), pl.col('dk_excess').std().round(3).alias('dk_sd'), pl.col('decoder_max_share').mean().round(4).alias('maxshare'), pl.col('agreement').mean().round(3).alias('agree')).sort('optimizer','layer','sae_optimizer','basis'))
# paired stored - random per trial: t-interval over seeds
w=s.pivot(on='basis', index=['optimizer','seed','layer','sae_optimizer'], values=['dk_excess','fve','dead_fraction'])
w=w.with_columns(d_dk=pl.col('dk_excess_stored')-pl.col('dk_excess_random'), d_fve=pl.col('fve_stored')-pl.col('fve_random'), d_dead=pl.col('dead_fraction_stored')-pl.col('dead_fraction_random'))
rows=[]
for key, g in w.group_by('optimizer','layer','sae_optimizer'):
    out=dict(zip(['optimizer','layer','sae_optimizer'],key))
    for c in ('d_dk','d_fve','d_dead'):
        v=g[c].to_numpy(); m=v.mean(); h=stats.t.ppf(0.975,len(v)-1)*v.std(ddof=1)/len(v)**0.5
        out[c]=f'{m:+.3f} ± {h:.3f}'
    rows.append(out)
print(pl.DataFrame(rows).sort('optimizer','layer','sae_optimizer'))
