"""A whole training step (zero grads, forward, backward, AdamW) captured in a CUDA graph per batch
shape and replayed from static input buffers: one launch a step instead of one per op."""

from __future__ import annotations

from typing import Sequence

import torch

from .dataset import Batch


class GraphedStep:
    """One captured training step per bucket length: static ids/lengths/labels in, loss out."""

    def __init__(self, model, opt, batch_size: int, buckets: Sequence[int], device, keep_graph: bool = False):
        self.model, self.opt, self.B = model, opt, batch_size
        self.graphs: dict[int, tuple] = {}
        self.device = device
        self.buckets = list(buckets)
        # keep_graph: keep each cudaGraph_t after capture so that graph_kernel_nodes() can count its
        # nodes (needs PyTorch's CUDAGraph(keep_graph=...); older versions capture without it).
        self.keep_graph = keep_graph

    def _capture(self, T: int):
        B, dev = self.B, self.device
        ids = torch.zeros(B, T, dtype=torch.int64, device=dev)
        lengths = torch.ones(B, dtype=torch.int64, device=dev)
        labels = torch.zeros(B, dtype=torch.int64, device=dev)
        # Warm-up on a side stream (what capture requires), on a copy of the state: the warm-up
        # steps must not change the weights or the optimizer's moments.
        saved_model = {k: v.clone() for k, v in self.model.state_dict().items()}
        saved_opt = _clone_opt_state(self.opt)
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            for _ in range(2):
                self.opt.zero_grad(set_to_none=False)
                loss = self.model.loss(self.model(ids, lengths), labels)
                loss.backward()
                self.opt.step()
        torch.cuda.current_stream(dev).wait_stream(s)
        g = None
        if self.keep_graph:
            try:
                g = torch.cuda.CUDAGraph(keep_graph=True)
            except TypeError:
                g = None
        g = g if g is not None else torch.cuda.CUDAGraph()
        # The grads exist (warm-up), so backward adds into them: zeroing them is part of the step.
        # Each bucket's graph has its own memory pool: graphs replay in any order.
        with torch.cuda.graph(g):
            self.opt.zero_grad(set_to_none=False)
            loss = self.model.loss(self.model(ids, lengths), labels)
            loss.backward()
            self.opt.step()
        with torch.no_grad():
            self.model.load_state_dict(saved_model)
        _restore_opt_state(self.opt, saved_opt)
        self.graphs[T] = (g, ids, lengths, labels, loss)

    def __call__(self, batch: Batch) -> torch.Tensor:
        T = batch.ids.shape[1]
        if T not in self.graphs:
            self._capture(T)
        g, ids, lengths, labels, loss = self.graphs[T]
        ids.copy_(batch.ids, non_blocking=True)
        lengths.copy_(batch.lengths, non_blocking=True)
        labels.copy_(batch.labels, non_blocking=True)
        g.replay()
        return loss


def graph_kernel_nodes(step) -> int | None:
    """Kernel nodes in the CUDA graph of a ``build_step(..., mode="graph", keep_graph=True)`` step
    (after its first call); None where PyTorch or cuda.bindings cannot say."""
    graphed = getattr(step, "graphed", None)
    if graphed is None or not graphed.graphs:
        return None
    try:
        from cuda.bindings import runtime as cudart

        g = next(iter(graphed.graphs.values()))[0]
        raw = cudart.cudaGraph_t(init_value=int(g.raw_cuda_graph()))
        err, nodes, n = cudart.cudaGraphGetNodes(raw, 0)
        if err != cudart.cudaError_t.cudaSuccess:
            return None
        err, nodes, n = cudart.cudaGraphGetNodes(raw, n)
        kinds = [cudart.cudaGraphNodeGetType(nd)[1] for nd in nodes]
        return sum(1 for k in kinds if k == cudart.cudaGraphNodeType.cudaGraphNodeTypeKernel)
    except Exception:  # no keep_graph in this PyTorch, no cuda.bindings, a changed binding API
        return None


def _clone_opt_state(opt) -> dict:
    return {id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()}
            for p, st in opt.state.items()}


def _restore_opt_state(opt, saved: dict) -> None:
    for p, st in opt.state.items():
        old = saved.get(id(p))
        for k, v in st.items():
            if torch.is_tensor(v):
                if old is not None and k in old:
                    v.copy_(old[k])
                else:
                    v.zero_()
