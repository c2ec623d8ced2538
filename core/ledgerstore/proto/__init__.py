"""ledgerstore.proto."""
