"""ledgerstore.meta."""
