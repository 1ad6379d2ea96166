"""One module per op family; each has its .cu (or Triton) kernels, reference, cost and VARIANTS."""
