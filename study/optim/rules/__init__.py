"""The optimisers' update rules that torch does not have (torch imported here; the registry
entries in study/optim/ import these modules only when they build an optimiser)."""


__all__: list[str] = []