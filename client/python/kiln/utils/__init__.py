"""kiln.utils: kiln.utils.data (datasets, samplers, DataLoader)."""
