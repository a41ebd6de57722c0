"""Shared test helpers: `builders` (data on disk), `launchers` (real processes and what they leave), `readme`
(commands in the READMEs)."""
