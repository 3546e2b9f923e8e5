"""Shared test machinery: the host-device guard and the legacy-pmap comparison helper."""
