"""FlashAttention: the public function, its references, tile tables, Triton and Gluon kernels."""
