"""ledgerstore.bookie."""
