"""Linear methods for quantized checkpoints (the dense float32 method is in layers/linear.py)."""
