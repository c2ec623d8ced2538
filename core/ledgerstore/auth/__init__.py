"""Who a user is: the credential store shared by the admin HTTP server and the protocol handlers
(:mod:`ledgerstore.auth.credentials`) and the server side of SCRAM (:mod:`ledgerstore.auth.scram`).

Public on purpose: plugins that authenticate users (the Kafka listener's SASL) import it."""

from __future__ import annotations

from ledgerstore.auth.credentials import MECHANISMS, CredentialStore, ScramCredential
from ledgerstore.auth.scram import ScramServer, parse_plain

__all__ = ["MECHANISMS", "CredentialStore", "ScramCredential", "ScramServer", "parse_plain"]
