"""Measured ceilings of this device: dense matmul FLOP/s per precision and copy bandwidth.

MFU in the rows is against the datasheet; these say what the card (or CPU) really does, so
MFU can be read against both. Writes a CSV (one line per quantity) and prints it.

    python scripts/device_peaks.py --out results/gpu_check/<device-tag>/device_peaks.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from bench.measure.device import detect_device
from bench.measure.hardware import find_gpu
from bench.measure.peak import measure_copy_bandwidth, measure_matmul_peak
from bench.results.provenance import provenance, utc_now
from bench.train.step import configure_precision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = utc_now()
    info = detect_device(args.device)
    device = torch.device(info.type)
    gpu = find_gpu(info.name) if info.type == "cuda" else None
    size = 8192 if info.type == "cuda" else 512
    lines = []
    for precision in ("bf16", "fp32"):
        configure_precision(precision)  # fp32: TF32 off, as in the cells
        flops, side = measure_matmul_peak(precision, device, size=size, min_time_s=1.0)
        # Four significant figures, not three decimals: a loaded CPU's bf16 matmul can print as 0.000 TFLOP/s.
        lines.append({"quantity": f"matmul_{precision}_tflops", "measured": float(f"{flops / 1e12:.4g}"),
                      "datasheet": (gpu.peak_flops_per_s(precision) or 0) / 1e12 if gpu else None,
                      "method": f"best torch.matmul {side}x{side} {precision}, >= 1 s of samples"})
    nbytes = 2**30 if info.type == "cuda" else 2**28
    lines.append({"quantity": "copy_gb_per_s", "measured": float(f"{measure_copy_bandwidth(device, nbytes) / 1e9:.4g}"),
                  "datasheet": None,
                  "method": f"best of 10 copies of {nbytes // 2**20} MiB, read + write bytes / time"})
    table = pd.DataFrame(lines).assign(device_name=info.name, device_type=info.type, **provenance(),
                                       started_utc=started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
