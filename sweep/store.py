"""The results store's writer, lock and layout, re-exported: they live in resultstore/
(writer.py, lock.py, layout.py), the bottom layer that sweep writes through."""

from resultstore.layout import FINAL_WEIGHTS, STORE_FOLDERS, DamagedFile, writes_into_a_sweep  # noqa: F401
from resultstore.lock import LockHeld, SweepLock, pid_alive  # noqa: F401
from resultstore.writer import ResultsStore, StoreSink, StoreStatus  # noqa: F401
