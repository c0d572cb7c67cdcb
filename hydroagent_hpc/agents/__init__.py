"""Policies that calibrate: one protocol (given the conversation so far, the next message)."""
