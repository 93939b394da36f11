"""Faithful stand-ins for services this machine cannot reach (real processes, real protocols)."""
