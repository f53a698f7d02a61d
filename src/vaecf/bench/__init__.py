"""Measuring speed: `vaecf bench` and the benchmarks' shared parts.

speed.py     training throughput (users/s, GFLOP/s, a step's breakdown) and inference
             latency on any shape or run; the synthetic data the benchmarks share
roofline.py  this machine's ceilings: a step's products at the CPU's best rate, bandwidth
hardware.py  the machine a figure was measured on, for every benchmark table's caption
"""
