"""Test support code (not tests): servers and helpers shared by several test modules."""
