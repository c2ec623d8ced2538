"""Kafka's sequence rules for idempotent producers, as the partition applies them before a batch
reaches the log (``ledgerstore_kafka.producers``): pure, no cluster."""

from __future__ import annotations

import pytest

from ledgerstore_kafka.producers import (
    INVALID_PRODUCER_EPOCH,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    ProduceRefused,
    ProducerStates,
    Verdict,
)
from ledgerstore_kafka.records import BatchInfo


def batch(pid: int, epoch: int, base: int, count: int) -> BatchInfo:
    return BatchInfo(0, count - 1, 0, count, 0, pid, epoch, base)


def refused(states: ProducerStates, info: BatchInfo) -> int:
    with pytest.raises(ProduceRefused) as exc:
        states.check(info)
    return exc.value.error_code


def test_batches_in_sequence_are_appended_with_the_sequence_of_their_last_record() -> None:
    states = ProducerStates()
    assert states.check(batch(7, 0, 0, 5)) == Verdict("kafka:7:0", 4, False)
    assert states.check(batch(7, 0, 5, 3)) == Verdict("kafka:7:0", 7, False)


def test_a_retried_batch_is_a_duplicate_resolved_by_the_log_at_its_last_sequence() -> None:
    states = ProducerStates()
    states.check(batch(7, 0, 0, 5))
    states.check(batch(7, 0, 5, 3))
    assert states.check(batch(7, 0, 0, 5)) == Verdict("kafka:7:0", 4, True)
    assert states.check(batch(7, 0, 5, 3)) == Verdict("kafka:7:0", 7, True)
    assert states.check(batch(7, 0, 8, 1)) == Verdict("kafka:7:0", 8, False)  # and it goes on


def test_a_gap_or_a_batch_reaching_past_the_last_is_out_of_order() -> None:
    states = ProducerStates()
    states.check(batch(7, 0, 0, 5))
    assert refused(states, batch(7, 0, 6, 1)) == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert refused(states, batch(7, 0, 3, 5)) == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert states.check(batch(7, 0, 5, 1)).duplicate is False  # the refusals changed nothing


def test_an_older_epoch_is_fenced_and_a_newer_one_starts_at_zero_as_a_new_log_producer() -> None:
    states = ProducerStates()
    states.check(batch(7, 0, 0, 5))
    assert refused(states, batch(7, 1, 5, 1)) == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert states.check(batch(7, 1, 0, 2)) == Verdict("kafka:7:1", 1, False)
    assert refused(states, batch(7, 0, 5, 1)) == INVALID_PRODUCER_EPOCH


def test_an_unknown_producer_is_accepted_at_any_sequence_and_a_restored_one_continues() -> None:
    states = ProducerStates()
    assert states.check(batch(9, 3, 40, 2)) == Verdict("kafka:9:3", 41, False)
    states.restore(11, 2, 99)  # as the log holds it after a restart
    assert states.check(batch(11, 2, 100, 1)) == Verdict("kafka:11:2", 100, False)
    assert states.check(batch(11, 2, 99, 1)) == Verdict("kafka:11:2", 99, True)
    states.restore(12, 0, None)  # nothing stored with a sequence: no state
    assert len(states) == 2


def test_sequences_wrap_after_int32_max_and_the_log_sequence_keeps_growing() -> None:
    states = ProducerStates()
    top = (1 << 31) - 1
    states.check(batch(7, 0, top - 1, 2))  # last record at 2**31 - 1
    assert states.check(batch(7, 0, 0, 3)) == Verdict("kafka:7:0", top + 3, False)
    assert states.check(batch(7, 0, 0, 3)) == Verdict("kafka:7:0", top + 3, True)
    assert states.check(batch(7, 0, top - 1, 2)) == Verdict("kafka:7:0", top, True)
