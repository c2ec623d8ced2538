"""Opening a ledger that has a password: giving none is told apart from giving a wrong one."""

from __future__ import annotations

import pytest

import ledgerstore
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import UnauthorizedAccessError


def test_open_ledger_without_a_password_says_none_was_given_not_that_it_was_wrong(
        shared_cluster: LocalCluster) -> None:
    with ledgerstore.Client(metadata=shared_cluster.metadata) as client:
        lh = client.create_ledger(3, 2, 2, password=b"s3cret")
        lh.append(b"x")
        lh.close()
        with pytest.raises(UnauthorizedAccessError, match=f"ledger {lh.ledger_id} has a password and none was given"):
            client.open_ledger(lh.ledger_id)
        with pytest.raises(UnauthorizedAccessError, match=f"wrong password for ledger {lh.ledger_id}"):
            client.open_ledger(lh.ledger_id, password=b"guess")
        assert [e.payload for e in client.open_ledger(lh.ledger_id, password=b"s3cret").read(0, 0)] == [b"x"]
        # a ledger created without a password opens without one
        bare = client.create_ledger(3, 2, 2)
        bare.close()
        client.open_ledger(bare.ledger_id)
