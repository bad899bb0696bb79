"""Tasks: prompt sources with verifiable rewards."""
