"""invariants"""
