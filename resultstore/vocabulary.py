"""The names the tables hold as values, declared once: the sites, bases and metrics of the
metrics table (and the sites and bases of the dims and sae tables). study writes them, analysis
reads them; both import them from here.

The values are plain strings, equal to what kept stores hold: renaming one changes stored bytes
and breaks every store written before (add a name, never rename one). Each name has a one-line
meaning in SITES, BASES, METRICS or SINK_METRICS; the probe's definitions are in
study/metrics.py, study/sinks.py and study/quant.py, their science in docs/guide.md.
"""

from __future__ import annotations

__all__ = ["BASES", "METRICS", "NAMES", "PROBE_METRICS", "QUANT_SCHEMES", "RANK_P", "SINK_METRICS", "SITES", "Basis",
           "Metric", "Sink", "Site"]


class Site:
    """Where a row is measured (the ``site`` column)."""

    RESID = "resid"
    ATTN_IN = "attn_in"
    MLP_IN = "mlp_in"
    MLP_ACT = "mlp_act"
    ATTN = "attn"
    MODEL = "model"


class Basis:
    """Which basis (or reference, or quantisation scheme) a row reads (the ``basis`` column)."""

    STORED = "stored"
    RANDOM = "random"
    COMPUTATION = "computation"
    NEURON = "neuron"
    HEADS = "heads"
    UNIFORM = "uniform"
    W8A8 = "w8a8"
    W4A4 = "w4a4"


class Metric:
    """What a row measures (the ``metric`` column), the attention sinks' aside (``Sink``)."""

    KURTOSIS = "kurtosis"
    NEURON_KURTOSIS = "neuron_kurtosis"
    OUTLIER_DIMS_ABS = "outlier_dims_abs"
    OUTLIER_DIMS_REL = "outlier_dims_rel"
    MAX_ABS = "max_abs"
    MAX_MEDIAN_RATIO = "max_median_ratio"
    TOP1_SHARE = "top1_share"
    TOP4_SHARE = "top4_share"
    KURTOSIS_SD = "kurtosis_sd"
    KURTOSIS_MEDIAN = "kurtosis_median"
    KURTOSIS_RANK_P = "kurtosis_rank_p"
    TOP1_SHARE_RANK_P = "top1_share_rank_p"
    DETTMERS_OUTLIERS = "dettmers_outliers"
    QUANT_LOSS_DELTA = "quant_loss_delta"
    QUANT_LOSS_DELTA_SE = "quant_loss_delta_se"


class Sink:
    """The attention-sink metrics (site ``attn``, basis ``heads``; study/sinks.py)."""

    FIRST_MASS = "first_mass"
    DELIMITER_MASS = "delimiter_mass"
    NULL_MASS = "null_mass"
    SINK_HEADS = "sink_heads"


SITES: dict[str, str] = {
    Site.RESID: "the residual stream: layer 0 the embeddings, layer l the output of block l",
    Site.ATTN_IN: "block l's attention input: the output of its attention norm",
    Site.MLP_IN: "block l's MLP input: the output of its MLP norm",
    Site.MLP_ACT: "block l's MLP activations: the output of its nonlinearity",
    Site.ATTN: "block l's attention pattern (the sinks); layer -1 the uniform reference",
    Site.MODEL: "the whole model, layer -1 (Dettmers' outlier count, the quantisation penalty)",
}
"""Site -> its meaning."""

BASES: dict[str, str] = {
    Basis.STORED: "the basis the activations are stored in (the residual stream's own)",
    Basis.RANDOM: "the control: the same activations read in fixed Haar-random bases",
    Basis.COMPUTATION: "the basis the next linear map reads (a norm's output)",
    Basis.NEURON: "the MLP's neurons",
    Basis.HEADS: "attention weights per head (the sink metrics)",
    Basis.UNIFORM: "what uniform causal attention would read on the same tokens",
    Basis.W8A8: "simulated 8-bit weights and activations (site model)",
    Basis.W4A4: "simulated 4-bit weights and activations (site model)",
}
"""Basis -> its meaning."""

METRICS: dict[str, str] = {
    Metric.KURTOSIS: "per-token kurtosis across coordinates, averaged over tokens (Elhage et al.)",
    Metric.NEURON_KURTOSIS: "kurtosis of the coordinates' RMS scales across coordinates (He et al.)",
    Metric.OUTLIER_DIMS_ABS: "coordinates with |x| > 6 on some token",
    Metric.OUTLIER_DIMS_REL: "coordinates with |x| > 6 x the token's RMS on some token",
    Metric.MAX_ABS: "the largest |x| over tokens and coordinates",
    Metric.MAX_MEDIAN_RATIO: "max / median |x| per token, averaged over tokens",
    Metric.TOP1_SHARE: "the share of a token's centred energy in its largest coordinate",
    Metric.TOP4_SHARE: "the share of a token's centred energy in its 4 largest coordinates",
    Metric.KURTOSIS_SD: "the control's sd of the kurtosis across its random bases",
    Metric.KURTOSIS_MEDIAN: "the control's median of the kurtosis across its random bases",
    Metric.KURTOSIS_RANK_P: "the stored basis' kurtosis ranked among the random bases' (exact p)",
    Metric.TOP1_SHARE_RANK_P: "the stored basis' top-1 share ranked among the random bases' (exact p)",
    Metric.DETTMERS_OUTLIERS: "Dettmers et al.'s model-level outlier feature count",
    Metric.QUANT_LOSS_DELTA: "val loss under the quantisation scheme (the basis) minus the float val loss",
    Metric.QUANT_LOSS_DELTA_SE: "that penalty's standard error over the eval sequences",
}
"""Metric -> its meaning (the sink metrics are in SINK_METRICS)."""

SINK_METRICS: dict[str, str] = {
    Sink.FIRST_MASS: "attention mass on the first position",
    Sink.DELIMITER_MASS: "attention mass on delimiter tokens",
    Sink.NULL_MASS: "attention mass on no key of the sequence",
    Sink.SINK_HEADS: "the fraction of heads whose top key is a sink for most queries",
}
"""Sink metric -> its meaning, in the order the probe records them."""

PROBE_METRICS = (Metric.KURTOSIS, Metric.NEURON_KURTOSIS, Metric.OUTLIER_DIMS_ABS, Metric.OUTLIER_DIMS_REL,
                 Metric.MAX_ABS, Metric.MAX_MEDIAN_RATIO, Metric.TOP1_SHARE, Metric.TOP4_SHARE)
"""The metrics measured at every (layer, site, basis) the probe reads, in its order."""

RANK_P = {Metric.KURTOSIS: Metric.KURTOSIS_RANK_P, Metric.TOP1_SHARE: Metric.TOP1_SHARE_RANK_P}
"""A measure ranked against the control's bases -> the row holding its rank p-value."""

QUANT_SCHEMES = (Basis.W8A8, Basis.W4A4)
"""The simulated quantisation schemes (the basis of site model's quant_loss_delta rows)."""

NAMES = frozenset({*SITES, *BASES, *METRICS, *SINK_METRICS})
"""Every name above."""
