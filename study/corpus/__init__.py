"""Token corpora on disk: the prepared format (`format`) and the preparer that writes it
(`prepare`, the `sweep data prepare` command). `study.data` reads corpora for training."""

__all__: list[str] = []
