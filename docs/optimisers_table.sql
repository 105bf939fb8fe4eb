SELECT optimizer, optimizer_family AS family, norm, d_model, lr, round(final_val_loss, 3) AS val_loss,
  round(avg(CASE WHEN metric = 'kurtosis' AND site = 'resid' AND basis = 'stored' AND layer > 0 THEN value END), 2) AS resid,
  round(avg(CASE WHEN metric = 'kurtosis' AND site = 'resid' AND basis = 'random' AND layer > 0 THEN value END), 2) AS control,
  round(avg(CASE WHEN metric = 'kurtosis' AND site = 'mlp_in' AND basis = 'computation' THEN value END), 2) AS mlp_in,
  round(max(CASE WHEN metric = 'quant_loss_delta' AND basis = 'w8a8' THEN value END), 4) AS w8a8,
  round(max(CASE WHEN metric = 'quant_loss_delta' AND basis = 'w4a4' THEN value END), 3) AS w4a4
FROM metrics JOIN runs USING (trial_id)
WHERE step = steps AND status = 'done'
GROUP BY optimizer, optimizer_family, norm, d_model, lr, final_val_loss
ORDER BY family, optimizer, norm, d_model, lr
