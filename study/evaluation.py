"""One eval of a trial: the probe on the eval batch, and the rows it logs (curves for the steps
since the last eval, metrics, and at some evals quantisation and outlier-dimension rows), read
back from the device at once."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from resultstore.vocabulary import Basis, Metric, Site
from study.attribution import Attribution
from study.config import TrialConfig
from study.metrics import ActivationProbe
from study.model import Transformer
from study.quant import quant_rows, quantised_delta_se, quantised_losses
from study.schedule import lr_at

__all__ = ["Evaluation", "evaluate"]


@dataclass(frozen=True)
class Evaluation:
    """What one eval measured: the rows for the sink and the numbers the loop carries on."""

    val_loss: float
    train_loss: float
    """The last step's training loss; nan at the initial eval (no step before it)."""
    finite: bool
    """The val loss and every training loss since the previous eval are finite."""
    rows: dict[str, list[dict]]
    """Rows by table: curves, metrics and dims (study.attribution's outlier dimensions, at the
    final and every attribution_every-th eval; [] at the others)."""
    progress: dict


def evaluate(cfg: TrialConfig, model: Transformer, probe: ActivationProbe, batch: tuple[torch.Tensor, torch.Tensor],
             history: tuple[torch.Tensor, torch.Tensor], *, since: int, at: int, seconds: float,
             autocast: torch.autocast, attribution: Attribution | None = None) -> Evaluation:
    """Probe the model at step `at` and log the steps (since, at] whose losses and grad norms
    `history` holds (per step, on the device), over `seconds` of training: one host readback."""
    (x_eval, y_eval), (losses, grad_norms) = batch, history
    total, tps, k = cfg.total_steps, cfg.tokens_per_step, cfg.train.quant_every
    new = range(since + 1, at + 1)
    quant = at == total or (k > 0 and at % (k * cfg.train.eval_every) == 0)
    a = cfg.train.attribution_every
    attribute = attribution is not None and (at == total or (a > 0 and at % (a * cfg.train.eval_every) == 0))
    with autocast:  # quantised losses and attribution first, so they ride in the probe's one readback
        q = (quantised_losses(model, x_eval, y_eval), quantised_delta_se(model, x_eval, y_eval)) if quant else ()
        dims = attribution.measure(x_eval, y_eval) if attribute else None
        result = probe.run(x_eval, y_eval, extra=(losses[new.start : new.stop], grad_norms[new.start : new.stop], *q,
                                                  *((dims.values,) if dims else ())))
    train_hist, gn_hist, *q_hist = result.extra[: 2 + len(q)]
    val_loss = result.val_loss
    tokens_per_s = len(new) * tps / seconds if len(new) and seconds > 0 else 0.0
    curves = [
        {"step": s, "tokens": s * tps, "train_loss": l, "val_loss": None, "lr": lr_at(cfg, s - 1),
         "grad_norm": g, "tokens_per_s": tokens_per_s}
        for s, l, g in zip(new, train_hist, gn_hist)
    ]
    if curves:
        curves[-1]["val_loss"] = val_loss
    else:  # the initial eval: a curve point with only the val loss
        curves = [{"step": at, "tokens": at * tps, "train_loss": None, "val_loss": val_loss,
                   "lr": lr_at(cfg, at), "grad_norm": None, "tokens_per_s": None}]
    model_rows = result.rows + (quant_rows(q_hist[0], val_loss, standard_errors=q_hist[1]) if q_hist else [])
    train_loss = train_hist[-1] if train_hist else float("nan")
    resid = [r["value"] for r in result.rows
             if (r["site"], r["basis"], r["metric"]) == (Site.RESID, Basis.STORED, Metric.KURTOSIS) and r["value"] is not None]
    return Evaluation(
        val_loss=val_loss, train_loss=train_loss,
        finite=all(math.isfinite(v) for v in train_hist + [val_loss]),
        rows={
            "curves": curves,
            "metrics": [{"step": at, "tokens": at * tps, **r} for r in model_rows],
            "dims": [{"step": at, "tokens": at * tps, **r} for r in dims.rows(result.extra[-1])] if dims else [],
        },
        progress={"step": at, "total_steps": total, "train_loss": train_loss, "val_loss": val_loss,
                  "resid_kurtosis_mean": sum(resid) / max(1, len(resid)), "tokens_per_s": tokens_per_s},
    )
