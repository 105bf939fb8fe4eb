"""Token corpora on disk: the prepared format (`format`, numpy only), which `study.data` reads
for training. The preparer that writes it is offline tooling: sweep.prepare (`sweep data prepare`)."""

__all__: list[str] = []
