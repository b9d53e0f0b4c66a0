"""specaudit: make the metrics of speculative decoding trustworthy."""
__version__ = "0.1.0"
