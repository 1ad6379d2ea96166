"""Row-wise ops over a last dimension: softmax, log-softmax, cross-entropy, and their cluster kernels."""
