"""`bench peak`: the peak FLOP/s that MFU divides by on this device, and re-measuring it on purpose."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.commands.common import add_device_option
from bench.commands.formats import add_format_option
from bench.measure.device import detect_device
from bench.units import tflop_per_s


def register(commands: argparse._SubParsersAction) -> None:
    peak = commands.add_parser("peak", help="the peak FLOP/s MFU divides by here (a CPU's is measured once, stored)")
    peak.set_defaults(handler=show_peaks)
    add_format_option(peak, text_only=True)
    peak.add_argument("--results", type=Path, default=Path("results"),
                      help="results root; a CPU's peaks live in <root>/peaks/<device-tag>/ (default: results)")
    peak.add_argument("--measure", action="store_true",
                      help="measure this CPU's peaks again and replace the stored ones (rows measured since keep "
                           "the value they were divided by)")
    add_device_option(peak)


def show_peaks(args: argparse.Namespace) -> int:
    from bench.results.peaks import ensure_peak, peaks_file, store_peaks

    device = detect_device(args.device)
    precisions = tuple(device.precisions)
    if args.measure and device.type == "cpu":
        store_peaks(device, precisions, args.results)
        print(f"measured and stored: {peaks_file(device, args.results)}")
    for precision in precisions:
        peak = ensure_peak(device, precision, args.results)
        value = "none known (no MFU)" if peak.flops_per_s is None else tflop_per_s(peak.flops_per_s, significant=4)
        print(f"{device.name} {precision}: {value} — {peak.source}")
    return 0
