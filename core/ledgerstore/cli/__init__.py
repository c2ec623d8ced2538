"""ledgerstore.cli."""
