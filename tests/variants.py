"""The grid axes the study tests parametrise over, in one place."""

L = 4  # blocks in the test models
NORM_NAMES = ["layernorm", "rmsnorm", "rmsnorm_scalar"]
ATTENTION_NAMES = ["softmax", "softmax1", "gated", "clipped", "kv_bias"]  # study.attention
ROTATIONS = {
    "none": "none",
    "shared": "shared",
    "independent": "independent",
    "partial1": {"mode": "partial", "group_size": 1},
    "partial2": {"mode": "partial", "group_size": 2},
    "partialL": {"mode": "partial", "group_size": L},
    "groups": {"mode": "groups", "groups": [[0, 2], [3]]},
}
OPTIMIZERS = {  # every optimiser, at an lr that trains the tiny test models
    "adam": {"name": "adam", "lr": 3e-3},
    "sgd": {"name": "sgd", "lr": 0.1},
    "rotated_adam": {"name": "rotated_adam", "lr": 3e-3},
    "soap": {"name": "soap", "lr": 3e-3, "precondition_frequency": 2},
    "muon": {"name": "muon", "lr": 3e-3},
    "adafactor": {"name": "adafactor", "lr": 1e-2},
    "lion": {"name": "lion", "lr": 3e-4, "betas": [0.9, 0.99]},
    "signsgd": {"name": "signsgd", "lr": 3e-4},
    "rotated_adafactor": {"name": "rotated_adafactor", "lr": 3e-2},
    "rotated_lion": {"name": "rotated_lion", "lr": 3e-4, "betas": [0.9, 0.99]},
    "rotated_signsgd": {"name": "rotated_signsgd", "lr": 3e-4},
}
