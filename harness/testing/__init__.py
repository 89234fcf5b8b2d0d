"""Test doubles the tests and scripts/gpu_check.py share: an oracle drafter that knows the target's
continuation (oracle), random-initialised drafters of every built-in method (random_drafters), and
hub-format target folders and drafter checkpoints in the released layouts (hub_layouts,
official_states). Here rather than under tests/, so a script runs from the code folders alone; on
the level of harness/runs (a method is reached through methods/registry.py).
"""
