"""Planning: which ledgers to offload, when hot copies may go, retention."""
