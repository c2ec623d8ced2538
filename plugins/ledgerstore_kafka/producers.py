"""Kafka's idempotent producers on a partition: the sequence rules, mapped to the log's own
exactly-once appends.

An idempotent Kafka producer has a producer id (from InitProducerId), an epoch, and numbers its
records per partition from 0; each batch carries its base sequence and record count. On the log,
the pair ``(producer id, epoch)`` is one log producer, :func:`log_producer` (``kafka:<id>:<epoch>``:
a new epoch starts its sequences at 0, as a new log producer does), and each batch, one entry, is
appended with the sequence of its **last** record. So a retried batch carries a sequence the log
already holds and the log writes nothing and answers the position of the original, which the
partition turns into the original's base offset: a retry is answered as a success with the
original offset, as Kafka answers it. The log's dedup state outlives the broker (it is rebuilt
from the log by the next writer), so this holds across a broker crash and a takeover.

Kafka's sequences are int32 and wrap to 0 after 2**31 - 1; the log's are 64-bit and only grow,
so a producer's log sequence counts the wraps: ``wraps * 2**31 + kafka sequence``.

The rules (Kafka's ``ProducerAppendInfo``), for a batch of producer ``p``, epoch ``e``:

- ``p`` unknown to the partition: accepted whatever its sequence (Kafka's rule for a producer whose
  state is gone);
- ``e`` below the newest epoch seen for ``p``: ``INVALID_PRODUCER_EPOCH`` (the producer was fenced);
- ``e`` above it: its base sequence must be 0, else ``OUT_OF_ORDER_SEQUENCE_NUMBER``;
- the same epoch: the base sequence must follow the last one handed to the log; a batch lying
  wholly at or below it is a retry (:data:`Verdict.duplicate`), resolved by the log; anything
  else (a gap, or a batch reaching past the last with a front already sent) is
  ``OUT_OF_ORDER_SEQUENCE_NUMBER``. A retry that matches no stored batch exactly (other
  boundaries) is ``DUPLICATE_SEQUENCE_NUMBER``: the partition decides that once the log answered.
"""

from __future__ import annotations

import dataclasses

from ledgerstore.errors import LedgerStoreError
from ledgerstore_kafka.records import BatchInfo

__all__ = ["ProduceRefused", "ProducerStates", "Verdict", "log_producer"]

#: Kafka's error codes for idempotent produce
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46
INVALID_PRODUCER_EPOCH = 47
INVALID_RECORD = 87

_WRAP = 1 << 31  # Kafka's sequences are int32: after 2**31 - 1 comes 0


class ProduceRefused(LedgerStoreError):
    """A batch the partition refuses; ``error_code`` is Kafka's answer for it."""

    def __init__(self, message: str, error_code: int) -> None:
        super().__init__(message)
        self.error_code = error_code


def log_producer(producer_id: int, epoch: int) -> str:
    """The log producer of a Kafka producer id at an epoch."""
    return f"kafka:{producer_id}:{epoch}"


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """Where a batch goes: appended (or, with ``duplicate``, resolved) as ``seq`` of ``producer``."""

    producer: str
    seq: int
    duplicate: bool


@dataclasses.dataclass(slots=True)
class _State:
    epoch: int
    last: int  # the log sequence of the last record handed to the log (stored or in flight)


class ProducerStates:
    """The newest epoch and last sequence of each idempotent producer of one partition."""

    def __init__(self) -> None:
        self._states: dict[int, _State] = {}

    def __len__(self) -> int:
        return len(self._states)

    def restore(self, producer_id: int, epoch: int, last_seq: int | None) -> None:
        """Set ``producer_id``'s state as the log holds it (on open: the newest epoch in the
        batches, and the log's highest sequence of that producer; ``None``: no state)."""
        if last_seq is not None:
            self._states[producer_id] = _State(epoch, last_seq)

    def check(self, info: BatchInfo) -> Verdict:
        """Decide a batch of an idempotent producer (``info.producer_id >= 0``) and note it as sent;
        :class:`ProduceRefused` with Kafka's code when it breaks the rules above."""
        pid, epoch, base, count = info.producer_id, info.producer_epoch, info.base_sequence, info.record_count
        if epoch < 0 or base < 0 or count <= 0:
            raise ProduceRefused(f"an idempotent batch of producer {pid} with epoch {epoch}, base sequence {base} "
                                 f"and {count} records", INVALID_RECORD)
        state = self._states.get(pid)
        if state is None or epoch > state.epoch:
            if state is not None and base != 0:
                raise ProduceRefused(f"producer {pid} starts epoch {epoch} at sequence {base}, not 0",
                                     OUT_OF_ORDER_SEQUENCE_NUMBER)
            self._states[pid] = _State(epoch, base + count - 1)
            return Verdict(log_producer(pid, epoch), base + count - 1, False)
        if epoch < state.epoch:
            raise ProduceRefused(f"producer {pid} sent epoch {epoch}, but epoch {state.epoch} fenced it",
                                 INVALID_PRODUCER_EPOCH)
        if base == (state.last + 1) % _WRAP:
            first = state.last + 1
            state.last = first + count - 1
            return Verdict(log_producer(pid, epoch), state.last, False)
        first = state.last - (state.last - base) % _WRAP  # the latest log sequence with this Kafka one
        if first >= 0 and first + count - 1 <= state.last:
            return Verdict(log_producer(pid, epoch), first + count - 1, True)
        raise ProduceRefused(f"producer {pid} epoch {epoch} sent sequence {base} after {state.last % _WRAP}",
                             OUT_OF_ORDER_SEQUENCE_NUMBER)
