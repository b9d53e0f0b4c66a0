"""Tracing engines someone else wrote through the public tracer API (no forks).

    transformers.py   Hugging Face transformers' assisted generation
"""
