"""The throughput model: predicted step time and samples/s of a cell on a catalog GPU, without a GPU."""
