from collections import deque

from ledgerstore.client.adds import PendingAdd as PendingAdd
from ledgerstore.latency import LatencyHistogram

def pop_acknowledged(q: deque[PendingAdd], ack_quorum: int, hist: LatencyHistogram) -> int: ...
