"""Helpers with no lit_ppo imports, used by every layer above."""
