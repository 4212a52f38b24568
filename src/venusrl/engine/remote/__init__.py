"""Engines in their own processes: the engine process (process.py), the client that speaks to one (remote.py), and the framed protocol between them (wire.py)."""
