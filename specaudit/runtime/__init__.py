"""The instrumented reference runtime: proposer, verifier and metrics, and the loop."""
