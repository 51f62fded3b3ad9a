"""Stores: hot tier (local ledger store), cold tier (object stores) and the metadata store."""
