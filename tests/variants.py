"""The grid axes the study tests parametrise over, in one place."""

L = 4  # blocks in the test models
NORM_NAMES = ["layernorm", "rmsnorm", "rmsnorm_scalar"]
ROTATIONS = {
    "none": "none",
    "shared": "shared",
    "independent": "independent",
    "partial1": {"mode": "partial", "group_size": 1},
    "partial2": {"mode": "partial", "group_size": 2},
    "partialL": {"mode": "partial", "group_size": L},
    "groups": {"mode": "groups", "groups": [[0, 2], [3]]},
}
