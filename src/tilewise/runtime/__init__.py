"""How kernels reach the GPU (cuda.py) and what the GPU can do (device.py)."""
