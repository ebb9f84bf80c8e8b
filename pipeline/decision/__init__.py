"""The pre-registered decision: criteria, registration, test-access ledger, history, controls."""
