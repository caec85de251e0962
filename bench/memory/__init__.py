"""Memory without a device: the estimator, its grid rows, and the largest micro-batch that fits."""
