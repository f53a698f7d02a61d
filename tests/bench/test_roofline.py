"""The step's dense products and the machine's ceilings (vaecf/roofline.py), as `vaecf bench`
reports them: the shapes are the step's, the best layout is the fastest measured."""

from types import SimpleNamespace

import torch

from vaecf import models
from vaecf.bench import roofline


def test_the_step_shapes_are_each_layers_three_products():
    net = models.build("multvae", 50)  # [50 -> 600 -> 200 x 2] [200 -> 600 -> 50]
    shapes = {name: (m, k, n) for name, m, k, n in roofline.step_shapes(net, 8)}
    assert len(shapes) == 9
    assert shapes["encoder 1 forward"] == (8, 600, 400)
    assert shapes["encoder 1 weight grad"] == (400, 8, 600)
    assert shapes["output layer forward"] == (8, 600, 50)
    assert shapes["output layer input grad"] == (8, 50, 600)
    assert shapes["output layer weight grad"] == (50, 8, 600)
    flops = sum(2 * m * k * n for m, k, n in shapes.values())
    dense = sum(m.weight.numel() for m in [*net.encoder, *net.decoder])
    assert flops == 2 * 3 * dense * 8  # what bench.step_flops counts for the dense layers


def test_products_report_the_fastest_layout_and_the_ratio(monkeypatch):
    calls = []
    clock = [0.0]
    real_mm = torch.mm

    def slow_unless_nt(a, b):  # a CPU on which only one layout is fast, on a clock of its own
        calls.append(1)
        clock[0] += 1.0 if a.is_contiguous() and not b.is_contiguous() else 20.0
        return real_mm(a, b)

    monkeypatch.setattr(torch, "mm", slow_unless_nt)
    monkeypatch.setattr(roofline, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    ms, layout = roofline.best_product_ms(64, 128, 256, torch.float32)
    assert (layout, ms, len(calls)) == ("NT", 1000.0, 4 * 4)
    rows = [roofline.Product("p", 64, 128, 256, 2.0, "NT")]
    text = roofline.format_step(3.0, "fp32", 64, rows)
    assert "step / products 1.50 (goal <= 1.3: not met)" in text
    assert roofline.Product("p", 1000, 1000, 1000, 2.0, "NN").gflops == 1000.0


def test_read_bandwidth_and_layer_bytes():
    assert roofline.read_bandwidth(8 << 20, reps=2) > 1e8  # any machine reads 100 MB/s
    assert roofline.layer_bytes(torch.nn.Linear(10, 20)) == (200 + 20) * 4
    # the output layer of each autoencoder (a list of decoder layers, or one), none for EASE
    assert roofline.output_layer_bytes(models.build("multvae", 50)) == (600 * 50 + 50) * 4
    assert roofline.output_layer_bytes(models.build("recvae", 50)) == (200 * 50 + 50) * 4
    assert roofline.output_layer_bytes(models.build("ease", 50)) is None
