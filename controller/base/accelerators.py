"""The accelerators a layer's compute time is reckoned on: a peak from the data sheet and
one efficiency, set once against one published training measurement.

A layer's time is its FLOPs over peak x efficiency (controller/base/ddp.py). Each
efficiency is fitted to a single published ResNet-50 training throughput with the FLOPs
of ResNet-50's own layer table (forward and backward of one image, 24.30 GFLOP), and to
nothing else; every other model then follows from its table. One efficiency per device is
coarse (a Transformer's large matrix products run nearer peak than a CNN's convolutions:
Megatron-LM sustains 52% of an A100, Narayanan et al. SC'21), and the docs say so where a
figure rests on it (docs/model.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from oddl.controller.base.layers import layer_table


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_tflops: float  # dense FP16/BF16 tensor peak
    peak_source: str
    resnet50_images_s: float  # one device, mixed precision, training
    measured_source: str

    @functools.cached_property
    def efficiency(self) -> float:
        """The sustained share of peak that makes ResNet-50 train at the measured rate."""
        t = layer_table("resnet50")
        flops = t.fwd_flops + t.bwd_flops
        return self.resnet50_images_s * flops / (self.peak_tflops * 1e12)

    @property
    def flops_per_s(self) -> float:
        return self.peak_tflops * 1e12 * self.efficiency


ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in (
    Accelerator("a100", 312.0, "NVIDIA A100 Tensor Core GPU data sheet: 312 TFLOPS FP16/BF16 "
                "tensor, dense", 2470.0,
                "NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5, DGX A100 80GB, 1 GPU, "
                "mixed precision, 2,470 img/s (pytorch-21.03 NGC container)"),
    Accelerator("v100", 125.0, "NVIDIA V100 data sheet (SXM2): 125 TFLOPS tensor", 1200.0,
                "NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5, DGX-1 16GB, 1 GPU, "
                "mixed precision, 1,200 img/s (pytorch-21.03 NGC container)"),
    Accelerator("ascend910", 256.0, "Huawei Ascend 910 (Liao et al., HPCA 2021): 256 "
                "TFLOPS FP16", 1802.0,
                "Huawei's Ascend 910 launch (23 Aug 2019): ResNet-50 training with MindSpore, "
                "1,802 img/s (a vendor's figure)"),
)}
DEVICES = tuple(ACCELERATORS)
