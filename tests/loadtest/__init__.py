"""Tests for the load generator and benchmarks."""
