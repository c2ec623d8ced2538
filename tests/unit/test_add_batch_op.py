"""One ADD_BATCH frame's op (``ledgerstore.client.add_batch``) without bookies: what each kind of
answer counts and what it tells the writer to do, on the compiled pending adds and the
pure-Python ones."""

from __future__ import annotations

from typing import Any

import pytest

from ledgerstore.client import adds
from ledgerstore.client.add_batch import ACKED, IGNORED, AddBatchOp, AddGroup
from ledgerstore.errors import BookieUnavailableError
from ledgerstore.proto.codec import AddBatchResponse, Status

pytestmark = pytest.mark.usefixtures("hot_path")

ENSEMBLE = ["b0", "b1", "b2"]


def sent(n: int, group: AddGroup | None = None, ensemble: list[str] = ENSEMBLE) -> list[Any]:
    """``n`` adds sent to ``ensemble`` (entry ids 0..n-1), in ``group`` if given."""
    new, _ = adds.implementation()
    pas = [new(e, b"item%d" % e, None, 0b111) for e in range(n)]
    for pa in pas:
        pa.ensemble = ensemble
        pa.group = group
    return pas


def all_ok(count: int) -> AddBatchResponse:
    return AddBatchResponse(1, Status.OK, 7, (), count, True)


def per_entry(*statuses: int) -> AddBatchResponse:
    return AddBatchResponse(1, Status.OK, 7, tuple(enumerate(statuses)), len(statuses))


def test_an_all_ok_answer_to_a_group_sets_the_groups_bit_without_touching_its_entries() -> None:
    group = AddGroup(ENSEMBLE)
    pas = sent(3, group)
    heard: list[tuple[int, str]] = []
    outcome = AddBatchOp(pas, 1, "b1", group).on_response(all_ok(3), None, lambda e, b: heard.append((e, b)))
    assert outcome is ACKED
    assert group.acked == 0b010 and [pa.acked for pa in pas] == [0, 0, 0]
    assert heard == [(0, "b1"), (1, "b1"), (2, "b1")]


def test_an_answer_from_a_bookie_replaced_since_the_frame_left_counts_for_nothing() -> None:
    group = AddGroup(ENSEMBLE)
    group.stale = 0b010
    pas = sent(2, group)
    assert AddBatchOp(pas, 1, "b1", group).on_response(all_ok(2), None, None) is IGNORED
    assert group.acked == 0


def test_an_all_ok_answer_to_a_resend_counts_per_entry_and_skips_entries_moved_to_another_bookie() -> None:
    pas = sent(3)
    pas[1].ensemble = ["b0", "b3", "b2"]  # entry 1 went to b3 since
    pas[2].done = True  # entry 2 was acknowledged meanwhile
    assert AddBatchOp(pas, 1, "b1", None).on_response(all_ok(3), None, None) is ACKED
    assert [pa.acked for pa in pas] == [0b010, 0, 0]


def test_a_per_entry_answer_counts_the_stored_resends_the_throttled_and_reports_the_refused() -> None:
    pas = sent(4)
    pas[3].ensemble = ["b0", "b1", "b3"]  # answered by a bookie replaced since: ignored
    answer = per_entry(Status.OK, Status.TOO_MANY_REQUESTS, Status.IO_ERROR, Status.IO_ERROR)
    outcome = AddBatchOp(pas, 2, "b2", None).on_response(answer, None, None)
    assert outcome.completed
    assert [pa.acked for pa in pas] == [0b100, 0, 0, 0]
    assert list(outcome.throttled) == [pas[1]]
    assert list(outcome.failed) == [(pas[2], Status.IO_ERROR)] and outcome.error is None


def test_no_answer_fails_every_entry_still_waiting_for_that_bookie_with_the_error() -> None:
    pas = sent(3)
    pas[0].done = True
    lost = BookieUnavailableError("connection to b0 lost")
    outcome = AddBatchOp(pas, 0, "b0", None).on_response(None, lost, None)
    assert not outcome.completed and outcome.error is lost
    assert list(outcome.failed) == [(pas[1], None), (pas[2], None)]


def test_an_ok_answer_for_another_number_of_entries_is_a_bad_request_for_all_of_them() -> None:
    pas = sent(2)
    outcome = AddBatchOp(pas, 0, "b0", None).on_response(all_ok(5), None, None)
    assert not outcome.completed
    assert list(outcome.failed) == [(pas[0], Status.BAD_REQUEST), (pas[1], Status.BAD_REQUEST)]


def test_a_refused_frame_fails_its_entries_with_the_bookies_status() -> None:
    pas = sent(2)
    outcome = AddBatchOp(pas, 0, "b0", None).on_response(AddBatchResponse(1, Status.FENCED, 7), None, None)
    assert list(outcome.failed) == [(pas[0], Status.FENCED), (pas[1], Status.FENCED)]
