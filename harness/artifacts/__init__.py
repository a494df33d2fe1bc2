"""What every artifact carries and how it is read back: provenance, results tables, plots, docs tables."""
