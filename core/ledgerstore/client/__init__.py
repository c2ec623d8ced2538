"""ledgerstore.client."""
